#!/usr/bin/env bash
# Installs the system packages the tests need when they are missing (Debian; run as root).
# Everything else (Python venvs, helm, Go modules) is fetched by the stage that needs it.
set -euo pipefail
missing=()
command -v cargo >/dev/null || { echo "cargo is required (https://rustup.rs)" >&2; exit 1; }
command -v go >/dev/null || missing+=(golang-go)
command -v python3 >/dev/null || missing+=(python3 python3-venv)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v curl >/dev/null || missing+=(curl)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  if [ "$(id -u)" -ne 0 ]; then
    echo "not root: install these Debian packages first: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
