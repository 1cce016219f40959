package kedacontract

import (
	"context"
	"net/http"

	"github.com/go-logr/logr"
	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// admissionManager is just enough of a controller-runtime Manager for KEDA's own
// SetupWebhookWithManager: it hands KEDA's admission webhook a fake client holding the rendered
// objects (with the field indexes the webhook registers), so that ScaledObject.ValidateCreate
// runs every check of the real webhook — replica bounds, fallback, triggers, "workload already
// managed by an HPA / another ScaledObject", cpu/memory requests — against the chart's output.
// Any Manager method KEDA does not call panics (nil embedded interface), which would show up
// as a test failure rather than a silently skipped check.
type admissionManager struct {
	ctrl.Manager
	objects  []client.Object
	mapper   meta.RESTMapper
	indexes  []fieldIndex
	built    client.Client
	recorder events.EventRecorder
	server   webhook.Server
}

type fieldIndex struct {
	obj     client.Object
	field   string
	extract client.IndexerFunc
}

func newAdmissionManager(objects []client.Object) *admissionManager {
	return &admissionManager{
		objects:  objects,
		mapper:   newRESTMapper(),
		recorder: events.NewFakeRecorder(1000),
		server:   webhook.NewServer(webhook.Options{}),
	}
}

func (m *admissionManager) IndexField(_ context.Context, obj client.Object, field string, extract client.IndexerFunc) error {
	m.indexes = append(m.indexes, fieldIndex{obj, field, extract})
	m.built = nil
	return nil
}

func (m *admissionManager) GetFieldIndexer() client.FieldIndexer { return m }

func (m *admissionManager) GetClient() client.Client {
	if m.built == nil {
		b := fake.NewClientBuilder().WithScheme(scheme).WithRESTMapper(m.mapper)
		for _, o := range m.objects {
			b = b.WithObjects(o.DeepCopyObject().(client.Object))
		}
		for _, ix := range m.indexes {
			b = b.WithIndex(ix.obj, ix.field, ix.extract)
		}
		m.built = b.Build()
	}
	return m.built
}

func (m *admissionManager) GetRESTMapper() meta.RESTMapper               { return m.mapper }
func (m *admissionManager) GetScheme() *runtime.Scheme                   { return scheme }
func (m *admissionManager) GetConfig() *rest.Config                      { return &rest.Config{} }
func (m *admissionManager) GetHTTPClient() *http.Client                  { return http.DefaultClient }
func (m *admissionManager) GetLogger() logr.Logger                       { return logr.Discard() }
func (m *admissionManager) GetWebhookServer() webhook.Server             { return m.server }
func (m *admissionManager) GetEventRecorder(string) events.EventRecorder { return m.recorder }

// setupKEDAAdmission wires KEDA's ScaledObject webhook to the scenario's objects.
func setupKEDAAdmission(objects []client.Object) error {
	return (&kedav1alpha1.ScaledObject{}).SetupWebhookWithManager(newAdmissionManager(objects), false)
}
