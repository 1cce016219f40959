#!/usr/bin/env bash
# Usage: tests/e2e/venvs.sh tools|airflow
# Prints the path of the cached venv the end-to-end tests use. This is the one
# place that lists which requirement files go into which venv:
#   tools   - what the pytest suites import (pytest, requests, ...). Tests run in it.
#   airflow - the real Apache Airflow + Edge provider, used only to run the
#             Airflow daemons, the Python edge worker and task processes.
# Add a requirements file to a venv by appending it to the list below.
set -euo pipefail
tests="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${1:-}" in
  tools)   exec bash "$tests/lib/python-venv.sh" tools "$tests/requirements-tools.txt" "$tests/requirements-prometheus.txt" "$tests/requirements-cluster.txt" "$tests/requirements-ui.txt" ;;
  airflow) exec bash "$tests/lib/python-venv.sh" airflow "$tests/requirements-airflow.txt" ;;
  *) echo "usage: $0 tools|airflow" >&2; exit 2 ;;
esac
