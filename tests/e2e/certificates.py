"""Throw-away certificates for the TLS tests, made with the ``openssl`` command line tool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def ensure_openssl() -> str:
    found = shutil.which("openssl")
    if found:
        return found
    subprocess.run(["apt-get", "update"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "openssl"], check=True,
                   stdout=subprocess.DEVNULL)
    return shutil.which("openssl")


def make_certificates(folder: Path, ca_name: str = "astro-e2e-ca") -> tuple[Path, Path, Path]:
    """A CA called ``ca_name`` and a server certificate for 127.0.0.1 (and no other name) signed
    by it, valid two days; returns (CA certificate, server certificate, server key)."""
    openssl = ensure_openssl()
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = folder / "ca.key", folder / "ca.crt"
    key, csr, crt, ext = folder / "server.key", folder / "server.csr", folder / "server.crt", folder / "server.ext"

    def run(*args):
        subprocess.run([openssl, *args], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(ca_key), "-out", str(ca_crt), "-days", "2", "-subj", f"/CN={ca_name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    ext.write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                   "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(crt), "-days", "2", "-extfile", str(ext))
    return ca_crt, crt, key
