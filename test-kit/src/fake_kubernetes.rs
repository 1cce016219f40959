//! A fake Kubernetes API server that answers TokenReviews from a table of tokens, and
//! LocalSubjectAccessReviews from a table of grants.

use crate::server::{json_response, serve, TestServer};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// What a TokenRequest without audiences gets, and what a review without audiences checks.
pub const API_SERVER_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// (username, namespace, verb, resource, name) that a LocalSubjectAccessReview allows.
pub type Grant = (String, String, String, String, String);

/// Answers TokenReviews as kube-apiserver does, for the tokens in its table.
pub struct FakeKubernetes {
    /// token → username; tokens not in the table are not authenticated.
    pub users: Mutex<HashMap<String, String>>,
    /// token → the audiences it was minted for; absent: the API server's own.
    pub token_audiences: Mutex<HashMap<String, Vec<String>>>,
    /// Answer like an API server that does not know audiences (none in the status).
    pub ignores_audiences: AtomicBool,
    /// The `spec.audiences` of each review, in order.
    pub asked_audiences: Mutex<Vec<Vec<String>>>,
    /// The bearer token the Sentinel must present as itself.
    pub own_token: String,
    pub reviews: AtomicUsize,
    /// The tokens reviewed, in order (to check the request body).
    pub seen: Mutex<Vec<String>>,
    /// Answer this status instead of a review (e.g. 500 or 403).
    pub broken: Mutex<Option<u16>>,
    /// While `false`, reviews are received (and counted) but not answered.
    pub answering: watch::Sender<bool>,
    /// What RBAC allows; everything else is denied.
    pub grants: Mutex<HashSet<Grant>>,
    /// LocalSubjectAccessReviews answered.
    pub access_reviews: AtomicUsize,
}

impl FakeKubernetes {
    pub fn new(own_token: &str) -> Arc<Self> {
        Arc::new(FakeKubernetes {
            users: Mutex::new(HashMap::new()),
            token_audiences: Mutex::new(HashMap::new()),
            ignores_audiences: AtomicBool::new(false),
            asked_audiences: Mutex::new(Vec::new()),
            own_token: own_token.into(),
            reviews: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
            broken: Mutex::new(None),
            answering: watch::Sender::new(true),
            grants: Mutex::new(HashSet::new()),
            access_reviews: AtomicUsize::new(0),
        })
    }

    /// A fake that knows `users` (token, username) besides the caller's own token.
    pub fn with_users(own_token: &str, users: &[(&str, &str)]) -> Arc<Self> {
        let fake = Self::new(own_token);
        fake.users.lock().unwrap().extend(
            users
                .iter()
                .map(|(token, user)| (token.to_string(), user.to_string())),
        );
        fake
    }

    /// Lets `username` `get` the Deployment `name` in `namespace`.
    pub fn grant_deployment(&self, username: &str, namespace: &str, name: &str) {
        self.grants.lock().unwrap().insert((
            username.into(),
            namespace.into(),
            "get".into(),
            "deployments".into(),
            name.into(),
        ));
    }

    pub fn reviews(&self) -> usize {
        self.reviews.load(Ordering::SeqCst)
    }

    pub async fn start(self: &Arc<Self>) -> TestServer {
        let me = self.clone();
        serve(move |req| {
            let me = me.clone();
            async move { me.answer(req).await }
        })
        .await
    }

    pub async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        if req.method() == hyper::Method::POST
            && req
                .uri()
                .path()
                .starts_with("/apis/authorization.k8s.io/v1/namespaces/")
            && req.uri().path().ends_with("/localsubjectaccessreviews")
        {
            return self.answer_access_review(req).await;
        }
        if req.method() != hyper::Method::POST
            || req.uri().path() != "/apis/authentication.k8s.io/v1/tokenreviews"
        {
            return json_response(404, serde_json::json!({"kind": "Status", "code": 404}));
        }
        self.reviews.fetch_add(1, Ordering::SeqCst);
        let _ = self
            .answering
            .subscribe()
            .wait_for(|answering| *answering)
            .await;
        let own = format!("Bearer {}", self.own_token);
        if req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            != Some(own.as_str())
        {
            return json_response(401, serde_json::json!({"kind": "Status", "code": 401}));
        }
        if let Some(code) = *self.broken.lock().unwrap() {
            return json_response(code, serde_json::json!({"kind": "Status", "code": code}));
        }
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let review: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(review["apiVersion"], "authentication.k8s.io/v1");
        assert_eq!(review["kind"], "TokenReview");
        let token = review["spec"]["token"].as_str().unwrap().to_string();
        self.seen.lock().unwrap().push(token.clone());
        let asked: Vec<String> =
            serde_json::from_value(review["spec"]["audiences"].clone()).unwrap_or_default();
        self.asked_audiences.lock().unwrap().push(asked.clone());
        // Like kube-apiserver: the review's audiences (the API server's own when none) must meet
        // the token's; the status names the ones they share.
        let wanted = if asked.is_empty() || self.ignores_audiences.load(Ordering::SeqCst) {
            vec![API_SERVER_AUDIENCE.to_string()]
        } else {
            asked
        };
        let minted_for = self
            .token_audiences
            .lock()
            .unwrap()
            .get(&token)
            .cloned()
            .unwrap_or_else(|| vec![API_SERVER_AUDIENCE.to_string()]);
        let shared: Vec<&String> = wanted.iter().filter(|a| minted_for.contains(a)).collect();
        let status = match self.users.lock().unwrap().get(&token) {
            Some(user) if !shared.is_empty() => {
                let mut status = serde_json::json!({
                    "authenticated": true,
                    "user": {"username": user, "uid": "1234", "groups": ["system:serviceaccounts"]},
                });
                if !self.ignores_audiences.load(Ordering::SeqCst) {
                    status["audiences"] = serde_json::json!(shared);
                }
                status
            }
            Some(_) => serde_json::json!({
                "authenticated": false,
                "error": format!("token audiences {minted_for:?} is invalid for the target audiences {wanted:?}"),
            }),
            None => serde_json::json!({"authenticated": false, "error": "invalid bearer token"}),
        };
        json_response(
            201,
            serde_json::json!({
                "kind": "TokenReview",
                "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"creationTimestamp": null},
                "spec": {"token": token},
                "status": status,
            }),
        )
    }
}

impl FakeKubernetes {
    /// As kube-apiserver's RBAC would, from [`FakeKubernetes::grants`]; the review must name the
    /// namespace of its path.
    async fn answer_access_review(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let path_namespace = req
            .uri()
            .path()
            .split('/')
            .nth(5)
            .unwrap_or_default()
            .to_string();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let review: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(review["kind"], "LocalSubjectAccessReview");
        self.access_reviews.fetch_add(1, Ordering::SeqCst);
        let attributes = &review["spec"]["resourceAttributes"];
        let field = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        if field(&attributes["namespace"]) != path_namespace {
            return json_response(400, serde_json::json!({"kind": "Status", "code": 400}));
        }
        let asked = (
            field(&review["spec"]["user"]),
            path_namespace,
            field(&attributes["verb"]),
            field(&attributes["resource"]),
            field(&attributes["name"]),
        );
        let allowed = attributes["group"] == "apps" && self.grants.lock().unwrap().contains(&asked);
        json_response(
            201,
            serde_json::json!({
                "kind": "LocalSubjectAccessReview",
                "apiVersion": "authorization.k8s.io/v1",
                "metadata": {"namespace": asked.1},
                "spec": review["spec"],
                "status": {"allowed": allowed},
            }),
        )
    }
}

/// A token shaped like a Kubernetes service-account token (three base64url segments) that no
/// API server issued, a different one for each `seed`.
pub fn jwt_shaped(seed: &str) -> String {
    use sha2::{Digest, Sha256};
    let hex = |part: &str| -> String {
        Sha256::digest(format!("{part} {seed}").as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    format!(
        "eyJhbGciOiJSUzI1NiJ9.eyJ{}.{}",
        hex("payload"),
        hex("signature")
    )
}

/// A token shaped and filled like the one the API server mints for service account `username`
/// (`system:serviceaccount:<namespace>:<name>`): its payload claims `sub` and `kubernetes.io`,
/// and `seed` makes each one different, as each minting does. Signed with a key no API server
/// has: only this fake's table says whether it is valid.
pub fn service_account_jwt(username: &str, seed: &str) -> String {
    let mut parts = username.splitn(4, ':').skip(2);
    let (namespace, name) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let claims = serde_json::json!({
        "sub": username,
        "jti": seed,
        "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": name, "uid": seed}},
    });
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(b"not the API server's key"),
    )
    .expect("claims serialise")
}
