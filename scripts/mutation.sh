#!/usr/bin/env bash
# Mutation testing, run on demand (slow; not part of scripts/test.sh).
#   bash scripts/mutation.sh --spot   the known-mutant spot-check (scripts/mutants.py): each small plausible
#                                     bug of issue 18 must make its tests fail; prints the score
#   bash scripts/mutation.sh [MODULE...]  mutmut over the core input-handling modules (installs mutmut
#                                     into .venv if missing); prints mutmut's results
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
if [ "${1:-}" = "--spot" ]; then
  shift; exec "$PY" scripts/mutants.py "$@"
fi
modules=("$@")
if [ ${#modules[@]} -eq 0 ]; then
  modules=(memlens/io/safe_pickle.py memlens/io/gzipfile.py memlens/limits.py memlens/io/store.py
           memlens/units.py memlens/commands/options.py memlens/plan/validate.py)
fi
"$PY" -c "import mutmut" 2>/dev/null || "$PY" -m pip install -q "mutmut>=2.4,<3"
paths=$(IFS=,; echo "${modules[*]}")
"$PY" -m mutmut run --paths-to-mutate "$paths" \
  --runner "$PY -m pytest -x -q -p no:cacheprovider tests/test_hostile_input.py tests/test_hostile_store.py tests/test_hostile_cli.py tests/test_mutants.py" \
  || true  # mutmut exits non-zero when mutants survive; the results below say which
"$PY" -m mutmut results
