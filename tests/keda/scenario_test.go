// Package kedacontract runs KEDA's own code (API types, admission checks, scaler builder,
// metrics-api scaler, fallback) against what the chart renders and against a running
// astro-sentinel. The driver (run.sh → test_keda_contract.py) renders the scenarios, starts what
// is needed and runs this test binary once per scenario and phase; see scenarioInfo for what it
// hands over.
package kedacontract

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// Environment the driver sets for every run of the test binary.
const (
	envScenarioDir = "KEDA_CONTRACT_SCENARIO_DIR" // rendered.yaml, provided.yaml, scenario.json
	envBacklog     = "KEDA_CONTRACT_BACKLOG"      // live phase: tasks queued+running on envQueue
	envQueue       = "KEDA_CONTRACT_QUEUE"        // the queue the driver fills
	envStale       = "KEDA_CONTRACT_STALE"        // "1": the Sentinel's upstream is down
)

// scenarioInfo is scenario.json: what the values files ask for (the intent, computed by the
// driver from the values, not from the rendered output) and, for a live scenario, where its
// Sentinel listens.
type scenarioInfo struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// KEDA's KEDA_CLUSTER_OBJECT_NAMESPACE as the values declare it (keda.clusterObjectNamespace
	// or keda.namespace); the driver sets that variable for this process too.
	ClusterObjectNamespace string `json:"clusterObjectNamespace"`
	// KEDA worker Deployments by name.
	Workers map[string]workerIntent `json:"workers"`
	// Set when a Sentinel runs for this scenario.
	Sentinel *liveSentinel `json:"sentinel"`
	// Where the fake Kubernetes API (TokenRequest for KEDA, TokenReview for the Sentinel) must
	// listen in the live phase of a bound-token scenario.
	KubeAPI *kubeAPIInfo `json:"kubeApi"`
}

type workerIntent struct {
	SyncSlots             int64  `json:"syncSlots"`
	MinReplicas           int32  `json:"minReplicas"`
	MaxReplicas           int32  `json:"maxReplicas"`
	ActivationTargetValue string `json:"activationTargetValue"` // as the values give it
	FallbackEnabled       bool   `json:"fallbackEnabled"`
	FallbackReplicas      int32  `json:"fallbackReplicas"`
	Trigger               string `json:"trigger"` // keda.trigger: metrics-api or external-push
}

type liveSentinel struct {
	// http://127.0.0.1:PORT — replaces scheme://host:port of the rendered trigger URL.
	URL string `json:"url"`
	// Static mode: the token the Sentinel loaded from the Secret its Deployment mounts.
	Token string `json:"token"`
}

type kubeAPIInfo struct {
	Listen string `json:"listen"`
	// The Sentinel's own service-account token (what it presents to TokenReview).
	SentinelToken string `json:"sentinelToken"`
}

// scenario is one rendered chart: typed objects as the API server would store them.
type scenario struct {
	Info    scenarioInfo
	Dir     string
	Objects []client.Object

	ScaledObjects []*kedav1alpha1.ScaledObject
	TriggerAuths  []*kedav1alpha1.TriggerAuthentication
	ClusterAuths  []*kedav1alpha1.ClusterTriggerAuthentication
	Secrets       []*corev1.Secret
	ConfigMaps    []*corev1.ConfigMap
	Deployments   []*appsv1.Deployment
	Services      []*corev1.Service
}

var scheme = newScheme()

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := kedav1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// restMapper knows every kind of the scheme, as the API server's discovery would.
func newRESTMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper(nil)
	clusterScoped := map[string]bool{
		"ClusterTriggerAuthentication": true, "Namespace": true, "ClusterRole": true,
		"ClusterRoleBinding": true, "Node": true, "PersistentVolume": true,
	}
	for gvk := range scheme.AllKnownTypes() {
		if strings.HasSuffix(gvk.Kind, "List") || gvk.Version == runtime.APIVersionInternal {
			continue
		}
		scope := meta.RESTScopeNamespace
		if clusterScoped[gvk.Kind] {
			scope = meta.RESTScopeRoot
		}
		m.Add(gvk, scope)
	}
	return m
}

// activation is the workers' activationTargetValue as a number.
func (w workerIntent) activation(t *testing.T) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(w.ActivationTargetValue, 64)
	if err != nil {
		t.Fatalf("the values' activationTargetValue %q is not a number", w.ActivationTargetValue)
	}
	return v
}

func mustEnv(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: run this through tests/keda/run.sh", name)
	}
	return v
}

// loadScenario reads the scenario the driver prepared (see loadScenarioFrom).
func loadScenario(t *testing.T) *scenario {
	t.Helper()
	sc, err := loadScenarioFrom(mustEnv(t, envScenarioDir))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// loadScenarioFrom reads a scenario folder. Every object of a kind the Kubernetes or KEDA
// scheme knows is decoded strictly into its Go type: an unknown or misspelt field is an error,
// where the API server would silently prune it.
func loadScenarioFrom(dir string) (*scenario, error) {
	sc := &scenario{Dir: dir}
	raw, err := os.ReadFile(filepath.Join(dir, "scenario.json"))
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sc.Info); err != nil {
		return nil, fmt.Errorf("scenario.json: %w", err)
	}
	if err := sc.loadObjects(); err != nil {
		return nil, err
	}
	return sc, nil
}

func (sc *scenario) loadObjects() error {
	for _, file := range []string{"rendered.yaml", "provided.yaml"} {
		data, err := os.ReadFile(filepath.Join(sc.Dir, file))
		if errors.Is(err, os.ErrNotExist) && file == "provided.yaml" {
			continue
		}
		if err != nil {
			return err
		}
		objs, err := decodeDocuments(data)
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		for _, o := range objs {
			sc.add(o)
		}
	}
	return nil
}

func (sc *scenario) add(o client.Object) {
	sc.Objects = append(sc.Objects, o)
	switch v := o.(type) {
	case *kedav1alpha1.ScaledObject:
		sc.ScaledObjects = append(sc.ScaledObjects, v)
	case *kedav1alpha1.TriggerAuthentication:
		sc.TriggerAuths = append(sc.TriggerAuths, v)
	case *kedav1alpha1.ClusterTriggerAuthentication:
		sc.ClusterAuths = append(sc.ClusterAuths, v)
	case *corev1.Secret:
		sc.Secrets = append(sc.Secrets, v)
	case *corev1.ConfigMap:
		sc.ConfigMaps = append(sc.ConfigMaps, v)
	case *appsv1.Deployment:
		sc.Deployments = append(sc.Deployments, v)
	case *corev1.Service:
		sc.Services = append(sc.Services, v)
	}
}

// decodeDocuments splits a multi-document YAML stream and decodes each document into the typed
// object of its apiVersion/kind. Kinds neither scheme knows (ServiceMonitor, ...) are skipped: no
// KEDA code reads them.
func decodeDocuments(data []byte) ([]client.Object, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []client.Object
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return nil, err
		}
		if head.Kind == "" {
			continue // a document holding only comments
		}
		gv, err := schema.ParseGroupVersion(head.APIVersion)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", head.Kind, head.Metadata.Name, err)
		}
		typed, err := scheme.New(gv.WithKind(head.Kind))
		if runtime.IsNotRegisteredError(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if err := yaml.UnmarshalStrict(doc, typed); err != nil {
			return nil, fmt.Errorf("%s %s does not decode strictly into KEDA's/Kubernetes' Go type: %w",
				head.Kind, head.Metadata.Name, err)
		}
		obj, ok := typed.(client.Object)
		if !ok {
			continue
		}
		obj.GetObjectKind().SetGroupVersionKind(gv.WithKind(head.Kind))
		out = append(out, obj)
	}
}

// named is the object called name among objs, or nil.
func named[T client.Object](objs []T, name string) T {
	for _, o := range objs {
		if o.GetName() == name {
			return o
		}
	}
	var none T
	return none
}

// workerNames lists the KEDA workers the values ask for, sorted.
func (sc *scenario) workerNames() []string {
	var names []string
	for n := range sc.Info.Workers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (sc *scenario) scaledObjectFor(deployment string) *kedav1alpha1.ScaledObject {
	for _, so := range sc.ScaledObjects {
		if so.Spec.ScaleTargetRef != nil && so.Spec.ScaleTargetRef.Name == deployment {
			return so
		}
	}
	return nil
}
