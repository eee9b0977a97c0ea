#!/usr/bin/env bash
# Sets up a virtual environment in .venv with everything ninfer needs (compiler, converter,
# tests), then runs the main job on the embedded default model unless --no-demo is given.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${NINFER_VENV:-.venv}
demo=1
for arg in "$@"; do
  case "$arg" in
    --no-demo) demo=0 ;;
    *) echo "usage: scripts/setup.sh [--no-demo]" >&2; exit 2 ;;
  esac
done

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip >/dev/null
# torch first, pinned: only the Hugging Face oracle and the converter need it, and the pinned
# release resolves to the CPU build kept on the development and CI machines (no multi-GB CUDA
# download). Set NINFER_TORCH to choose another requirement.
"${pip[@]}" install "${NINFER_TORCH:-torch==2.13.0}"
"${pip[@]}" install -e ".[convert,test]"

# `ninfer compile --target dgx-spark` links AArch64 host code with Debian's cross compiler. Installed
# here when we can (root with apt-get, as on CI); elsewhere a note says what to install.
if ! command -v aarch64-linux-gnu-g++ >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++-aarch64-linux-gnu; } \
      >/dev/null || echo "warning: could not install g++-aarch64-linux-gnu (needed for --target dgx-spark)" >&2
  else
    echo "note: --target dgx-spark needs aarch64-linux-gnu-g++ (Debian: apt-get install g++-aarch64-linux-gnu)" >&2
  fi
fi

if [ "$demo" = 1 ]; then
  "$VENV/bin/python" -m ninfer_cli.demo
fi
