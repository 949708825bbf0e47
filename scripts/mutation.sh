#!/usr/bin/env bash
# Mutation testing, run on demand (slow; not part of scripts/test.sh).
#   bash scripts/mutation.sh --spot   the known-mutant spot-check (scripts/mutants.py): each small plausible
#                                     bug of the hostile-input round must make its tests fail; prints the score
#   bash scripts/mutation.sh [--tests "TEST..."] [--patch DIFF] [MODULE...]  mutmut over MODULEs (default: the core
#                                     input-handling modules), each mutant checked by TESTs (default: the
#                                     hostile-input suites); installs mutmut into .venv if missing; prints
#                                     mutmut's results. --patch DIFF: only the lines that unified diff adds
#                                     (a scope: e.g. the functions under test). mutmut edits the files in
#                                     place while it runs: run it in a copy of the tree if you keep working.
#                                     Ends with the score per module (killed / timed out / survived /
#                                     other, from mutmut's cache).
#   bash scripts/mutation.sh --each --tests "TEST..." MODULE...   the same mutants, one module at a time,
#                                     by scripts/mutate_each.py (no cache: mutmut 2.5.1 crashes part-way
#                                     through modules with multi-line expressions); resumable; prints the
#                                     survivors' diffs and the score of each module
set -euo pipefail
cd "$(dirname "$0")/.."
# the tests must import the mutated files of THIS tree, also in a worktree or a copy whose venv has
# another checkout installed
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
if [ "${1:-}" = "--spot" ]; then
  shift; exec "$PY" scripts/mutants.py "$@"
fi
tests="tests/unit/test_hostile_input.py tests/integration/test_hostile_store.py tests/unit/test_hostile_cli.py tests/unit/test_mutants.py"
extra=()
each=0
while [ $# -gt 0 ]; do
  case "$1" in
    --each) each=1; shift ;;
    --tests) tests="$2"; shift 2 ;;
    --patch) extra=(--use-patch-file "$2"); shift 2 ;;  # mutate only the lines a unified diff adds
    *) break ;;
  esac
done
modules=("$@")
if [ ${#modules[@]} -eq 0 ]; then
  modules=(memlens/io/safe_pickle.py memlens/io/gzipfile.py memlens/limits.py memlens/trace/read.py
           memlens/trace/tracedir.py memlens/trace/checks.py
           memlens/units.py memlens/commands/options.py memlens/plan/validate.py)
fi
"$PY" -c "import mutmut, whatthepatch" 2>/dev/null || "$PY" -m pip install -q "mutmut>=2.4,<3" whatthepatch
if [ "$each" = 1 ]; then
  for m in "${modules[@]}"; do "$PY" scripts/mutate_each.py --tests "$tests" "$m"; done
  exit 0
fi
paths=$(IFS=,; echo "${modules[*]}")
"$PY" -m mutmut run --paths-to-mutate "$paths" "${extra[@]}" \
  --runner "$PY -m pytest -x -q -p no:cacheprovider $tests" \
  || true  # mutmut exits non-zero when mutants survive; the results below say which
"$PY" -m mutmut results
"$PY" - <<'SCORE'
import sqlite3
rows = sqlite3.connect(".mutmut-cache").execute(
    "SELECT f.filename, m.status, COUNT(*) FROM Mutant m JOIN Line l ON m.line = l.id "
    "JOIN SourceFile f ON l.sourcefile = f.id GROUP BY f.filename, m.status").fetchall()
score = {}
for name, status, n in rows:
    score.setdefault(name, {})[status] = n
for name, by in sorted(score.items()):
    total = sum(by.values())
    killed = by.get("ok_killed", 0) + by.get("ok_suspicious", 0)   # suspicious: killed, but slowly
    print(f"{name}: {total} mutants, {killed} killed, {by.get('bad_timeout', 0)} timed out, "
          f"{by.get('bad_survived', 0)} survived, {total - killed - by.get('bad_timeout', 0) - by.get('bad_survived', 0)} "
          "other (untested / skipped)")
SCORE
