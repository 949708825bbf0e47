#!/usr/bin/env bash
# Install memlens with its test dependencies into .venv and run the whole test suite.
# torch==2.13.0 is installed first and explicitly so that pip never pulls a multi-GB CUDA build here;
# where a torch is already importable in .venv it is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev]"
set +e
.venv/bin/python -m pytest -q "$@"
rc=$?
set -e
# pytest exit code 5 means "no tests collected": not a failure of the code under test
if [ "$rc" -eq 5 ]; then echo "no tests collected"; rc=0; fi
exit "$rc"
