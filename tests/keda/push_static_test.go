package kedacontract

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"

	"github.com/kedacore/keda/v2/pkg/scalers"
	"github.com/kedacore/keda/v2/pkg/scaling/cache"
	kedautil "github.com/kedacore/keda/v2/pkg/util"
)

// sentinelScalerKeys are the trigger metadata keys the Sentinel's external scaler reads (as
// sentinel/src/serve/external_scaler/service.rs names them); KEDA forwards them without
// reading them.
var sentinelScalerKeys = []string{"worker", "activationTargetValue"}

// checkPushTrigger: KEDA's scale handler built an external-push scaler for worker `name` from the
// rendered trigger, with the mutual-TLS material its resolver read from the rendered
// TriggerAuthentication and Secret, and that material fits the Sentinel behind `scalerAddress`:
// a TLS handshake over an in-memory pipe, KEDA's side configured by KEDA's own TLS helper and
// the Sentinel's side from the files its Pod mounts (its certificate and key, and the CA it
// checks clients against), succeeds for the address's host name. No connection leaves the
// process: KEDA's gRPC client connects lazily, and nothing here asks it to. KEDA's external-push
// scaler against a live Sentinel is test_external_push.py; on a cluster, the cluster stage.
func checkPushTrigger(t *testing.T, sc *scenario, c *cache.ScalersCache, bt backlogTrigger, name string) {
	t.Helper()
	built := c.Scalers[bt.Index]
	if _, ok := built.Scaler.(scalers.PushScaler); !ok {
		t.Fatalf("trigger %d: KEDA built a %T, not a push scaler", bt.Index, built.Scaler)
	}
	auth := built.ScalerConfig.AuthParams
	for _, key := range []string{"caCert", "tlsClientCert", "tlsClientKey"} {
		if auth[key] == "" {
			t.Fatalf("KEDA resolved no %s from the TriggerAuthentication (it resolved %d params)", key, len(auth))
		}
	}
	address := bt.Trigger.Metadata["scalerAddress"]
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		t.Fatalf("scalerAddress %q: %v", address, err)
	}
	pod, err := sentinelBehind(sc, "https://"+address)
	if err != nil {
		t.Fatalf("scalerAddress %q: %v", address, err)
	}
	if pod.worker(name) == nil {
		t.Fatalf("the Sentinel behind %s has no worker %q", address, name)
	}
	mounted := func(env string) []byte {
		file := pod.env(env)
		if file == "" {
			t.Fatalf("the Sentinel's container does not set %s", env)
		}
		data, err := fileInContainer(sc, pod.Deployment, pod.Container, file)
		if err != nil {
			t.Fatalf("%s: %v", env, err)
		}
		return data
	}
	serverPair, err := tls.X509KeyPair(mounted("ASTRO_SENTINEL_EXTERNAL_SCALER_TLS_CERT"), mounted("ASTRO_SENTINEL_EXTERNAL_SCALER_TLS_KEY"))
	if err != nil {
		t.Fatalf("the Sentinel's certificate and key: %v", err)
	}
	clientCAs := x509.NewCertPool()
	if !clientCAs.AppendCertsFromPEM(mounted("ASTRO_SENTINEL_EXTERNAL_SCALER_CLIENT_CA")) {
		t.Fatal("the Sentinel's client CA file holds no PEM certificate")
	}
	sentinelSide := &tls.Config{
		Certificates: []tls.Certificate{serverPair},
		ClientCAs:    clientCAs,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}
	kedaSide, err := kedautil.NewTLSConfig(auth["tlsClientCert"], auth["tlsClientKey"], auth["caCert"], false)
	if err != nil {
		t.Fatalf("KEDA's TLS config from the resolved params: %v", err)
	}
	// What gRPC's TLS credentials set from the target address.
	kedaSide.ServerName = host

	kedaConn, sentinelConn := net.Pipe()
	defer kedaConn.Close()
	defer sentinelConn.Close()
	served := make(chan error, 1)
	server := tls.Server(sentinelConn, sentinelSide)
	go func() { served <- server.Handshake() }()
	client := tls.Client(kedaConn, kedaSide)
	if err := client.Handshake(); err != nil {
		t.Fatalf("KEDA's side of the mutual-TLS handshake with the Sentinel at %s: %v", address, err)
	}
	if err := <-served; err != nil {
		t.Fatalf("the Sentinel's side of the mutual-TLS handshake with KEDA: %v", err)
	}
	peer := server.ConnectionState().PeerCertificates
	t.Logf("KEDA: external-push scaler for %s at %s; mutual TLS with the rendered certificates: "+
		"the Sentinel proves %q, KEDA proves %q", name, address, host, peer[0].Subject.CommonName)
}
