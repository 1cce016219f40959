#!/usr/bin/env bash
# Installs the system packages that are missing (Debian; run as root). Every caller needs
# cargo, Python 3 with venv and PostgreSQL; name extra tools as arguments: go, curl, wrk.
#   bash tests/lib/prerequisites.sh [go] [curl] [wrk]
# Everything else (Python venvs, helm, Go modules) is fetched by the stage that needs it.
set -euo pipefail
command -v cargo >/dev/null || { echo "cargo is required (https://rustup.rs)" >&2; exit 1; }
missing=()
command -v python3 >/dev/null || missing+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
for extra in "$@"; do
  case "$extra" in
    go) command -v go >/dev/null || missing+=(golang-go) ;;
    curl) command -v curl >/dev/null || missing+=(curl) ;;
    wrk) command -v wrk >/dev/null || missing+=(wrk) ;;
    *) echo "prerequisites.sh: unknown tool $extra" >&2; exit 2 ;;
  esac
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "not root: install these Debian packages first: ${missing[*]}" >&2
    exit 1
  fi
  echo "installing: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
