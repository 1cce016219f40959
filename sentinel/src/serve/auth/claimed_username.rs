//! The username a JWT-shaped token *claims*, from its payload, unverified: `sub`, or the
//! namespace and service account under `kubernetes.io` (as every Kubernetes service-account
//! token carries them). Anyone can write any claim into a token, so this never decides
//! whether a token passes — only which review lane it waits in: a token that claims an allowed
//! identity is reviewed ahead of the flood of tokens that claim nothing or someone else.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::Deserialize;

/// The parts of a service-account token's payload that name its identity.
#[derive(Deserialize)]
struct Claims {
    sub: Option<String>,
    #[serde(rename = "kubernetes.io")]
    kubernetes: Option<KubernetesClaims>,
}

#[derive(Deserialize)]
struct KubernetesClaims {
    namespace: String,
    serviceaccount: ServiceAccount,
}

#[derive(Deserialize)]
struct ServiceAccount {
    name: String,
}

/// The claimed username of a JWT-shaped `token`; `None` when its payload names nobody.
pub fn claimed_username(token: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    let json = URL_SAFE_NO_PAD.decode(payload).ok()?;
    let claims: Claims = serde_json::from_slice(&json).ok()?;
    claims.sub.or_else(|| {
        let k = claims.kubernetes?;
        Some(format!(
            "system:serviceaccount:{}:{}",
            k.namespace, k.serviceaccount.name
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(payload: &str) -> String {
        format!(
            "eyJhbGciOiJSUzI1NiJ9.{}.c2ln",
            URL_SAFE_NO_PAD.encode(payload)
        )
    }

    #[test]
    fn sub_or_the_service_account_of_the_payload() {
        assert_eq!(
            claimed_username(&token(r#"{"sub":"system:serviceaccount:keda:op","iat":1}"#)),
            Some("system:serviceaccount:keda:op".into())
        );
        assert_eq!(
            claimed_username(&token(
                r#"{"kubernetes.io":{"namespace":"keda","serviceaccount":{"name":"op","uid":"u"}}}"#
            )),
            Some("system:serviceaccount:keda:op".into())
        );
        for names_nobody in [
            token(r#"{"iat":1}"#),
            token("not json"),
            token(r#"{"sub":7}"#),
            "a.%%%.c".into(),
            "a".into(),
        ] {
            assert_eq!(claimed_username(&names_nobody), None, "{names_nobody}");
        }
    }
}
