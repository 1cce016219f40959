//! Certificates for tests, made with the openssl CLI: a CA of its own for each test, and
//! server certificates for 127.0.0.1 or client certificates signed by it. EC P-256, valid for
//! two days.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A certificate (PEM) and its private key (PEM).
pub struct KeyPair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A CA: its certificate and key under `dir`, named after it.
pub struct TestCa {
    pub name: String,
    pub pair: KeyPair,
    dir: PathBuf,
}

/// What a certificate is for.
pub enum Usage {
    /// A server at 127.0.0.1.
    Server,
    /// A client (TLS client authentication).
    Client,
}

impl TestCa {
    pub fn new(dir: &Path, name: &str) -> Self {
        let pair = KeyPair {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        };
        // Self-signed: the request is the certificate.
        new_key_and_request(
            &pair.key,
            &pair.cert,
            name,
            &[
                "-x509",
                "-days",
                "2",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
        TestCa {
            name: name.to_string(),
            pair,
            dir: dir.to_path_buf(),
        }
    }

    /// A certificate named `name` for `usage`, signed by this CA.
    pub fn issue(&self, name: &str, usage: Usage) -> KeyPair {
        let path = |ext: &str| self.dir.join(format!("{}-{name}.{ext}", self.name));
        let pair = KeyPair {
            cert: path("crt"),
            key: path("key"),
        };
        let (csr, extensions) = (path("csr"), path("ext"));
        let purpose = match usage {
            Usage::Server => "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
            Usage::Client => "extendedKeyUsage=clientAuth\n",
        };
        std::fs::write(
            &extensions,
            format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n{purpose}"),
        )
        .unwrap();
        new_key_and_request(&pair.key, &csr, name, &[]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            &text(&csr),
            "-CA",
            &text(&self.pair.cert),
            "-CAkey",
            &text(&self.pair.key),
            "-CAcreateserial",
            "-out",
            &text(&pair.cert),
            "-days",
            "2",
            "-extfile",
            &text(&extensions),
        ]);
        pair
    }
}

/// A new P-256 key at `key` and a request (or, with `-x509` in `extra`, a certificate) for
/// CN=`name` at `out`.
fn new_key_and_request(key: &Path, out: &Path, name: &str, extra: &[&str]) {
    let (key, out, subject) = (text(key), text(out), format!("/CN={name}"));
    let mut args = vec![
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        &key,
        "-out",
        &out,
        "-subj",
        &subject,
    ];
    args.extend_from_slice(extra);
    openssl(&args);
}

fn text(path: &Path) -> String {
    path.to_str().expect("a UTF-8 path").to_string()
}

fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("the openssl CLI is needed to make test certificates (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
