package kedacontract

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	"github.com/kedacore/keda/v2/pkg/scalers/authentication"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
)

// Phase "static": no Sentinel, no Airflow. KEDA's types, admission checks and scaler builder
// against the rendered objects, and the request KEDA's metrics-api scaler sends on the wire.

// TestRenderedObjectsAreWhatKEDAReads: every KEDA worker the values ask for has a ScaledObject
// that decoded strictly into KEDA's type, with one backlog trigger of the kind the values ask for
// (metrics-api or external-push) whose authentication object exists, and KEDA's own reading of
// its replica bounds matches the values.
func TestRenderedObjectsAreWhatKEDAReads(t *testing.T) {
	sc := loadScenario(t)
	if len(sc.Info.Workers) == 0 {
		t.Fatal("scenario.json names no KEDA worker")
	}
	if len(sc.ScaledObjects) != len(sc.Info.Workers) {
		t.Errorf("%d ScaledObjects rendered for %d KEDA workers", len(sc.ScaledObjects), len(sc.Info.Workers))
	}
	for _, name := range sc.workerNames() {
		want := sc.Info.Workers[name]
		so := sc.scaledObjectFor(name)
		if so == nil {
			t.Errorf("worker %s: no ScaledObject targets it", name)
			continue
		}
		if so.Spec.ScaleTargetRef.Kind != "Deployment" || named(sc.Deployments, name) == nil {
			t.Errorf("ScaledObject %s: scale target %s/%s is not a rendered Deployment", so.Name, so.Spec.ScaleTargetRef.Kind, name)
		}
		bt := scalingTrigger(t, so, name, want)
		ref := bt.Trigger.AuthenticationRef
		if ref == nil {
			t.Errorf("ScaledObject %s: trigger %d has no authenticationRef", so.Name, bt.Index)
		} else {
			switch ref.Kind {
			case "", "TriggerAuthentication":
				if !slices.ContainsFunc(sc.TriggerAuths, func(a *kedav1alpha1.TriggerAuthentication) bool {
					return a.Name == ref.Name && a.Namespace == so.Namespace
				}) {
					t.Errorf("ScaledObject %s: TriggerAuthentication %s/%s is not rendered", so.Name, so.Namespace, ref.Name)
				}
			case "ClusterTriggerAuthentication":
				if !slices.ContainsFunc(sc.ClusterAuths, func(a *kedav1alpha1.ClusterTriggerAuthentication) bool { return a.Name == ref.Name }) {
					t.Errorf("ScaledObject %s: ClusterTriggerAuthentication %s is not rendered", so.Name, ref.Name)
				}
			}
		}
		// What KEDA will hand the HPA it creates, and what it scales to when idle.
		hpaMin := max(want.MinReplicas, 1)
		if got := *so.GetHPAMinReplicas(); got != hpaMin {
			t.Errorf("ScaledObject %s: KEDA's HPA minReplicas %d, want %d", so.Name, got, hpaMin)
		}
		if got := so.GetHPAMaxReplicas(); got != want.MaxReplicas {
			t.Errorf("ScaledObject %s: KEDA's HPA maxReplicas %d, want %d", so.Name, got, want.MaxReplicas)
		}
		idle := int32(0)
		if so.Spec.MinReplicaCount != nil {
			idle = *so.Spec.MinReplicaCount
		}
		if idle != want.MinReplicas {
			t.Errorf("ScaledObject %s: minReplicaCount %d, want %d", so.Name, idle, want.MinReplicas)
		}
		if (so.Spec.Fallback != nil) != want.FallbackEnabled {
			t.Errorf("ScaledObject %s: fallback %v, want enabled=%v", so.Name, so.Spec.Fallback, want.FallbackEnabled)
		} else if so.Spec.Fallback != nil && so.Spec.Fallback.Replicas != want.FallbackReplicas {
			t.Errorf("ScaledObject %s: fallback replicas %d, want %d", so.Name, so.Spec.Fallback.Replicas, want.FallbackReplicas)
		}
	}
}

// TestKEDAAdmissionWebhookAcceptsTheChart runs KEDA's validating webhook, with every check it
// makes against the cluster (HPAs and ScaledObjects already on the workload, resource requests
// for cpu/memory triggers), on each rendered ScaledObject and (Cluster)TriggerAuthentication.
func TestKEDAAdmissionWebhookAcceptsTheChart(t *testing.T) {
	sc := loadScenario(t)
	if err := setupKEDAAdmission(sc.Objects); err != nil {
		t.Fatalf("KEDA's webhook setup: %v", err)
	}
	dryRun := false
	for _, so := range sc.ScaledObjects {
		warnings, err := so.DeepCopy().ValidateCreate(&dryRun)
		if err != nil {
			t.Errorf("KEDA's admission webhook refuses ScaledObject %s: %v", so.Name, err)
		}
		for _, w := range warnings {
			t.Logf("KEDA warns about ScaledObject %s: %s", so.Name, w)
		}
	}
	for _, ta := range sc.TriggerAuths {
		if _, err := ta.DeepCopy().ValidateCreate(&dryRun); err != nil {
			t.Errorf("KEDA's admission webhook refuses TriggerAuthentication %s: %v", ta.Name, err)
		}
	}
	for _, cta := range sc.ClusterAuths {
		if _, err := cta.DeepCopy().ValidateCreate(&dryRun); err != nil {
			t.Errorf("KEDA's admission webhook refuses ClusterTriggerAuthentication %s: %v", cta.Name, err)
		}
	}
}

// recordedRequest is one request KEDA's metrics-api scaler sent.
type recordedRequest struct {
	Method, Path, Authorization, Accept, UserAgent string
	BodyLen                                        int
}

// recordingSentinel answers like the Sentinel with a fixed backlog and records what it got.
type recordingSentinel struct {
	*httptest.Server
	mu       sync.Mutex
	requests []recordedRequest
}

func startRecordingSentinel(t *testing.T, backlog int) *recordingSentinel {
	rs := &recordingSentinel{}
	rs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rs.mu.Lock()
		rs.requests = append(rs.requests, recordedRequest{r.Method, r.URL.Path, r.Header.Get("Authorization"),
			r.Header.Get("Accept"), r.Header.Get("User-Agent"), len(body)})
		rs.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"backlog": backlog})
	}))
	t.Cleanup(rs.Close)
	return rs
}

func (rs *recordingSentinel) requestsFor(path string) []recordedRequest {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var out []recordedRequest
	for _, r := range rs.requests {
		if r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

// TestKEDABuildsTheBacklogTriggers builds every rendered trigger with KEDA's scale handler —
// auth resolved by KEDA's resolver from the rendered (Cluster)TriggerAuthentication and Secret
// (or a token minted through the TokenRequest API), KEDA's check for metadata keys the scaler
// does not know switched on — and checks the HPA metric KEDA derives and the request KEDA's
// metrics-api scaler sends: a bare GET of /v1/workers/<deployment> carrying a token the
// rendered Sentinel accepts. An external-push trigger is checked by checkPushTrigger.
func TestKEDABuildsTheBacklogTriggers(t *testing.T) {
	sc := loadScenario(t)
	pod := sentinelOf(t, sc)
	const backlog = 7
	rs := startRecordingSentinel(t, backlog)
	kube := startFakeKubeAPI(t, "", "unused")
	useKEDAAsTheNotesSay(t)
	op := newKEDAOperator(t, pointAtLocalSentinel(t, sc.Objects, rs.URL),
		&authentication.AuthClientSet{CoreV1Interface: kube.Clientset(t).CoreV1()})
	ctx := context.Background()

	for _, name := range sc.workerNames() {
		want := sc.Info.Workers[name]
		t.Run(name, func(t *testing.T) {
			so := op.scaledObject(t, sc.scaledObjectFor(name).Name, sc.Info.Namespace)
			c, err := op.Handler.GetScalersCache(ctx, so)
			if err != nil {
				t.Fatalf("KEDA cannot build the scalers of ScaledObject %s: %v", so.Name, err)
			}
			var forwarded []string
			if want.Trigger == externalPushType {
				forwarded = sentinelScalerKeys
			}
			if bad := unmatchedParamEvents(op.events(), forwarded...); len(bad) > 0 {
				t.Errorf("neither KEDA nor the Sentinel reads these trigger metadata keys: %v", bad)
			}
			bt := scalingTrigger(t, so, name, want)
			if want.Trigger == externalPushType {
				checkPushTrigger(t, sc, c, bt, name)
				return
			}
			spec := metricSpecOf(t, ctx, c, bt.Index)
			metricName := fmt.Sprintf("s%d-metric-api-backlog", bt.Index)
			if spec.External.Metric.Name != metricName {
				t.Errorf("metric name %q, want %q", spec.External.Metric.Name, metricName)
			}
			target := spec.External.Target
			if target.Type != autoscalingv2.AverageValueMetricType || target.AverageValue == nil {
				t.Fatalf("KEDA's HPA target is %+v, want an AverageValue", target)
			}
			if got := target.AverageValue.MilliValue(); got != want.SyncSlots*1000 {
				t.Errorf("KEDA's HPA target per replica is %s, want the worker's syncSlots %d", target.AverageValue, want.SyncSlots)
			}
			sw := pod.worker(name)
			if sw == nil {
				t.Fatalf("the Sentinel's config has no worker %q", name)
			}
			if sw.SyncSlots != want.SyncSlots || sw.MinReplicas != want.MinReplicas || sw.MaxReplicas != want.MaxReplicas {
				t.Errorf("the Sentinel's config has %+v, the values ask for syncSlots %d, min %d, max %d",
					*sw, want.SyncSlots, want.MinReplicas, want.MaxReplicas)
			}

			metrics, active, _, err := c.GetMetricsAndActivityForScaler(ctx, bt.Index, metricName)
			if err != nil {
				t.Fatalf("KEDA's metrics-api scaler: %v", err)
			}
			if len(metrics) != 1 || metrics[0].Value.MilliValue() != backlog*1000 {
				t.Errorf("KEDA read %+v, want %d", metrics, backlog)
			}
			if wantActive := backlog > want.activation(t); active != wantActive {
				t.Errorf("KEDA's activity at backlog %d is %v, want %v (activationTargetValue %v)", backlog, active, wantActive, want.ActivationTargetValue)
			}

			reqs := rs.requestsFor("/v1/workers/" + name)
			if len(reqs) == 0 {
				t.Fatalf("KEDA did not call /v1/workers/%s (it called %+v)", name, rs.requests)
			}
			r := reqs[len(reqs)-1]
			if r.Method != http.MethodGet || r.BodyLen != 0 || r.Accept != "" {
				t.Errorf("KEDA sent %+v, expected a bare GET", r)
			}
			token, ok := strings.CutPrefix(r.Authorization, "Bearer ")
			if !ok || token == "" {
				t.Fatalf("KEDA sent Authorization %q, want a bearer token", r.Authorization)
			}
			checkTokenIsAccepted(t, sc, pod, kube, token)
			t.Logf("KEDA: GET %s, User-Agent %q, metric %s target %s, value %s, active %v",
				r.Path, r.UserAgent, metricName, target.AverageValue, &metrics[0].Value, active)
		})
	}
}

// checkTokenIsAccepted: the bearer token KEDA sends is one the rendered Sentinel accepts — in
// its static tokens file, or minted for a service account its TokenReview allow-list names.
func checkTokenIsAccepted(t *testing.T, sc *scenario, pod *sentinelPod, kube *fakeKubeAPI, token string) {
	t.Helper()
	switch {
	case pod.Config.Auth.StaticTokensFile != "":
		if !slices.Contains(pod.Tokens, token) {
			t.Errorf("KEDA sends a static token that is not in the Sentinel's tokens file %s", pod.Config.Auth.StaticTokensFile)
		}
	case pod.Config.Auth.TokenReview != nil:
		idx := slices.IndexFunc(kube.mints(), func(m mintedToken) bool { return m.Token == token })
		if idx < 0 {
			t.Fatalf("KEDA sends a token the TokenRequest API did not mint")
		}
		m := kube.mints()[idx]
		if want := pod.Config.Auth.TokenReview.audiencesOrAPIServer(); !slices.Equal(m.Audiences, want) {
			t.Errorf("KEDA minted a token for audiences %v, the Sentinel's TokenReview asks for %v", m.Audiences, want)
		}
		user := "system:serviceaccount:" + m.Namespace + ":" + m.ServiceAccount
		if !slices.Contains(pod.Config.Auth.TokenReview.AllowedUsernames, user) {
			t.Errorf("KEDA mints its token for %s, the Sentinel allows %v", user, pod.Config.Auth.TokenReview.AllowedUsernames)
		}
		if m.Namespace != sc.Info.ClusterObjectNamespace {
			t.Errorf("KEDA minted in namespace %s, want KEDA's cluster object namespace %s", m.Namespace, sc.Info.ClusterObjectNamespace)
		}
	default:
		t.Errorf("the Sentinel's config has no auth method")
	}
}

// TestKEDADefaultTokenModeNeedsAnAudience records why NOTES print a
// KEDA_SERVICE_ACCOUNT_TOKEN_AUDIENCES entry: in its default --service-account-token-mode
// (enforce-audience) the pinned KEDA refuses to mint a bound token for an account that variable
// does not map to an audience. Run for bound-token scenarios only.
func TestKEDADefaultTokenModeNeedsAnAudience(t *testing.T) {
	sc := loadScenario(t)
	if len(sc.ClusterAuths) == 0 {
		t.Fatal("not a bound-token scenario")
	}
	kube := startFakeKubeAPI(t, "", "unused")
	useKEDATokenMode("", nil)
	defer useKEDAAsTheNotesSay(t)
	op := newKEDAOperator(t, sc.Objects, &authentication.AuthClientSet{CoreV1Interface: kube.Clientset(t).CoreV1()})
	for _, name := range sc.workerNames() {
		so := op.scaledObject(t, sc.scaledObjectFor(name).Name, sc.Info.Namespace)
		_, err := op.Handler.GetScalersCache(context.Background(), so)
		if err == nil {
			t.Fatalf("KEDA minted a bound token without a configured audience: KEDA's default changed, revisit the chart's bound-token mode")
		}
		if !strings.Contains(err.Error(), "KEDA_SERVICE_ACCOUNT_TOKEN_AUDIENCES") {
			t.Fatalf("unexpected error: %v", err)
		}
		t.Logf("KEDA (default token mode) on ScaledObject %s: %v", so.Name, err)
	}
	if n := len(kube.mints()); n != 0 {
		t.Errorf("KEDA asked for %d tokens", n)
	}
}
