package kedacontract

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	"github.com/kedacore/keda/v2/pkg/scalers/authentication"
	"github.com/kedacore/keda/v2/pkg/scaling/cache"
	"github.com/kedacore/keda/v2/pkg/scaling/resolver"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Live phases: the real astro-sentinel, fed by the real Airflow stack, started by the driver
// from this scenario's rendered config. KEDA's objects point at it (only scheme://host:port of
// the trigger URL is swapped).

// sentinelAnswer is GET /v1/workers/{name} of the Sentinel.
type sentinelAnswer struct {
	Worker          string   `json:"worker"`
	Queues          []string `json:"queues"`
	Queued          int64    `json:"queued"`
	Running         int64    `json:"running"`
	Backlog         float64  `json:"backlog"`
	ScalingSlots    int64    `json:"scalingSlots"`
	SyncSlots       int64    `json:"syncSlots"`
	DesiredReplicas int32    `json:"desiredReplicas"`
	MinReplicas     int32    `json:"minReplicas"`
	MaxReplicas     int32    `json:"maxReplicas"`
	// OldestQueuedAgeSeconds is how long the oldest queued task has waited.
	OldestQueuedAgeSeconds float64 `json:"oldestQueuedAgeSeconds"`
}

type liveEnv struct {
	sc   *scenario
	pod  *sentinelPod
	kube *fakeKubeAPI
	acs  *authentication.AuthClientSet
}

func newLiveEnv(t *testing.T) *liveEnv {
	t.Helper()
	sc := loadScenario(t)
	if sc.Info.Sentinel == nil {
		t.Fatal("scenario.json has no running Sentinel: not a live scenario")
	}
	e := &liveEnv{sc: sc, pod: sentinelOf(t, sc)}
	if sc.Info.KubeAPI != nil {
		e.kube = startFakeKubeAPI(t, sc.Info.KubeAPI.Listen, sc.Info.KubeAPI.SentinelToken)
	} else {
		e.kube = startFakeKubeAPI(t, "", "unused")
	}
	e.acs = &authentication.AuthClientSet{CoreV1Interface: e.kube.Clientset(t).CoreV1()}
	useKEDAAsTheNotesSay(t)
	return e
}

func (e *liveEnv) bound() bool { return e.pod.Config.Auth.TokenReview != nil }

// operator starts KEDA on (a variant of) the scenario's objects, pointed at the live Sentinel.
func (e *liveEnv) operator(t *testing.T, objects []client.Object) *kedaOperator {
	t.Helper()
	return newKEDAOperator(t, pointAtLocalSentinel(t, objects, e.sc.Info.Sentinel.URL), e.acs)
}

// ask sends the Sentinel the request KEDA sends, with a token it accepts, and decodes a 200.
func (e *liveEnv) ask(t *testing.T, worker string) (int, sentinelAnswer) {
	t.Helper()
	token := e.sc.Info.Sentinel.Token
	if e.bound() {
		mints := e.kube.mints()
		if len(mints) == 0 {
			t.Fatal("no token minted yet")
		}
		token = mints[len(mints)-1].Token
	}
	req, _ := http.NewRequest(http.MethodGet, e.sc.Info.Sentinel.URL+"/v1/workers/"+worker, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("asking the Sentinel: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var a sentinelAnswer
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, &a); err != nil {
			t.Fatalf("the Sentinel's answer %q: %v", body, err)
		}
	}
	return resp.StatusCode, a
}

// hpaDesired is what an HPA with an AverageValue target asks for: ceil(value / target), held
// between the HPA's min and max.
func hpaDesired(value, target resource.Quantity, minReplicas, maxReplicas int32) int32 {
	r := int32(math.Ceil(float64(value.MilliValue()) / float64(target.MilliValue())))
	return min(max(r, minReplicas), maxReplicas)
}

// TestKEDAReadsTheBacklog (KEDA_CONTRACT_BACKLOG=N on queue KEDA_CONTRACT_QUEUE): for every
// worker, KEDA's metrics-api scaler reads the Sentinel's backlog, KEDA's HPA metric targets
// syncSlots, activation follows activationTargetValue, and the replicas the HPA computes from
// what KEDA's metrics server returns equal the Sentinel's desiredReplicas.
func TestKEDAReadsTheBacklog(t *testing.T) {
	backlog, err := strconv.ParseInt(mustEnv(t, envBacklog), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	queue := mustEnv(t, envQueue)
	e := newLiveEnv(t)
	op := e.operator(t, e.sc.Objects)
	ctx := context.Background()
	for _, name := range e.sc.workerNames() {
		want := e.sc.Info.Workers[name]
		t.Run(name, func(t *testing.T) {
			so := op.scaledObject(t, e.sc.scaledObjectFor(name).Name, e.sc.Info.Namespace)
			c, err := op.Handler.GetScalersCache(ctx, so)
			if err != nil {
				t.Fatalf("KEDA cannot build the scalers: %v", err)
			}
			bt := onlyBacklogTrigger(t, so)
			spec := metricSpecOf(t, ctx, c, bt.Index)
			metricName := spec.External.Metric.Name
			target := *spec.External.Target.AverageValue

			metrics, active, _, err := c.GetMetricsAndActivityForScaler(ctx, bt.Index, metricName)
			if err != nil {
				t.Fatalf("KEDA's metrics-api scaler against the Sentinel: %v", err)
			}
			status, ans := e.ask(t, name)
			if status != http.StatusOK {
				t.Fatalf("the Sentinel answers %d", status)
			}
			expected := int64(0)
			if slices.Contains(e.pod.worker(name).Queues, queue) {
				expected = backlog
			}
			if ans.Backlog != float64(expected) {
				t.Fatalf("the Sentinel reports backlog %v, the driver queued %d on %s", ans.Backlog, expected, queue)
			}
			if len(metrics) != 1 {
				t.Fatalf("KEDA returned %d metric values", len(metrics))
			}
			value := metrics[0].Value
			if value.MilliValue() != expected*1000 {
				t.Errorf("KEDA reads %s, the Sentinel's backlog is %d", &value, expected)
			}
			if target.MilliValue() != ans.SyncSlots*1000 || ans.SyncSlots != want.SyncSlots {
				t.Errorf("KEDA's target per replica is %s; the Sentinel's syncSlots %d; the values' %d", &target, ans.SyncSlots, want.SyncSlots)
			}
			wantActive := float64(expected) > want.activation(t)
			if active != wantActive {
				t.Errorf("KEDA's activity at backlog %d is %v, want %v (activationTargetValue %v)", expected, active, wantActive, want.ActivationTargetValue)
			}

			// The HPA's side: what KEDA's metrics server answers for the metric, and what the
			// HPA KEDA creates (min/max from the ScaledObject) makes of it.
			list, err := op.Handler.GetScaledObjectMetrics(ctx, so.Name, so.Namespace, metricName)
			if err != nil {
				t.Fatalf("KEDA's metrics server: %v", err)
			}
			if len(list.Items) != 1 || list.Items[0].Value.Cmp(value) != 0 {
				t.Fatalf("KEDA's metrics server gives %+v, the scaler read %s", list.Items, &value)
			}
			hpa := hpaDesired(list.Items[0].Value, target, *so.GetHPAMinReplicas(), so.GetHPAMaxReplicas())
			hpa = max(hpa, checkHeadroomTrigger(t, ctx, e, c, so, name, expected, ans, wantActive))
			replicas := hpa
			idle := int32(0)
			if so.Spec.MinReplicaCount != nil {
				idle = *so.Spec.MinReplicaCount
			}
			if !active && idle == 0 {
				replicas = 0 // KEDA itself scales an inactive workload to minReplicaCount 0
			}
			t.Logf("backlog %d: KEDA value %s, target %s, active %v → HPA %d, KEDA %d; Sentinel desiredReplicas %d (min %d, max %d)",
				expected, &value, &target, active, hpa, replicas, ans.DesiredReplicas, ans.MinReplicas, ans.MaxReplicas)
			switch {
			case active || idle > 0:
				if hpa != ans.DesiredReplicas {
					t.Errorf("the HPA would ask for %d replicas, the Sentinel says desiredReplicas %d", hpa, ans.DesiredReplicas)
				}
			case expected == 0:
				if ans.DesiredReplicas != 0 {
					t.Errorf("idle at zero, but the Sentinel says desiredReplicas %d", ans.DesiredReplicas)
				}
			default:
				// 0 < backlog <= activationTargetValue: KEDA keeps a pool at zero asleep, the
				// Sentinel (which knows nothing of activation) says what an awake pool needs.
				t.Logf("below activationTargetValue %v: KEDA leaves a pool at zero at 0 replicas, the Sentinel says %d; an awake pool gets %d = desiredReplicas: %v",
					want.ActivationTargetValue, ans.DesiredReplicas, hpa, hpa == ans.DesiredReplicas)
				if hpa != ans.DesiredReplicas {
					t.Errorf("an awake pool: the HPA would ask for %d replicas, the Sentinel says %d", hpa, ans.DesiredReplicas)
				}
			}
			checkAgeTrigger(t, ctx, e, c, so, name, expected > 0)
		})
	}
}

// checkHeadroomTrigger: where the values keep headroom (keda.overprovisionSlots), KEDA's
// metrics-api scaler reads the Sentinel's scalingSlots — the backlog plus the headroom while there
// is any backlog, 0 without — and its activity follows the work alone, as the backlog trigger's
// does. Returns what the HPA makes of that trigger (0 without one): it takes the larger proposal.
func checkHeadroomTrigger(t *testing.T, ctx context.Context, e *liveEnv, c *cache.ScalersCache,
	so *kedav1alpha1.ScaledObject, name string, backlog int64, ans sentinelAnswer, wantActive bool) int32 {
	t.Helper()
	proposal := int32(0)
	for _, ht := range sentinelTriggers(so, "scalingSlots") {
		spec := metricSpecOf(t, ctx, c, ht.Index)
		metrics, active, _, err := c.GetMetricsAndActivityForScaler(ctx, ht.Index, spec.External.Metric.Name)
		if err != nil || len(metrics) != 1 {
			t.Fatalf("KEDA's metrics-api scaler reading scalingSlots: %+v, %v", metrics, err)
		}
		headroom := int64(0)
		if backlog > 0 {
			headroom = e.pod.worker(name).OverprovisionSlots
		}
		value := metrics[0].Value
		if value.MilliValue() != (backlog+headroom)*1000 || ans.ScalingSlots != backlog+headroom {
			t.Errorf("KEDA reads scalingSlots %s, the Sentinel answers %d; backlog %d plus headroom %d is %d",
				&value, ans.ScalingSlots, backlog, headroom, backlog+headroom)
		}
		if active != wantActive {
			t.Errorf("the headroom trigger's activity at backlog %d is %v, want %v: the work alone wakes a pool", backlog, active, wantActive)
		}
		proposal = max(proposal, hpaDesired(value, *spec.External.Target.AverageValue, *so.GetHPAMinReplicas(), so.GetHPAMaxReplicas()))
		t.Logf("headroom %d: KEDA reads scalingSlots %s, active %v → HPA %d", headroom, &value, active, proposal)
	}
	return proposal
}

// checkAgeTrigger: where the values add the trigger on the oldest queued wait, KEDA's metric
// for it is a Value target and KEDA's metrics-api scaler reads the Sentinel's
// oldestQueuedAgeSeconds (0 with nothing queued; nothing serves the queue, so every task counted
// in the backlog is queued).
func checkAgeTrigger(t *testing.T, ctx context.Context, e *liveEnv, c *cache.ScalersCache,
	so *kedav1alpha1.ScaledObject, name string, queued bool) {
	t.Helper()
	for _, at := range sentinelTriggers(so, "oldestQueuedAgeSeconds") {
		spec := metricSpecOf(t, ctx, c, at.Index)
		if spec.External.Target.Type != autoscalingv2.ValueMetricType || spec.External.Target.Value == nil {
			t.Fatalf("the age trigger's HPA target is %+v, want a Value", spec.External.Target)
		}
		_, before := e.ask(t, name)
		metrics, _, _, err := c.GetMetricsAndActivityForScaler(ctx, at.Index, spec.External.Metric.Name)
		if err != nil || len(metrics) != 1 {
			t.Fatalf("KEDA's metrics-api scaler reading the oldest wait: %+v, %v", metrics, err)
		}
		_, after := e.ask(t, name)
		age := metrics[0].Value.AsApproximateFloat64()
		t.Logf("oldest queued wait: KEDA reads %.3fs (the Sentinel said %.3fs, then %.3fs), target %s",
			age, before.OldestQueuedAgeSeconds, after.OldestQueuedAgeSeconds, spec.External.Target.Value)
		if queued != (age > 0) {
			t.Errorf("KEDA reads an oldest wait of %.3fs with queued tasks: %v", age, queued)
		}
		if age < before.OldestQueuedAgeSeconds-0.01 || age > after.OldestQueuedAgeSeconds+0.01 {
			t.Errorf("KEDA reads %.3fs, outside the Sentinel's %.3fs..%.3fs", age, before.OldestQueuedAgeSeconds, after.OldestQueuedAgeSeconds)
		}
	}
}

// TestKEDAAuthAgainstTheSentinel: what KEDA sees when its credentials are wrong, and that KEDA's
// rebuild-and-retry on an error recovers from a rotated Secret or an expired bound token.
func TestKEDAAuthAgainstTheSentinel(t *testing.T) {
	e := newLiveEnv(t)
	ctx := context.Background()
	name := e.sc.workerNames()[0]
	soName := e.sc.scaledObjectFor(name).Name
	read := func(t *testing.T, op *kedaOperator) error {
		t.Helper()
		so := op.scaledObject(t, soName, e.sc.Info.Namespace)
		c, err := op.Handler.GetScalersCache(ctx, so)
		if err != nil {
			return fmt.Errorf("build: %w", err)
		}
		bt := onlyBacklogTrigger(t, so)
		_, _, _, err = c.GetMetricsAndActivityForScaler(ctx, bt.Index, fmt.Sprintf("s%d-metric-api-backlog", bt.Index))
		return err
	}
	expectStatus := func(t *testing.T, err error, code int) {
		t.Helper()
		want := fmt.Sprintf("/v1/workers/%s: api returned %d", name, code)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("KEDA's error %v, want one ending in %q", err, want)
		}
		t.Logf("KEDA's error: %v", err)
	}

	if !e.bound() {
		ta, secretName, key := e.tokenSecretRef(t, name)
		t.Run("wrong token", func(t *testing.T) {
			op := e.operator(t, e.withSecretValue(secretName, key, "not-the-sentinels-token"))
			expectStatus(t, read(t, op), http.StatusUnauthorized)
		})
		t.Run("rotated Secret is picked up by KEDA's retry", func(t *testing.T) {
			op := e.operator(t, e.withSecretValue(secretName, key, "the-old-token"))
			so := op.scaledObject(t, soName, e.sc.Info.Namespace)
			if _, err := op.Handler.GetScalersCache(ctx, so); err != nil {
				t.Fatal(err)
			}
			s := &corev1.Secret{}
			if err := op.Client.Get(ctx, client.ObjectKey{Name: secretName, Namespace: e.sc.Info.Namespace}, s); err != nil {
				t.Fatal(err)
			}
			s.Data[key] = []byte(e.sc.Info.Sentinel.Token)
			if err := op.Client.Update(ctx, s); err != nil {
				t.Fatal(err)
			}
			if err := read(t, op); err != nil {
				t.Fatalf("KEDA did not recover with the rotated token: %v", err)
			}
		})
		t.Run("missing TriggerAuthentication", func(t *testing.T) {
			var objs []client.Object
			for _, o := range e.sc.Objects {
				if a, ok := o.(*kedav1alpha1.TriggerAuthentication); ok && a.Name == ta {
					continue
				}
				objs = append(objs, o)
			}
			err := read(t, e.operator(t, objs))
			if err == nil || !strings.Contains(err.Error(), "bearer token") {
				t.Fatalf("want KEDA to refuse to build the scaler without a token, got %v", err)
			}
			t.Logf("KEDA's error: %v", err)
		})
		return
	}

	t.Run("expired token: KEDA mints a fresh one and retries", func(t *testing.T) {
		op := e.operator(t, e.sc.Objects)
		so := op.scaledObject(t, soName, e.sc.Info.Namespace)
		c, err := op.Handler.GetScalersCache(ctx, so)
		if err != nil {
			t.Fatal(err)
		}
		before := len(e.kube.mints())
		e.kube.RevokeAll() // the token KEDA holds was never reviewed, so the Sentinel has no verdict cached
		bt := onlyBacklogTrigger(t, so)
		if _, _, _, err := c.GetMetricsAndActivityForScaler(ctx, bt.Index, fmt.Sprintf("s%d-metric-api-backlog", bt.Index)); err != nil {
			t.Fatalf("KEDA did not recover with a fresh token: %v", err)
		}
		if n := len(e.kube.mints()) - before; n != 1 {
			t.Errorf("KEDA minted %d tokens while retrying, want 1", n)
		}
		reviews := e.kube.reviews()
		if len(reviews) < 2 || reviews[len(reviews)-2].Authenticated || !reviews[len(reviews)-1].Authenticated {
			t.Errorf("TokenReviews %+v: want a refused one, then an accepted one", reviews)
		}
	})
	if audiences := e.pod.Config.Auth.TokenReview.Audiences; len(audiences) > 0 {
		t.Run("token for the API server's audience (KEDA in legacy token mode)", func(t *testing.T) {
			useKEDATokenMode("legacy", nil)
			defer useKEDAAsTheNotesSay(t)
			expectStatus(t, read(t, e.operator(t, e.sc.Objects)), http.StatusUnauthorized)
			reviews := e.kube.reviews()
			last := reviews[len(reviews)-1]
			if last.Authenticated || !slices.Equal(last.Audiences, audiences) {
				t.Errorf("last TokenReview %+v: want audiences %v, not authenticated", last, audiences)
			}
		})
	}
	t.Run("token of another service account", func(t *testing.T) {
		// KEDA maps that account to the same audience: only the username differs.
		if audiences := e.pod.Config.Auth.TokenReview.Audiences; len(audiences) > 0 {
			cfg := kedaTokenPolicyFromNotes(t)
			cfg.ServiceAccountTokenAudiences = append(cfg.ServiceAccountTokenAudiences, resolver.ServiceAccountTokenAudience{
				Audience: audiences[0], Namespace: e.sc.Info.ClusterObjectNamespace, ServiceAccountName: "someone-else"})
			resolver.SetConfig(cfg)
			defer useKEDAAsTheNotesSay(t)
		}
		var objs []client.Object
		for _, o := range e.sc.Objects {
			if cta, ok := o.(*kedav1alpha1.ClusterTriggerAuthentication); ok {
				cta = cta.DeepCopy()
				for i := range cta.Spec.BoundServiceAccountToken {
					cta.Spec.BoundServiceAccountToken[i].ServiceAccountName = "someone-else"
				}
				o = cta
			}
			objs = append(objs, o)
		}
		objs = append(objs, &corev1.ServiceAccount{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
			ObjectMeta: metav1.ObjectMeta{Name: "someone-else", Namespace: e.sc.Info.ClusterObjectNamespace},
		})
		expectStatus(t, read(t, e.operator(t, objs)), http.StatusForbidden)
	})
}

// tokenSecretRef: the TriggerAuthentication of a worker's trigger and the Secret key it reads.
func (e *liveEnv) tokenSecretRef(t *testing.T, worker string) (string, string, string) {
	t.Helper()
	ref := onlyBacklogTrigger(t, e.sc.scaledObjectFor(worker)).Trigger.AuthenticationRef
	for _, ta := range e.sc.TriggerAuths {
		if ta.Name == ref.Name {
			for _, s := range ta.Spec.SecretTargetRef {
				if s.Parameter == "bearerToken" || s.Parameter == "token" {
					return ta.Name, s.Name, s.Key
				}
			}
		}
	}
	t.Fatalf("no TriggerAuthentication %s with a bearerToken secretTargetRef", ref.Name)
	return "", "", ""
}

func (e *liveEnv) withSecretValue(name, key, value string) []client.Object {
	var out []client.Object
	for _, o := range e.sc.Objects {
		if s, ok := o.(*corev1.Secret); ok && s.Name == name {
			s = s.DeepCopy()
			s.Data[key] = []byte(value)
			o = s
		}
		out = append(out, o)
	}
	return out
}

// TestKEDASeesTheStaleSentinel (KEDA_CONTRACT_STALE=1, the Sentinel answers 503): KEDA's scaler
// reports an error, never a value; KEDA's metrics server passes the error to the HPA until the
// fallback's failureThreshold is exceeded, then serves the fallback, from which the HPA keeps
// the pool; without a fallback it keeps erroring.
func TestKEDASeesTheStaleSentinel(t *testing.T) {
	if mustEnv(t, envStale) != "1" {
		t.Fatalf("%s must be 1", envStale)
	}
	e := newLiveEnv(t)
	ctx := context.Background()
	const currentReplicas = 3
	for _, name := range e.sc.workerNames() {
		want := e.sc.Info.Workers[name]
		t.Run(name, func(t *testing.T) {
			op := e.operator(t, e.sc.Objects)
			op.setDeploymentReplicas(t, name, e.sc.Info.Namespace, currentReplicas)
			so := op.scaledObject(t, e.sc.scaledObjectFor(name).Name, e.sc.Info.Namespace)
			c, err := op.Handler.GetScalersCache(ctx, so)
			if err != nil {
				t.Fatal(err)
			}
			bt := onlyBacklogTrigger(t, so)
			spec := metricSpecOf(t, ctx, c, bt.Index)
			metricName := spec.External.Metric.Name
			target := *spec.External.Target.AverageValue
			metrics, _, _, err := c.GetMetricsAndActivityForScaler(ctx, bt.Index, metricName)
			want503 := fmt.Sprintf("/v1/workers/%s: api returned 503", name)
			if err == nil || !strings.Contains(err.Error(), want503) {
				t.Fatalf("KEDA's scaler read %+v, err %v; want an error ending in %q", metrics, err, want503)
			}
			t.Logf("KEDA's scaler: %v", err)

			threshold := int32(3)
			if so.Spec.Fallback != nil {
				threshold = so.Spec.Fallback.FailureThreshold
			}
			for call := int32(1); call <= threshold+2; call++ {
				list, err := op.Handler.GetScaledObjectMetrics(ctx, so.Name, so.Namespace, metricName)
				fallback := so.Spec.Fallback != nil && call > threshold
				if !fallback {
					if err == nil {
						t.Fatalf("call %d: KEDA's metrics server gave the HPA %+v instead of an error", call, list.Items)
					}
					if call == 1 {
						t.Logf("KEDA's metrics server to the HPA: %v", err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("call %d (> failureThreshold %d): KEDA's fallback did not apply: %v", call, threshold, err)
				}
				wantReplicas := min(max(fallbackReplicas(so.Spec.Fallback, want.FallbackReplicas, currentReplicas),
					*so.GetHPAMinReplicas()), so.GetHPAMaxReplicas())
				hpa := hpaDesired(list.Items[0].Value, target, *so.GetHPAMinReplicas(), so.GetHPAMaxReplicas())
				if hpa != wantReplicas {
					t.Errorf("fallback: KEDA serves %s, the HPA would ask for %d replicas, want %d (%s, fallback replicas %d, current %d)",
						&list.Items[0].Value, hpa, wantReplicas, so.Spec.Fallback.Behavior, want.FallbackReplicas, currentReplicas)
				}
				if call == threshold+1 {
					t.Logf("after %d failures KEDA serves the fallback %s → HPA %d replicas", threshold, &list.Items[0].Value, hpa)
				}
			}
			stored := op.scaledObject(t, so.Name, so.Namespace)
			if so.Spec.Fallback != nil {
				h, ok := stored.Status.Health[metricName]
				if !ok || h.Status != kedav1alpha1.HealthStatusFailing || h.NumberOfFailures == nil || *h.NumberOfFailures < threshold+1 {
					t.Errorf("ScaledObject status health %+v, want failing with > %d failures", stored.Status.Health, threshold)
				}
			}
		})
	}
}

// fallbackReplicas is KEDA's documented fallback behaviour.
func fallbackReplicas(f *kedav1alpha1.Fallback, configured, current int32) int32 {
	switch f.Behavior {
	case kedav1alpha1.FallbackBehaviorCurrentReplicas:
		return current
	case kedav1alpha1.FallbackBehaviorCurrentReplicasIfHigher:
		return max(current, configured)
	case kedav1alpha1.FallbackBehaviorCurrentReplicasIfLower:
		return min(current, configured)
	default:
		return configured
	}
}
