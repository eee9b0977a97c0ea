#!/usr/bin/env bash
# Runs the linter and the test suite (everything but GPU scripts) in the environment set up by
# scripts/setup.sh. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${NINFER_VENV:-.venv}
"$VENV/bin/ruff" check .
"$VENV/bin/python" -m pytest -q "$@"
