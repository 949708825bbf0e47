#!/usr/bin/env bash
# Install memlens (with the notebook extras) into .venv and run the demo: records a small transformer
# training on CPU, saves the trace and writes an HTML report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh notebook
.venv/bin/memlens demo -o memlens-demo "$@"
