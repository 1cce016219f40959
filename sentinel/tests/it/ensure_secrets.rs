//! `astro-sentinel ensure-secrets` as a process: invalid flags exit 2 with one line naming the
//! flag; an API server it cannot reach exits 1 saying which Secret it could not read. What it
//! writes is proven against the real kube-apiserver (tests/cluster/test_install.py and
//! test_external_push.py), its decisions by the unit tests of `secrets::certificates`.

use std::process::{Command, Stdio};
use test_kit::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_astro-sentinel");

/// Runs `ensure-secrets args` in a clean environment; returns (exit code, stderr).
fn ensure_secrets(args: &[&str]) -> (i32, String) {
    let mut c = Command::new(BIN);
    c.arg("ensure-secrets").args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("ASTRO_SENTINEL_") || k.starts_with("KUBERNETES_") {
            c.env_remove(k);
        }
    }
    let out = c.stdin(Stdio::null()).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_one_line_naming(stderr: &str, flag: &str) {
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(flag), "{flag} not named: {stderr}");
}

#[test]
fn invalid_flags_exit_2_with_one_line_naming_the_flag() {
    let (code, err) = ensure_secrets(&["--keda-token-secret", "t"]);
    assert_eq!(code, 2, "{err}");
    assert_one_line_naming(&err, "--namespace");

    let (code, err) = ensure_secrets(&["--namespace", "ns"]);
    assert_eq!(code, 2, "{err}");
    assert_one_line_naming(&err, "nothing to ensure");

    let (code, err) = ensure_secrets(&["--namespace", "ns", "--external-scaler-ca-secret", "ca"]);
    assert_eq!(code, 2, "{err}");
    assert_one_line_naming(&err, "--external-scaler-server-secret");

    // Outside a cluster, without a URL.
    let (code, err) = ensure_secrets(&["--namespace", "ns", "--keda-token-secret", "t"]);
    assert_eq!(code, 2, "{err}");
    assert_one_line_naming(&err, "--kubernetes-api-url");
}

#[test]
fn an_api_server_out_of_reach_exits_1_naming_the_secret() {
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = TempDir::new("ensure-secrets");
    let token = dir.file("token", "t");
    let url = format!("http://127.0.0.1:{port}");
    let (code, err) = ensure_secrets(&[
        "--namespace",
        "ns",
        "--keda-token-secret",
        "astro-keda-sentinel-token",
        "--kubernetes-api-url",
        &url,
        "--kubernetes-token-file",
        token.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("cannot read Secret ns/astro-keda-sentinel-token"),
        "{err}"
    );
}
