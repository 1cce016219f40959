//! Per-request tokens for the Edge Worker API.
//!
//! The edge3 provider authenticates each call with a short-lived HS512 JWT signed with
//! Airflow's `[api_auth] jwt_secret`. Its `method` claim must equal the request path after
//! `/edge_worker/v1/`, so a token is only good for the one call it was minted for.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;
use std::time::{SystemTime, UNIX_EPOCH};

/// How long a minted token stays valid; the server's own clients use the same short window.
const TOKEN_LIFETIME_SECS: u64 = 10;

#[derive(Serialize)]
struct Claims<'a> {
    method: &'a str,
    jti: String,
    aud: &'static str,
    iat: u64,
    nbf: u64,
    exp: u64,
}

/// Signs Edge API tokens. The secret is held only as a signing key and never printed.
#[derive(Clone)]
pub struct EdgeTokenSigner {
    key: EncodingKey,
}

impl std::fmt::Debug for EdgeTokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EdgeTokenSigner(<secret>)")
    }
}

impl EdgeTokenSigner {
    pub fn new(secret: &[u8]) -> Self {
        EdgeTokenSigner {
            key: EncodingKey::from_secret(secret),
        }
    }

    /// A token for one call to `method` (e.g. `worker/agent-1`).
    pub fn sign(&self, method: &str) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let claims = Claims {
            method,
            jti: uuid::Uuid::new_v4().simple().to_string(),
            aud: "api",
            iat: now,
            nbf: now,
            exp: now + TOKEN_LIFETIME_SECS,
        };
        jsonwebtoken::encode(&Header::new(Algorithm::HS512), &claims, &self.key)
            .expect("HS512 signing with an in-memory key cannot fail")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{decode, DecodingKey, Validation};

    #[derive(serde::Deserialize)]
    struct Decoded {
        method: String,
        jti: String,
        aud: String,
        iat: u64,
        nbf: u64,
        exp: u64,
    }

    #[test]
    fn token_carries_the_protocol_claims() {
        let secret = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let token = EdgeTokenSigner::new(secret).sign("jobs/fetch/agent-1");
        let mut validation = Validation::new(Algorithm::HS512);
        validation.set_audience(&["api"]);
        let data = decode::<Decoded>(&token, &DecodingKey::from_secret(secret), &validation)
            .expect("token verifies with the same secret");
        assert_eq!(data.header.alg, Algorithm::HS512);
        let c = data.claims;
        assert_eq!(c.method, "jobs/fetch/agent-1");
        assert_eq!(c.aud, "api");
        assert_eq!(c.iat, c.nbf);
        assert_eq!(c.exp - c.iat, TOKEN_LIFETIME_SECS);
        assert_eq!(c.jti.len(), 32);
    }

    #[test]
    fn each_token_has_a_fresh_jti_and_a_wrong_secret_fails() {
        let signer = EdgeTokenSigner::new(b"secret-one-secret-one-secret-one");
        let a = signer.sign("health");
        let b = signer.sign("health");
        assert_ne!(a, b);
        let mut validation = Validation::new(Algorithm::HS512);
        validation.set_audience(&["api"]);
        let wrong = decode::<Decoded>(
            &a,
            &DecodingKey::from_secret(b"another-secret-another-secret-xx"),
            &validation,
        );
        assert!(wrong.is_err());
    }

    #[test]
    fn debug_does_not_show_the_secret() {
        let signer = EdgeTokenSigner::new(b"do-not-print-me");
        assert!(!format!("{signer:?}").contains("do-not-print-me"));
    }
}
