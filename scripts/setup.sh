#!/usr/bin/env bash
# Creates .venv (if missing) with the CPU build of torch first, then this package with its test,
# ray, report and docs extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# The CPU wheel of torch must come first: a bare `torch` requirement would pull a CUDA build.
.venv/bin/python -m pip install -q "torch==2.13.0"
# Hold torch at the installed build while resolving the rest, so nothing swaps it for a CUDA one.
torch_version=$(.venv/bin/python -c "import torch; print(torch.__version__)")
echo "torch==${torch_version}" > .venv/torch-constraint.txt
.venv/bin/python -m pip install -q -e ".[test,ray,report,docs]" -c .venv/torch-constraint.txt
