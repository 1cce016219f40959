"""Test PKI made with the openssl command line (the cluster stage; the KEDA stage's TLS checks).

A Kubernetes control plane needs a few certificate authorities (the cluster CA that signs the API
server's serving certificate, the front-proxy CA the aggregation layer authenticates with) and
key pairs (the service-account signing key). kubeadm makes the same set; these are made fresh
per run in the stage's temporary folder and never leave it.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key (PEM files)."""

    cert: Path
    key: Path

    def pem_cert(self) -> bytes:
        return self.cert.read_bytes()


def _openssl(*args: str, stdin: str | None = None) -> None:
    subprocess.run(["openssl", *args], check=True, input=stdin, text=True, capture_output=True)


def make_ca(folder: Path, name: str) -> KeyPair:
    """A self-signed CA valid for a day: ``folder/name.crt`` and ``folder/name.key``."""
    folder.mkdir(parents=True, exist_ok=True)
    pair = KeyPair(folder / f"{name}.crt", folder / f"{name}.key")
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", f"/CN={name}", "-keyout", str(pair.key), "-out", str(pair.cert),
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )
    return pair


def issue(
    ca: KeyPair,
    folder: Path,
    name: str,
    common_name: str,
    *,
    ips: tuple[str, ...] = (),
    dns: tuple[str, ...] = (),
    client: bool = False,
    organization: str | None = None,
) -> KeyPair:
    """A leaf certificate signed by ``ca``: a server certificate for ``ips``/``dns``, or a client
    certificate (``client=True``) whose CN and O are the user and group Kubernetes reads."""
    folder.mkdir(parents=True, exist_ok=True)
    pair = KeyPair(folder / f"{name}.crt", folder / f"{name}.key")
    csr = folder / f"{name}.csr"
    subject = f"/CN={common_name}" + (f"/O={organization}" if organization else "")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(pair.key), "-out", str(csr))
    extensions = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
    extensions.append("extendedKeyUsage=clientAuth" if client else "extendedKeyUsage=serverAuth")
    alt = [f"IP:{ip}" for ip in ips] + [f"DNS:{d}" for d in dns]
    if alt:
        extensions.append("subjectAltName=" + ",".join(alt))
    ext_file = folder / f"{name}.ext"
    ext_file.write_text("\n".join(extensions) + "\n")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key), "-CAcreateserial",
        "-days", "1", "-extfile", str(ext_file), "-out", str(pair.cert),
    )
    csr.unlink()
    ext_file.unlink()
    return pair


def make_rsa_key_pair(folder: Path, name: str) -> tuple[Path, Path]:
    """An RSA private key and its public key (the service-account token signing pair)."""
    folder.mkdir(parents=True, exist_ok=True)
    private, public = folder / f"{name}.key", folder / f"{name}.pub"
    _openssl("genrsa", "-out", str(private), "2048")
    _openssl("rsa", "-in", str(private), "-pubout", "-out", str(public))
    return private, public
