package kedacontract

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// apiServerAudience stands for the API server's own audience: what a TokenRequest without
// audiences gets, and what a TokenReview without audiences checks against.
const apiServerAudience = "https://kubernetes.default.svc.cluster.local"

// fakeKubeAPI serves the two Kubernetes API calls of the bound-token path over real HTTP, so
// that KEDA's real client-go call (TokenRequest, from KEDA's resolver) and the real Sentinel
// (TokenReview) both talk to it:
//
//	POST /api/v1/namespaces/{ns}/serviceaccounts/{name}/token      (KEDA → API server)
//	POST /apis/authentication.k8s.io/v1/tokenreviews               (Sentinel → API server)
//
// A review authenticates a token this server minted and has not revoked, as
// system:serviceaccount:{ns}:{name}, when the token's audiences meet the review's (the API
// server's own audience when the review names none), like kube-apiserver does.
type fakeKubeAPI struct {
	// The only credential accepted for TokenReview: the Sentinel's own service-account token.
	reviewerToken string

	mu      sync.Mutex
	minted  map[string]mintedToken
	Mints   []mintedToken // every TokenRequest, in order
	Reviews []tokenReview // every TokenReview, in order

	listener net.Listener
	server   *http.Server
}

type mintedToken struct {
	Namespace, ServiceAccount string
	Audiences                 []string
	ExpirationSeconds         int64
	Token                     string
	revoked                   bool
}

type tokenReview struct {
	Audiences     []string
	Authenticated bool
	Username      string
}

func startFakeKubeAPI(t *testing.T, listen, reviewerToken string) *fakeKubeAPI {
	t.Helper()
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatalf("fake Kubernetes API: %v", err)
	}
	f := &fakeKubeAPI{reviewerToken: reviewerToken, minted: map[string]mintedToken{}, listener: l}
	f.server = &http.Server{Handler: http.HandlerFunc(f.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = f.server.Serve(l) }()
	t.Cleanup(func() { _ = f.server.Close() })
	return f
}

// Clientset is a real client-go clientset pointed at this server (what KEDA's operator gets
// from its in-cluster config).
func (f *fakeKubeAPI) Clientset(t *testing.T) *kubernetes.Clientset {
	t.Helper()
	// This fake speaks JSON only (client-go may prefer protobuf for core types).
	cs, err := kubernetes.NewForConfig(&rest.Config{
		Host:          "http://" + f.listener.Addr().String(),
		ContentConfig: rest.ContentConfig{ContentType: "application/json", AcceptContentTypes: "application/json"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// RevokeAll makes every token minted so far fail review (an expired or rotated token).
func (f *fakeKubeAPI) RevokeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, m := range f.minted {
		m.revoked = true
		f.minted[k] = m
	}
}

func (f *fakeKubeAPI) mints() []mintedToken {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]mintedToken(nil), f.Mints...)
}

func (f *fakeKubeAPI) reviews() []tokenReview {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]tokenReview(nil), f.Reviews...)
}

func (f *fakeKubeAPI) serve(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case r.Method == http.MethodPost && len(parts) == 7 && parts[0] == "api" && parts[1] == "v1" &&
		parts[2] == "namespaces" && parts[4] == "serviceaccounts" && parts[6] == "token":
		f.tokenRequest(w, r, parts[3], parts[5])
	case r.Method == http.MethodPost && r.URL.Path == "/apis/authentication.k8s.io/v1/tokenreviews":
		f.tokenReview(w, r)
	default:
		writeStatus(w, http.StatusNotFound, fmt.Sprintf("the fake API does not serve %s %s", r.Method, r.URL.Path))
	}
}

func (f *fakeKubeAPI) tokenRequest(w http.ResponseWriter, r *http.Request, namespace, name string) {
	var req authenticationv1.TokenRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeStatus(w, http.StatusBadRequest, err.Error())
		return
	}
	audiences := req.Spec.Audiences
	if len(audiences) == 0 {
		audiences = []string{apiServerAudience}
	}
	expiration := int64(3600)
	if req.Spec.ExpirationSeconds != nil {
		expiration = *req.Spec.ExpirationSeconds
	}
	// Shaped like the API server's tokens (KEDA reads sub, aud and exp before using one); signed
	// with a key nobody checks: only this server's TokenReview decides whether it is valid.
	buf := make([]byte, 24)
	_, _ = rand.Read(buf)
	now := time.Now()
	token, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"iss": apiServerAudience,
		"sub": "system:serviceaccount:" + namespace + ":" + name,
		"aud": audiences,
		"iat": now.Unix(),
		"nbf": now.Unix(),
		"exp": now.Add(time.Duration(expiration) * time.Second).Unix(),
		"jti": hex.EncodeToString(buf),
	}).SignedString(buf)
	if err != nil {
		writeStatus(w, http.StatusInternalServerError, err.Error())
		return
	}
	m := mintedToken{Namespace: namespace, ServiceAccount: name, Audiences: audiences, ExpirationSeconds: expiration, Token: token}
	f.mu.Lock()
	f.minted[token] = m
	f.Mints = append(f.Mints, m)
	f.mu.Unlock()

	req.TypeMeta = metav1.TypeMeta{APIVersion: "authentication.k8s.io/v1", Kind: "TokenRequest"}
	req.Name, req.Namespace = name, namespace
	req.Status = authenticationv1.TokenRequestStatus{
		Token:               token,
		ExpirationTimestamp: metav1.NewTime(time.Now().Add(time.Duration(expiration) * time.Second)),
	}
	writeJSON(w, http.StatusCreated, &req)
}

func (f *fakeKubeAPI) tokenReview(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+f.reviewerToken {
		writeStatus(w, http.StatusUnauthorized, "Unauthorized")
		return
	}
	var review authenticationv1.TokenReview
	if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
		writeStatus(w, http.StatusBadRequest, err.Error())
		return
	}
	wanted := review.Spec.Audiences
	if len(wanted) == 0 {
		wanted = []string{apiServerAudience}
	}
	f.mu.Lock()
	m, known := f.minted[review.Spec.Token]
	f.mu.Unlock()
	status := authenticationv1.TokenReviewStatus{}
	var matched []string
	for _, a := range m.Audiences {
		for _, b := range wanted {
			if a == b {
				matched = append(matched, a)
			}
		}
	}
	switch {
	case !known || m.revoked:
		status.Error = "invalid bearer token"
	case len(matched) == 0:
		status.Error = "token audiences " + fmt.Sprint(m.Audiences) + " is invalid for the target audiences " + fmt.Sprint(wanted)
	default:
		status.Authenticated = true
		status.Audiences = matched
		status.User = authenticationv1.UserInfo{
			Username: "system:serviceaccount:" + m.Namespace + ":" + m.ServiceAccount,
			Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + m.Namespace, "system:authenticated"},
		}
	}
	f.mu.Lock()
	f.Reviews = append(f.Reviews, tokenReview{Audiences: review.Spec.Audiences, Authenticated: status.Authenticated, Username: status.User.Username})
	f.mu.Unlock()
	review.Status = status
	review.TypeMeta = metav1.TypeMeta{APIVersion: "authentication.k8s.io/v1", Kind: "TokenReview"}
	writeJSON(w, http.StatusCreated, &review)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeStatus(w http.ResponseWriter, code int, message string) {
	writeJSON(w, code, &metav1.Status{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"},
		Status:   metav1.StatusFailure, Message: message, Code: int32(code),
	})
}
