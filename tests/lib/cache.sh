# Sourced by the test scripts: one cache folder for everything slow to rebuild
# (Python venvs, the helm binary, Go modules, the cargo target), keyed by version
# inside. Deleting it only makes the next run slower.
ASTRO_CACHE_DIR="${ASTRO_CACHE_DIR:-$HOME/.cache/astro-agent}"
mkdir -p "$ASTRO_CACHE_DIR"
export ASTRO_CACHE_DIR

