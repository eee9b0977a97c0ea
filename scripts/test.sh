#!/usr/bin/env bash
# Runs the linter and the test suite (everything but GPU scripts) in the environment set up by
# scripts/setup.sh. Extra arguments go to pytest.
#
# The tests run in two processes (pytest-xdist: the CI machine has 2 cores), each test file whole
# in one of them so that a file's shared fixtures (a package built once for its tests) are built
# once. NINFER_TEST_WORKERS sets another number of processes; 0 runs everything in this one.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${NINFER_VENV:-.venv}
"$VENV/bin/ruff" check .
workers=(-n "${NINFER_TEST_WORKERS:-2}" --dist loadfile)
if ! "$VENV/bin/python" -c "import xdist" 2>/dev/null; then
  echo "note: pytest-xdist is not installed (scripts/setup.sh installs it); the tests run in one process" >&2
  workers=()
fi
"$VENV/bin/python" -m pytest -q "${workers[@]}" "$@"
