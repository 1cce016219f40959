package kedacontract

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers"
	pb "github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"github.com/kedacore/keda/v2/pkg/scalers/scalersconfig"
	kedautil "github.com/kedacore/keda/v2/pkg/util"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	v2 "k8s.io/api/autoscaling/v2"
)

// External push: KEDA's own external-push scaler (scalers.NewExternalPushScaler, as KEDA's
// scale handler builds it from a trigger) against the live astro-sentinel's gRPC port, fed by
// the real Airflow the driver (test_external_push.py) started. The driver writes push.json.

const envPush = "KEDA_PUSH_ENV"

// pushEnv is push.json.
type pushEnv struct {
	// The live Sentinel: its gRPC port (mutual TLS) and its HTTP port (for metrics-api).
	Scaler   string  `json:"scaler"`
	HTTPURL  string  `json:"httpUrl"`
	Token    string  `json:"token"`
	CACert   string  `json:"caCert"`
	Client   pemPair `json:"client"`
	Stranger pemPair `json:"stranger"` // signed by another CA
	// After a rotation: the server CA the Sentinel's certificate no longer chains to.
	OldCACert string `json:"oldCaCert,omitempty"`
	// A Sentinel whose Airflow is unreachable: every worker's backlog is unknown.
	DeadScaler string `json:"deadScaler"`
	Worker     string `json:"worker"`
	SyncSlots  int64  `json:"syncSlots"`
	Airflow    struct {
		URL      string `json:"url"`
		Username string `json:"username"`
		Password string `json:"password"`
		DAG      string `json:"dag"`
	} `json:"airflow"`
	// The live Sentinel's refreshInterval (e.g. "1s").
	Refresh string `json:"refresh"`
	// Benchmark only: trials and the metrics-api polling intervals (seconds) to compare.
	Trials           int   `json:"trials"`
	PollingIntervals []int `json:"pollingIntervals"`
}

type pemPair struct {
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

func loadPushEnv(t *testing.T) *pushEnv {
	t.Helper()
	raw, err := os.ReadFile(mustEnv(t, envPush))
	if err != nil {
		t.Fatal(err)
	}
	var e pushEnv
	if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatalf("push.json: %v", err)
	}
	return &e
}

// pushScaler builds KEDA's external-push scaler for the worker, as a trigger with this
// metadata and a TriggerAuthentication with these params would.
func pushScaler(t *testing.T, address, worker string, auth map[string]string) scalers.PushScaler {
	t.Helper()
	s, err := scalers.NewExternalPushScaler(&scalersconfig.ScalerConfig{
		ScalableObjectName:      worker,
		ScalableObjectNamespace: "astro-test",
		ScalableObjectType:      "ScaledObject",
		TriggerType:             "external-push",
		TriggerMetadata:         map[string]string{"scalerAddress": address, "worker": worker},
		AuthParams:              auth,
		MetricType:              v2.AverageValueMetricType,
		GlobalHTTPTimeout:       5 * time.Second,
	})
	if err != nil {
		t.Fatalf("KEDA cannot build the external-push scaler: %v", err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func (e *pushEnv) mtls() map[string]string {
	return map[string]string{"caCert": e.CACert, "tlsClientCert": e.Client.Cert, "tlsClientKey": e.Client.Key}
}

// metricsAPIScaler builds KEDA's metrics-api scaler for the worker's /v1 URL (bearer token).
func (e *pushEnv) metricsAPIScaler(t *testing.T) scalers.Scaler {
	t.Helper()
	s, err := scalers.NewMetricsAPIScaler(&scalersconfig.ScalerConfig{
		ScalableObjectName:      e.Worker,
		ScalableObjectNamespace: "astro-test",
		ScalableObjectType:      "ScaledObject",
		TriggerType:             "metrics-api",
		TriggerMetadata: map[string]string{
			"url": e.HTTPURL + "/v1/workers/" + e.Worker, "valueLocation": "backlog",
			"targetValue": fmt.Sprint(e.SyncSlots), "authMode": "bearer",
		},
		AuthParams:        map[string]string{"token": e.Token},
		MetricType:        v2.AverageValueMetricType,
		GlobalHTTPTimeout: 5 * time.Second,
	}, nil)
	if err != nil {
		t.Fatalf("KEDA cannot build the metrics-api scaler: %v", err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// activity reads the worker through the scaler as KEDA's scale loop does.
func activity(ctx context.Context, s scalers.Scaler) (bool, float64, error) {
	specs := s.GetMetricSpecForScaling(ctx)
	if len(specs) != 1 {
		return false, 0, fmt.Errorf("%d metric specs", len(specs))
	}
	metrics, active, err := s.GetMetricsAndActivity(ctx, specs[0].External.Metric.Name)
	if err != nil {
		return false, 0, err
	}
	if len(metrics) != 1 {
		return false, 0, fmt.Errorf("%d metric values", len(metrics))
	}
	return active, metrics[0].Value.AsApproximateFloat64(), nil
}

// run starts the push scaler as KEDA's scale handler does and stamps each value on arrival.
type pushed struct {
	active bool
	at     time.Time
}

func runPush(ctx context.Context, s scalers.PushScaler) <-chan pushed {
	raw := make(chan bool)
	out := make(chan pushed, 64)
	go s.Run(ctx, raw)
	go func() {
		defer close(out)
		for a := range raw {
			out <- pushed{a, time.Now()}
		}
	}()
	return out
}

func nextPush(t *testing.T, ch <-chan pushed, timeout time.Duration) pushed {
	t.Helper()
	select {
	case p, ok := <-ch:
		if !ok {
			t.Fatal("the push scaler stopped")
		}
		return p
	case <-time.After(timeout):
		t.Fatalf("no push within %s", timeout)
	}
	return pushed{}
}

// ---- Airflow (REST API v2), to queue and clear work ---------------------------------------

type airflowClient struct {
	env   *pushEnv
	token string
}

func (a *airflowClient) do(t *testing.T, method, path string, body any, out any) {
	t.Helper()
	if a.token == "" {
		var tok struct {
			AccessToken string `json:"access_token"`
		}
		a.call(t, "POST", "/auth/token", map[string]string{"username": a.env.Airflow.Username, "password": a.env.Airflow.Password}, "", &tok)
		a.token = tok.AccessToken
	}
	a.call(t, method, path, body, a.token, out)
}

func (a *airflowClient) call(t *testing.T, method, path string, body any, token string, out any) {
	t.Helper()
	var reader *bytes.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		reader = bytes.NewReader(raw)
	} else {
		reader = bytes.NewReader(nil)
	}
	req, _ := http.NewRequest(method, a.env.Airflow.URL+path, reader)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("Airflow %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		t.Fatalf("Airflow %s %s: %d %s", method, path, resp.StatusCode, b.String())
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("Airflow %s %s: %v", method, path, err)
		}
	}
}

// trigger starts a run of the one-task DAG; its task will sit queued (nothing serves its queue).
func (a *airflowClient) trigger(t *testing.T) string {
	runID := fmt.Sprintf("push-%d", time.Now().UnixNano())
	a.do(t, "POST", "/api/v2/dags/"+a.env.Airflow.DAG+"/dagRuns", map[string]any{"dag_run_id": runID, "logical_date": nil}, nil)
	return runID
}

// queuedAt waits for the run's task to be queued and returns its queued_dttm.
func (a *airflowClient) queuedAt(t *testing.T, runID string) time.Time {
	t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	for time.Now().Before(deadline) {
		var page struct {
			TaskInstances []struct {
				State      string  `json:"state"`
				QueuedWhen *string `json:"queued_when"`
			} `json:"task_instances"`
		}
		a.do(t, "GET", "/api/v2/dags/"+a.env.Airflow.DAG+"/dagRuns/"+runID+"/taskInstances", nil, &page)
		if len(page.TaskInstances) == 1 && page.TaskInstances[0].QueuedWhen != nil {
			at, err := time.Parse(time.RFC3339Nano, *page.TaskInstances[0].QueuedWhen)
			if err != nil {
				t.Fatalf("queued_when %q: %v", *page.TaskInstances[0].QueuedWhen, err)
			}
			return at
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("the task of run %s was not queued within 120 s", runID)
	return time.Time{}
}

// clear fails the run: Airflow marks its queued task skipped, and the backlog drops to 0.
func (a *airflowClient) clear(t *testing.T, runID string) {
	a.do(t, "PATCH", "/api/v2/dags/"+a.env.Airflow.DAG+"/dagRuns/"+runID, map[string]string{"state": "failed"}, nil)
}

// waitIdle waits until KEDA's scaler reads backlog 0 from the Sentinel.
func waitIdle(t *testing.T, s scalers.Scaler) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		active, value, err := activity(context.Background(), s)
		if err == nil && !active && value == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker is not idle after 60 s: active %v, value %v, error %v", active, value, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ---- the checks --------------------------------------------------------------------------

// TestExternalPushAgainstTheSentinel: KEDA's external-push scaler, with a client certificate
// from a TriggerAuthentication, gets false for the idle worker when its stream opens, then true
// pushed once Airflow queues a task for it, then false when the task is gone; its metric is the
// backlog with syncSlots as the target. Without a client certificate the Sentinel accepts no
// call; a Sentinel that cannot read Airflow answers errors, never inactive.
func TestExternalPushAgainstTheSentinel(t *testing.T) {
	e := loadPushEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := pushScaler(t, e.Scaler, e.Worker, e.mtls())
	waitIdle(t, s)

	specs := s.GetMetricSpecForScaling(ctx)
	if len(specs) != 1 || specs[0].External.Metric.Name != "s0-backlog" ||
		specs[0].External.Target.AverageValue.MilliValue() != e.SyncSlots*1000 {
		t.Fatalf("metric spec %+v, want s0-backlog with target %d", specs, e.SyncSlots)
	}

	ch := runPush(ctx, s)
	if p := nextPush(t, ch, 10*time.Second); p.active {
		t.Fatal("the stream opened with active=true for an idle worker")
	}
	af := &airflowClient{env: e}
	run := af.trigger(t)
	p := nextPush(t, ch, 120*time.Second)
	if !p.active {
		t.Fatal("the Sentinel pushed false after a task was queued")
	}
	queued := af.queuedAt(t, run)
	t.Logf("queued_dttm %s → KEDA's push scaler got active=true %s later", queued.Format(time.RFC3339Nano), p.at.Sub(queued))
	active, value, err := activity(ctx, s)
	if err != nil || !active || value != 1 {
		t.Fatalf("with one task queued KEDA reads active %v, value %v, error %v", active, value, err)
	}
	af.clear(t, run)
	if p := nextPush(t, ch, 60*time.Second); p.active {
		t.Fatal("the Sentinel pushed true again instead of false after the task was cleared")
	}

	// Auth: no client certificate, a certificate from another CA, plain gRPC.
	for name, auth := range map[string]map[string]string{
		"server CA only": {"caCert": e.CACert},
		"another CA":     {"caCert": e.CACert, "tlsClientCert": e.Stranger.Cert, "tlsClientKey": e.Stranger.Key},
	} {
		if _, _, err := pushScaler(t, e.Scaler, e.Worker, auth).GetMetricsAndActivity(ctx, "s0-backlog"); err == nil {
			t.Errorf("%s: the Sentinel answered without a valid client certificate", name)
		} else {
			t.Logf("%s: refused: %v", name, err)
		}
	}
	if code := streamCode(t, e.Scaler, e.Worker); code != codes.Unavailable {
		t.Errorf("plain gRPC to the mutual-TLS port: %v, want the connection refused (Unavailable)", code)
	}

	// The 503-never-0 rule: an unknown backlog is an error on every call, never false or 0.
	dead := pushScaler(t, e.DeadScaler, e.Worker, e.mtls())
	if _, _, err := dead.GetMetricsAndActivity(ctx, "s0-backlog"); err == nil || !strings.Contains(err.Error(), "not loaded") {
		t.Errorf("a Sentinel that cannot read Airflow: KEDA got %v, want an error saying not loaded", err)
	}
	if code := streamCode(t, e.DeadScaler, e.Worker, e.mtls()); code != codes.Unavailable {
		t.Errorf("StreamIsActive for an unknown backlog: %v, want Unavailable", code)
	}
}

// TestExternalPushAfterCertificateRotation: the driver replaced the live Sentinel's certificate,
// key and client CA under the running process, as a renewed Secret reaches its volume; push.json
// now names the new ones, `stranger` the old client certificate and `oldCaCert` the old server
// CA. KEDA's scaler built from the new TriggerAuthentication is served; the old client
// certificate is refused, and the old CA no longer verifies the Sentinel.
func TestExternalPushAfterCertificateRotation(t *testing.T) {
	e := loadPushEnv(t)
	ctx := context.Background()
	if _, _, err := pushScaler(t, e.Scaler, e.Worker, e.mtls()).GetMetricsAndActivity(ctx, "s0-backlog"); err != nil {
		t.Fatalf("KEDA with the rotated certificates: %v", err)
	}
	for name, auth := range map[string]map[string]string{
		"the old client certificate": {"caCert": e.CACert, "tlsClientCert": e.Stranger.Cert, "tlsClientKey": e.Stranger.Key},
		"the old server CA":          {"caCert": e.OldCACert, "tlsClientCert": e.Client.Cert, "tlsClientKey": e.Client.Key},
	} {
		if _, _, err := pushScaler(t, e.Scaler, e.Worker, auth).GetMetricsAndActivity(ctx, "s0-backlog"); err == nil {
			t.Errorf("%s: still accepted after the rotation", name)
		} else {
			t.Logf("%s: refused: %v", name, err)
		}
	}
}

// streamCode opens StreamIsActive with KEDA's generated client and returns the status of the
// first receive (OK when a value arrived). auth: KEDA's TLS params, or none for plain gRPC.
func streamCode(t *testing.T, address, worker string, auth ...map[string]string) codes.Code {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if len(auth) > 0 {
		creds, err := tlsCredentials(auth[0])
		if err != nil {
			t.Fatal(err)
		}
		opts = []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	}
	conn, err := grpc.NewClient(address, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := pb.NewExternalScalerClient(conn).StreamIsActive(ctx, &pb.ScaledObjectRef{
		Name: worker, Namespace: "astro-test", ScalerMetadata: map[string]string{"worker": worker}})
	if err == nil {
		_, err = stream.Recv()
	}
	return status.Code(err)
}

// ---- the benchmark -----------------------------------------------------------------------

// TestWakeUpLatencyBenchmark (benchmarks/sentinel/push_latency.sh): queued_dttm → KEDA active
// for KEDA's external-push scaler and for KEDA's metrics-api scaler polled at each interval,
// the same queued task seen by all of them, over e.Trials trials. Each trial starts at a random
// point of the Sentinel's refresh cycle, and a poll loop at a random phase (KEDA's ticker is not
// aligned with Airflow); the push stream stays open.
func TestWakeUpLatencyBenchmark(t *testing.T) {
	e := loadPushEnv(t)
	if e.Trials == 0 {
		t.Skip("no trials asked")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	push := pushScaler(t, e.Scaler, e.Worker, e.mtls())
	poll := e.metricsAPIScaler(t)
	waitIdle(t, poll)
	ch := runPush(ctx, push)
	if p := nextPush(t, ch, 10*time.Second); p.active {
		t.Fatal("the stream opened with active=true for an idle worker")
	}
	af := &airflowClient{env: e}
	names := []string{"external-push"}
	for _, s := range e.PollingIntervals {
		names = append(names, fmt.Sprintf("metrics-api every %ds", s))
	}
	refresh, err := time.ParseDuration(e.Refresh)
	if err != nil {
		t.Fatalf("refresh %q: %v", e.Refresh, err)
	}
	latencies := make(map[string][]time.Duration)
	for trial := 1; trial <= e.Trials; trial++ {
		// The previous trial ended at a refresh (the pushed false): a random pause puts the
		// next task at a random point of the refresh cycle, as Airflow's tasks are.
		time.Sleep(time.Duration(rand.Int64N(int64(refresh))))
		trialCtx, stop := context.WithCancel(ctx)
		found := make(chan struct {
			name string
			at   time.Time
		}, len(names))
		run := af.trigger(t)
		started := time.Now()
		for i, interval := range e.PollingIntervals {
			go pollUntilActive(trialCtx, poll, time.Duration(interval)*time.Second, names[i+1], found)
		}
		p := nextPush(t, ch, 120*time.Second)
		if !p.active {
			t.Fatalf("trial %d: pushed false", trial)
		}
		at := map[string]time.Time{names[0]: p.at}
		for len(at) < len(names) {
			select {
			case f := <-found:
				at[f.name] = f.at
			case <-time.After(3 * time.Minute):
				t.Fatalf("trial %d: not every scaler active within 3 min: %v", trial, at)
			}
		}
		stop()
		queued := af.queuedAt(t, run)
		line := fmt.Sprintf("trial %2d: trigger→queued %5.2fs", trial, queued.Sub(started).Seconds())
		for _, n := range names {
			d := at[n].Sub(queued)
			latencies[n] = append(latencies[n], d)
			line += fmt.Sprintf(" | %s %6.2fs", n, d.Seconds())
		}
		t.Log(line)
		af.clear(t, run)
		if p := nextPush(t, ch, 60*time.Second); p.active {
			t.Fatalf("trial %d: pushed true after the task was cleared", trial)
		}
		waitIdle(t, poll)
	}
	t.Logf("queued_dttm → KEDA active over %d trials:", e.Trials)
	for _, n := range names {
		t.Logf("BENCH %-26s p50 %6.2fs  p95 %6.2fs  max %6.2fs", n,
			quantile(latencies[n], 0.50).Seconds(), quantile(latencies[n], 0.95).Seconds(), quantile(latencies[n], 1).Seconds())
	}
}

// pollUntilActive is KEDA's scale loop for one scaler: a read every interval, the first one at
// a random phase; it reports the moment the first read says active.
func pollUntilActive(ctx context.Context, s scalers.Scaler, interval time.Duration, name string, found chan<- struct {
	name string
	at   time.Time
}) {
	wait := time.Duration(rand.Int64N(int64(interval)))
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = interval
		active, _, err := activity(ctx, s)
		if errors.Is(err, context.Canceled) {
			return
		}
		if err == nil && active {
			found <- struct {
				name string
				at   time.Time
			}{name, time.Now()}
			return
		}
	}
}

// quantile: the nearest-rank q-quantile.
func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// tlsCredentials: gRPC transport credentials from KEDA's TLS params, built by KEDA's helper.
func tlsCredentials(auth map[string]string) (credentials.TransportCredentials, error) {
	cfg, err := kedautil.NewTLSConfig(auth["tlsClientCert"], auth["tlsClientKey"], auth["caCert"], false)
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}
