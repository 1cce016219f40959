# Sourced from the repository root, after `set -euo pipefail`, by the scripts that run a Python
# driver on the test harness outside pytest (demo/run.sh, benchmarks/*/run.sh):
#
#   . tests/lib/prologue.sh [--airflow] [--with=TOOL]... CRATE...
#
# Installs the missing system packages (prerequisites.sh, plus each TOOL it knows), builds the
# workspace's release binaries (cargo_release_build) into the cached cargo target folder unless
# each CRATE's ASTRO_<CRATE>_BIN (astro-agent: ASTRO_AGENT_BIN) already names one, and exports
# those variables. Then gets the
# cached tools venv and leaves its interpreter in $python; with --airflow the airflow venv too,
# so that its one-time build happens here and not in the middle of a timed run. Last, puts
# tests/lib on PYTHONPATH: the drivers import the harness package from there (pytest.ini does
# the same for pytest).
. tests/lib/cache.sh
. tests/lib/cargo-target.sh

prologue() {
  local arg crate var airflow= tools=() crates=() build=
  for arg in "$@"; do
    case "$arg" in
      --airflow) airflow=1 ;;
      --with=*) tools+=("${arg#--with=}") ;;
      *) crates+=("$arg") ;;
    esac
  done
  bash tests/lib/prerequisites.sh "${tools[@]}"

  for crate in "${crates[@]}"; do
    var="$(tr a-z- A-Z_ <<<"$crate")_BIN"
    if [ -z "${!var:-}" ]; then
      build=1
      export "$var=$ASTRO_RELEASE_DIR/$crate"
    fi
  done
  if [ -n "$build" ]; then
    echo "==> cargo build --workspace --release" >&2
    cargo_release_build >&2
  fi
  for crate in "${crates[@]}"; do
    var="$(tr a-z- A-Z_ <<<"$crate")_BIN"
    [ -x "${!var}" ] || { echo "no $crate binary at ${!var}" >&2; exit 1; }
  done

  echo "==> Python venvs (cached)" >&2
  python="$(bash tests/lib/venvs.sh tools)/bin/python"
  [ -z "$airflow" ] || bash tests/lib/venvs.sh airflow >/dev/null
  export PYTHONPATH="$PWD/tests/lib${PYTHONPATH:+:$PYTHONPATH}"
}
prologue "$@"
unset -f prologue
