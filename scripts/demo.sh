#!/usr/bin/env bash
# Install memlens (with the notebook extras) into .venv and run the demo: records a small transformer
# training on CPU, saves the trace and writes an HTML report.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[notebook]"
.venv/bin/memlens demo -o memlens-demo "$@"
