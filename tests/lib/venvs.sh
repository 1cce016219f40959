#!/usr/bin/env bash
# Usage: tests/lib/venvs.sh tools|airflow [REQUIREMENTS]|chart
# Prints the path of a cached venv the test stages, the demo and the benchmarks use. This is
# the one place that lists which requirement files go into which venv:
#   tools   - what the pytest suites and the Python drivers import (pytest, requests, ...).
#             Tests, the demo and the benchmarks run in it.
#   airflow - the real Apache Airflow + Edge provider, used only to run the Airflow daemons,
#             the Python edge worker and task processes. `airflow FILE` builds it from FILE
#             instead of tests/requirements-airflow.txt (the compatibility matrix's pairs,
#             tests/compat/airflow-*.txt).
#   chart   - what the Helm chart tests import; small, so the chart stage needs no more.
# Add a requirements file to a venv by appending it to the list below.
set -euo pipefail
tests="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${1:-}" in
  tools)   exec bash "$tests/lib/python-venv.sh" tools "$tests/requirements-tools.txt" "$tests/requirements-prometheus.txt" "$tests/requirements-cluster.txt" "$tests/requirements-ui.txt" ;;
  airflow) exec bash "$tests/lib/python-venv.sh" airflow "${2:-$tests/requirements-airflow.txt}" ;;
  chart)   exec bash "$tests/lib/python-venv.sh" chart "$tests/requirements-chart.txt" ;;
  *) echo "usage: $0 tools|airflow|chart" >&2; exit 2 ;;
esac
