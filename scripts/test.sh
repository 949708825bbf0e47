#!/usr/bin/env bash
# Install memlens with its test dependencies into .venv and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
set +e
.venv/bin/python -m pytest -q "$@"
rc=$?
set -e
# pytest exit code 5 means "no tests collected": not a failure of the code under test
if [ "$rc" -eq 5 ]; then echo "no tests collected"; rc=0; fi
exit "$rc"
