package kedacontract

import (
	"context"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	"github.com/kedacore/keda/v2/pkg/scalers/authentication"
	"github.com/kedacore/keda/v2/pkg/scaling"
	"github.com/kedacore/keda/v2/pkg/scaling/cache"
	"github.com/kedacore/keda/v2/pkg/scaling/resolver"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	scalefake "k8s.io/client-go/scale/fake"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// KEDA's defaults for the operator settings these tests depend on.
const (
	kedaHTTPTimeout    = 3000 * time.Millisecond // KEDA_HTTP_DEFAULT_TIMEOUT
	kedaKubeAPITimeout = 5 * time.Second
	metricsAPIType     = "metrics-api"
	externalPushType   = "external-push"
)

// kedaOperator is KEDA's scale handler (the code behind both the operator's scale loop and
// its metrics server) over a fake Kubernetes API that holds the scenario's objects.
type kedaOperator struct {
	Client   client.Client
	Handler  scaling.ScaleHandler
	Recorder *events.FakeRecorder
}

// newKEDAOperator stores the objects as the API server would after `helm install`, with the
// status KEDA's own ScaledObject controller writes before any scaler is built (the scale
// target's group/version/kind/resource, parsed by KEDA's ParseGVKR).
func newKEDAOperator(t *testing.T, objects []client.Object, acs *authentication.AuthClientSet) *kedaOperator {
	t.Helper()
	mapper := newRESTMapper()
	b := fake.NewClientBuilder().WithScheme(scheme).WithRESTMapper(mapper).
		WithStatusSubresource(&kedav1alpha1.ScaledObject{})
	for _, o := range objects {
		o = o.DeepCopyObject().(client.Object)
		if so, ok := o.(*kedav1alpha1.ScaledObject); ok {
			ref := so.Spec.ScaleTargetRef
			gvkr, err := kedav1alpha1.ParseGVKR(mapper, ref.APIVersion, ref.Kind)
			if err != nil {
				t.Fatalf("ScaledObject %s: KEDA cannot resolve its scale target: %v", so.Name, err)
			}
			so.Status.ScaleTargetGVKR = &gvkr
			so.Status.ScaleTargetKind = gvkr.GVKString()
		}
		b = b.WithObjects(o)
	}
	c := b.Build()
	rec := events.NewFakeRecorder(100000)
	h := scaling.NewScaleHandler(c, &scalefake.FakeScaleClient{}, scheme, kedaHTTPTimeout, kedaKubeAPITimeout, rec, acs)
	return &kedaOperator{Client: c, Handler: h, Recorder: rec}
}

// events drains what KEDA recorded so far.
func (k *kedaOperator) events() []string {
	var out []string
	for {
		select {
		case e := <-k.Recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func (k *kedaOperator) scaledObject(t *testing.T, name, namespace string) *kedav1alpha1.ScaledObject {
	t.Helper()
	so := &kedav1alpha1.ScaledObject{}
	if err := k.Client.Get(context.Background(), client.ObjectKey{Name: name, Namespace: namespace}, so); err != nil {
		t.Fatal(err)
	}
	return so
}

// setDeploymentReplicas plays the current size of a worker pool (what KEDA's fallback reads).
func (k *kedaOperator) setDeploymentReplicas(t *testing.T, name, namespace string, replicas int32) {
	t.Helper()
	d := &appsv1.Deployment{}
	if err := k.Client.Get(context.Background(), client.ObjectKey{Name: name, Namespace: namespace}, d); err != nil {
		t.Fatal(err)
	}
	d.Spec.Replicas = &replicas
	if err := k.Client.Update(context.Background(), d); err != nil {
		t.Fatal(err)
	}
}

// backlogTrigger is a metrics-api trigger of a ScaledObject that reads the Sentinel: the
// backlog one, or the optional one on the oldest queued task's wait.
type backlogTrigger struct {
	Index   int
	Trigger kedav1alpha1.ScaleTriggers
}

// sentinelTriggers are the metrics-api triggers that read the Sentinel's `valueLocation`.
func sentinelTriggers(so *kedav1alpha1.ScaledObject, valueLocation string) []backlogTrigger {
	var out []backlogTrigger
	for i, tr := range so.Spec.Triggers {
		if tr.Type == metricsAPIType && tr.Metadata["valueLocation"] == valueLocation {
			out = append(out, backlogTrigger{i, tr})
		}
	}
	return out
}

func backlogTriggers(so *kedav1alpha1.ScaledObject) []backlogTrigger {
	return sentinelTriggers(so, "backlog")
}

func onlyBacklogTrigger(t *testing.T, so *kedav1alpha1.ScaledObject) backlogTrigger {
	t.Helper()
	trs := backlogTriggers(so)
	if len(trs) != 1 {
		t.Fatalf("ScaledObject %s: want exactly one %s trigger, have %d", so.Name, metricsAPIType, len(trs))
	}
	return trs[0]
}

// scalingTrigger is the one trigger that scales worker `name` on its backlog, of the kind the
// values ask for: a metrics-api trigger reading `backlog`, or the external-push trigger naming
// the worker (and then no metrics-api backlog trigger beside it).
func scalingTrigger(t *testing.T, so *kedav1alpha1.ScaledObject, name string, want workerIntent) backlogTrigger {
	t.Helper()
	if want.Trigger != externalPushType {
		return onlyBacklogTrigger(t, so)
	}
	var pushes []backlogTrigger
	for i, tr := range so.Spec.Triggers {
		if tr.Type == externalPushType {
			pushes = append(pushes, backlogTrigger{i, tr})
		}
	}
	if len(pushes) != 1 || len(backlogTriggers(so)) != 0 {
		t.Fatalf("ScaledObject %s: want one %s trigger and no %s backlog trigger, have %+v",
			so.Name, externalPushType, metricsAPIType, so.Spec.Triggers)
	}
	if got := pushes[0].Trigger.Metadata["worker"]; got != name {
		t.Fatalf("ScaledObject %s: the %s trigger names worker %q, want %q", so.Name, externalPushType, got, name)
	}
	return pushes[0]
}

// metricSpecOf returns the external metric KEDA puts into the HPA for a trigger.
func metricSpecOf(t *testing.T, ctx context.Context, c *cache.ScalersCache, index int) autoscalingv2.MetricSpec {
	t.Helper()
	specs, err := c.GetMetricSpecForScalingForScaler(ctx, index)
	if err != nil {
		t.Fatalf("KEDA cannot produce the metric spec of trigger %d: %v", index, err)
	}
	if len(specs) != 1 || specs[0].External == nil {
		t.Fatalf("trigger %d: want one External metric spec, KEDA gives %+v", index, specs)
	}
	return specs[0]
}

// pointAtLocalSentinel swaps scheme://host:port of every backlog trigger URL for the local
// Sentinel's; the path (which names the worker) stays as rendered.
func pointAtLocalSentinel(t *testing.T, objects []client.Object, local string) []client.Object {
	t.Helper()
	base, err := url.Parse(local)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]client.Object, 0, len(objects))
	for _, o := range objects {
		so, ok := o.(*kedav1alpha1.ScaledObject)
		if !ok {
			out = append(out, o)
			continue
		}
		so = so.DeepCopy()
		for i := range so.Spec.Triggers {
			tr := &so.Spec.Triggers[i]
			if tr.Type != metricsAPIType {
				continue
			}
			u, err := url.Parse(tr.Metadata["url"])
			if err != nil {
				t.Fatalf("ScaledObject %s: trigger url: %v", so.Name, err)
			}
			u.Scheme, u.Host = base.Scheme, base.Host
			meta := map[string]string{}
			for k, v := range tr.Metadata {
				meta[k] = v
			}
			meta["url"] = u.String()
			tr.Metadata = meta
		}
		out = append(out, so)
	}
	return out
}

// useKEDATokenMode sets KEDA's --service-account-token-mode (and audiences) for this process.
func useKEDATokenMode(mode string, audiences []resolver.ServiceAccountTokenAudience) {
	resolver.SetConfig(&resolver.Config{ServiceAccountTokenMode: mode, ServiceAccountTokenAudiences: audiences})
}

// useKEDAAsTheNotesSay configures KEDA's token policy the way the chart's NOTES tell the user
// to install KEDA: its default token mode (enforce-audience) with the printed
// KEDA_SERVICE_ACCOUNT_TOKEN_AUDIENCES, parsed by KEDA's own loader. The driver passes that
// variable through when NOTES print one; when they do not (the chart's audience is empty),
// NOTES ask for KEDA's legacy mode instead.
func useKEDAAsTheNotesSay(t *testing.T) {
	t.Helper()
	resolver.SetConfig(kedaTokenPolicyFromNotes(t))
}

func kedaTokenPolicyFromNotes(t *testing.T) *resolver.Config {
	t.Helper()
	value, ok := os.LookupEnv(resolver.ServiceAccountTokenAudiencesEnvVar)
	if !ok {
		return &resolver.Config{ServiceAccountTokenMode: "legacy"}
	}
	cfg := &resolver.Config{}
	if err := cfg.LoadServiceAccountTokenAudiences(value); err != nil {
		t.Fatalf("KEDA refuses the %s that NOTES print: %v", resolver.ServiceAccountTokenAudiencesEnvVar, err)
	}
	return cfg
}

// unmatchedParamEvents: KEDA's reports of trigger metadata keys its scaler does not read, but
// for the keys in `forwarded`: an external scaler's own keys, which KEDA passes on to it unread.
func unmatchedParamEvents(evs []string, forwarded ...string) []string {
	var bad []string
	for _, e := range evs {
		_, rest, ok := strings.Cut(e, "Unmatched input property ")
		if !ok {
			continue
		}
		if key, _, _ := strings.Cut(rest, " "); !slices.Contains(forwarded, key) {
			bad = append(bad, e)
		}
	}
	return bad
}
