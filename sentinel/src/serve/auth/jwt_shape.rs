//! Whether a bearer token is shaped like a JWT: three non-empty base64url segments (the JWS
//! compact serialisation), as every Kubernetes service-account token is. Anything else cannot
//! pass a TokenReview for a service account, so it is refused without asking the API server.

pub fn is_jwt_shaped(token: &str) -> bool {
    let base64url = |segment: &str| {
        !segment.is_empty()
            && segment
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    let mut segments = token.split('.');
    let three = [segments.next(), segments.next(), segments.next()];
    segments.next().is_none() && three.iter().all(|s| s.is_some_and(base64url))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_base64url_segments() {
        assert!(is_jwt_shaped(
            "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJrZWRhIn0.c2ln-_0"
        ));
        assert!(is_jwt_shaped("a.b.c"));
        for not_a_jwt in [
            "",
            "static-token",
            "a.b",
            "a.b.c.d",
            "a..c",
            ".b.c",
            "a.b.",
            "YQ==.Yg.Yw",
            "a.b+c.d",
            "a.b.c/d",
            "a.b.c d",
            "a.b.é",
        ] {
            assert!(!is_jwt_shaped(not_a_jwt), "{not_a_jwt:?}");
        }
    }
}
