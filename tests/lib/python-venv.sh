#!/usr/bin/env bash
# Usage: python-venv.sh NAME REQUIREMENTS_FILE...   (venvs.sh names the venvs; call that)
# Prints the path of a virtualenv that has exactly those requirements installed,
# building it once under the cache folder. The key covers the Python version and
# the requirement files' content, so editing a requirements file builds a new venv.
# A venv is only used once its completion marker exists: an interrupted build is
# thrown away and redone rather than trusted.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/cache.sh"

name="$1"; shift
python="${PYTHON:-python3}"
pyver="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
key="$( { echo "$pyver"; cat "$@"; } | sha256sum | cut -c1-12)"
venv="$ASTRO_CACHE_DIR/venv/$name-py$pyver-$key"

# One build at a time per venv: stages and scripts run side by side share the cache.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [ ! -f "$venv/.complete" ]; then
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  echo "building venv $name (py$pyver) ..." >&2
  "$python" -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check --upgrade pip >&2
  for req in "$@"; do
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2
  done
  touch "$venv/.complete"
fi
echo "$venv"
