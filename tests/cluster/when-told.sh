#!/usr/bin/env bash
# Usage: tests/cluster/when-told.sh SIGNAL_FIFO [run.sh args]
# The cluster stage as tests/run.sh runs it, in the background from the run's start: builds
# what the stage needs (build.sh: the control plane, KEDA, Prometheus, prometheus-adapter; CPU
# the Rust stage shares), then waits until the line `go` arrives on SIGNAL_FIFO — the run
# writes it once the release binaries are built and the heavy stages are over — and runs the
# stage (run.sh). Any other line, or the FIFO closed, ends it without running the stage.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
fifo="$1"
shift
started=$SECONDS
bash "$here/build.sh" >/dev/null
echo "cluster builds done $((SECONDS - started)) s after the start"
told=
read -r told <"$fifo" || true
[ "$told" = go ] || { echo "not told to run the cluster stage (read '$told')" >&2; exit 1; }
echo "told to run $((SECONDS - started)) s after the start"
exec bash "$here/run.sh" "$@"
