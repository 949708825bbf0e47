#!/usr/bin/env bash
# Mutation score of one module (or folder) from a seeded random sample of its mutants, with mutmut 3.
#   bash scripts/mutation_sample.sh MODULE_GLOB "TEST_FILE..." [SAMPLE] [SEED]   (env MUTANT_FILTER: a regex on
#   mutant names, e.g. "event_order", to score some functions of a module)
#   e.g. bash scripts/mutation_sample.sh memlens/analysis/ati_intervals.py \
#          "tests/unit/test_intervals_reference.py tests/unit/test_analysis_ati.py" 200 25
# Why a sample: mutmut 3 generates ~1,000 mutants for a 380-line numpy module, and each runs the property
# tests that cover its function; a seeded sample of 200 gives the score within about +-5 points (95%) in a
# fraction of the time. SAMPLE=all runs every mutant.
# mutmut 3 copies the tree into mutants/ and forks per mutant: it runs in a scratch copy of this checkout
# (git worktree under ${MUTATION_DIR:-/tmp}), with mutmut in its own venv (.venv-mutmut3) that sees .venv's
# packages, so scripts/mutation.sh's mutmut 2 in .venv is left alone. MEMLENS_HYPOTHESIS_EXAMPLES (default 20)
# caps the examples of every property test per mutant. Survivors are listed with their diffs at the end:
# judge each equivalent (no observable change: a dtype that numpy infers anyway, a faster branch's bound)
# or write the test that kills it.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: mutation_sample.sh MODULE_GLOB "TEST_FILE..." [SAMPLE] [SEED]}
tests=${2:?usage: mutation_sample.sh MODULE_GLOB "TEST_FILE..." [SAMPLE] [SEED]}
sample=${3:-200}
seed=${4:-25}
root=$(pwd)
[ -x .venv/bin/python ] || { echo "run scripts/install.sh dev first"; exit 2; }
if [ ! -x .venv-mutmut3/bin/python ]; then
  .venv/bin/python -m venv .venv-mutmut3
  site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  own=$(.venv-mutmut3/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$site" > "$own/memlens-venv.pth"
  .venv-mutmut3/bin/python -m pip install -q "mutmut>=3.8,<4"
fi
work="${MUTATION_DIR:-/tmp}/memlens-mutation-$$"
git worktree add -q --detach "$work" HEAD
trap 'git worktree remove --force "$work" >/dev/null 2>&1 || true' EXIT
# the working tree's uncommitted edits too: the score is of what is here
git diff HEAD | (cd "$work" && git apply --allow-empty 2>/dev/null || true)
for f in $(git ls-files --others --exclude-standard tests memlens); do mkdir -p "$work/$(dirname "$f")"; cp "$f" "$work/$f"; done
cd "$work"
{
  echo; echo "[tool.mutmut]"; echo 'source_paths = ["memlens"]'
  echo "only_mutate = [\"$target\"]"
  printf 'pytest_add_cli_args_test_selection = ['; for t in $tests; do printf '"%s", ' "$t"; done; echo ']'
  echo 'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]'
  echo 'also_copy = ["sample_traces", "scripts"]'
} >> pyproject.toml
export MEMLENS_HYPOTHESIS_EXAMPLES=${MEMLENS_HYPOTHESIS_EXAMPLES:-20} PYTHONPATH="$work"
mm="$root/.venv-mutmut3/bin/python -m mutmut"
# generate every mutant (a run of none), then sample their names
$mm run --max-children 2 __none__ >/dev/null 2>&1 || true
$mm results --all true 2>/dev/null | awk -F: '{gsub(/ /, "", $1); print $1}' > mutants.all
# MUTANT_FILTER (a grep -E regex on mutant names, e.g. "event_order"): only the mutants of those functions
if [ -n "${MUTANT_FILTER:-}" ]; then grep -E "$MUTANT_FILTER" mutants.all > mutants.only || true; mv mutants.only mutants.all; fi
if [ "$sample" = "all" ]; then cp mutants.all mutants.sample; else
  "$root/.venv/bin/python" -c "import random, sys; n = open('mutants.all').read().split(); random.seed($seed); \
print('\n'.join(random.sample(n, min($sample, len(n)))))" > mutants.sample; fi
$mm run --max-children 2 $(cat mutants.sample) >/dev/null 2>&1 || true
# exact names (a substring match would take mutant_1's line for mutant_10's too: unsampled, "not checked")
$mm results --all true 2>/dev/null | awk -F': ' 'NR == FNR {want[$1]; next}
  {name = $1; gsub(/ /, "", name); if (name in want) print name ": " $2}' mutants.sample - > mutants.result || true
echo "mutation sample of $target: $(wc -l < mutants.sample) of $(wc -l < mutants.all) mutants (seed $seed)"
awk -F': ' '{c[$2]++} END {for (k in c) print "  " k ": " c[k]}' mutants.result
killed=$(grep -c ": killed\|: timeout" mutants.result || true)
survived=$(grep -c ": survived" mutants.result || true)
echo "  score: $killed killed of $((killed + survived)) with tests ($(( 100 * killed / (killed + survived > 0 ? killed + survived : 1) ))%)"
for m in $(grep ": survived" mutants.result | awk -F: '{print $1}'); do echo "## $m"; $mm show "$m" 2>/dev/null | grep '^[-+] ' || true; done
