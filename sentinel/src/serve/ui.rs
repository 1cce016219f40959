//! The page at `/ui/`: three files compiled into the binary, so that it works offline, in a
//! `FROM scratch` image and behind `kubectl port-forward`, and always matches the API of the
//! binary that serves it.
//!
//! The page itself is served without auth: it holds no data. Its calls to `/v1` carry the
//! bearer token the user enters, and are checked like KEDA's.
//!
//! | path             | answer                                                    |
//! | ---------------- | --------------------------------------------------------- |
//! | `/ui`            | 308 to `/ui/`, so that the page's relative URLs resolve   |
//! | `/ui/`           | `index.html`                                              |
//! | `/ui/app.js`     | the script                                                |
//! | `/ui/duration.js`| how the page writes durations (the findings' rule)        |
//! | `/ui/app.css`    | the style sheet                                           |
//! | other `/ui/...`  | none here: the caller answers 404                         |
//!
//! Every file is sent with `Cache-Control: no-cache` and a strong `ETag` (a hash of its bytes):
//! the browser revalidates each time and gets a 304, so an upgraded Sentinel is never shown
//! with the previous version's script. The Content-Security-Policy allows nothing but this
//! origin's own script, style sheet and API.

use crate::serve::response::{whole, Body};
use bytes::Bytes;
use hyper::header::{
    HeaderValue, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, ETAG, LOCATION,
    REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use hyper::{Response, StatusCode};
use sha2::{Digest, Sha256};
use std::sync::OnceLock;

/// Only this origin's own files and API; no inline script or style, no frames, no forms
/// that post anywhere, no `<base>` that could redirect the relative URLs.
pub const CONTENT_SECURITY_POLICY_VALUE: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const ASSETS: [Asset; 4] = [
    Asset {
        name: "",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("../../ui/index.html"),
    },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../../ui/app.js"),
    },
    Asset {
        name: "duration.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../../ui/duration.js"),
    },
    Asset {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../../ui/app.css"),
    },
];

/// The answer for a path under `/ui`, or `None` when there is no such file.
/// `if_none_match` is the request's `If-None-Match` header.
pub fn answer(path: &str, if_none_match: Option<&[u8]>) -> Option<Response<Body>> {
    if path == "/ui" {
        let mut r = Response::new(whole(Bytes::new()));
        *r.status_mut() = StatusCode::PERMANENT_REDIRECT;
        r.headers_mut()
            .insert(LOCATION, HeaderValue::from_static("/ui/"));
        return Some(r);
    }
    let name = path.strip_prefix("/ui/")?;
    let (i, asset) = ASSETS.iter().enumerate().find(|(_, a)| a.name == name)?;
    let etag = &etags()[i];
    let unchanged = if_none_match.is_some_and(|v| matches_etag(v, etag.as_bytes()));
    let mut r = if unchanged {
        let mut r = Response::new(whole(Bytes::new()));
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        let mut r = Response::new(whole(Bytes::from_static(asset.body)));
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
        r
    };
    let h = r.headers_mut();
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        ETAG,
        HeaderValue::from_str(etag).expect("a quoted hex string is a valid header value"),
    );
    h.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY_VALUE),
    );
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // For browsers that predate CSP's frame-ancestors.
    h.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    Some(r)
}

/// One strong ETag per asset, in [`ASSETS`] order, computed once.
fn etags() -> &'static [String; 4] {
    static ETAGS: OnceLock<[String; 4]> = OnceLock::new();
    ETAGS.get_or_init(|| {
        ASSETS.each_ref().map(|a| {
            let hash = Sha256::digest(a.body);
            let hex: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
            format!("\"{hex}\"")
        })
    })
}

/// Whether an `If-None-Match` value (`*`, or a comma-separated list of possibly weak tags)
/// names `etag`. Weak comparison, as RFC 9110 asks for `If-None-Match`.
fn matches_etag(header: &[u8], etag: &[u8]) -> bool {
    header.split(|&b| b == b',').any(|candidate| {
        let candidate = candidate.trim_ascii();
        candidate == b"*" || candidate.strip_prefix(b"W/").unwrap_or(candidate) == etag
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(r: &'a Response<Body>, name: &str) -> &'a str {
        r.headers()
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header"))
            .to_str()
            .unwrap()
    }

    #[test]
    fn each_file_has_its_content_type_and_the_page_headers() {
        for (path, content_type, marker) in [
            ("/ui/", "text/html; charset=utf-8", "<!doctype html>"),
            (
                "/ui/app.js",
                "text/javascript; charset=utf-8",
                "\"use strict\"",
            ),
            ("/ui/app.css", "text/css; charset=utf-8", ".card"),
            (
                "/ui/duration.js",
                "text/javascript; charset=utf-8",
                "function humanDuration",
            ),
        ] {
            let r = answer(path, None).unwrap_or_else(|| panic!("{path} not served"));
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            assert_eq!(header(&r, "content-type"), content_type, "{path}");
            assert_eq!(header(&r, "cache-control"), "no-cache", "{path}");
            assert_eq!(header(&r, "x-content-type-options"), "nosniff");
            let csp = header(&r, "content-security-policy");
            assert!(csp.starts_with("default-src 'none';"), "{csp}");
            assert!(!csp.contains("unsafe"), "{csp}");
            assert!(!csp.contains("http"), "no other origin: {csp}");
            let body = std::str::from_utf8(
                ASSETS
                    .iter()
                    .find(|a| format!("/ui/{}", a.name) == path)
                    .unwrap()
                    .body,
            )
            .unwrap();
            assert!(body.contains(marker), "{path} lacks {marker}");
        }
    }

    #[test]
    fn the_page_loads_nothing_from_elsewhere_and_nothing_inline() {
        let html = std::str::from_utf8(ASSETS[0].body).unwrap();
        for forbidden in [
            "http://", "https://", "<style", "style=", "onclick", "<script>",
        ] {
            assert!(!html.contains(forbidden), "index.html contains {forbidden}");
        }
        let js = std::str::from_utf8(ASSETS[1].body).unwrap();
        assert!(
            !js.contains("innerHTML"),
            "the script builds the DOM, never parses HTML"
        );
    }

    #[test]
    fn unknown_paths_are_none_and_bare_ui_redirects() {
        for path in [
            "/ui/index.htm",
            "/ui/app.js/",
            "/ui//app.js",
            "/ui/../v1/workers",
            "/uix",
            "/",
        ] {
            assert!(answer(path, None).is_none(), "{path}");
        }
        let r = answer("/ui", None).unwrap();
        assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(header(&r, "location"), "/ui/");
    }

    #[test]
    fn a_known_etag_gets_304_without_a_body() {
        let first = answer("/ui/app.js", None).unwrap();
        let etag = header(&first, "etag").to_string();
        assert!(etag.starts_with('"') && etag.len() == 18, "{etag}");
        for sent in [
            etag.clone(),
            format!("W/{etag}"),
            format!("\"other\", {etag}"),
            "*".into(),
        ] {
            let r = answer("/ui/app.js", Some(sent.as_bytes())).unwrap();
            assert_eq!(r.status(), StatusCode::NOT_MODIFIED, "{sent}");
            assert_eq!(header(&r, "etag"), etag);
            assert!(r.headers().get("content-type").is_none());
        }
        let r = answer("/ui/app.js", Some(b"\"other\"")).unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        // Each file has its own tag.
        let css = answer("/ui/app.css", None).unwrap();
        assert_ne!(header(&css, "etag"), etag);
    }
}
