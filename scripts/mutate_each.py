"""Mutation testing one module at a time, each of mutmut's mutants checked by a test command.

    python scripts/mutate_each.py --tests "tests/test_a.py tests/test_b.py" [--lines 1-140] [--results F]
                                  [--recheck] MODULE

Why not ``mutmut run``: mutmut 2.5.1 crashes part-way through modules with multi-line expressions (its cache
keys a mutant by the source line, and a mutant inside a statement spanning lines finds no line: "Attribute
Mutant.line is required"), leaving the rest untested. This takes the very same mutants (mutmut's own
generator, numbered in its order) and needs no cache: for each, write the mutated module, run
``python -m pytest -x -q -p no:cacheprovider TESTS`` (non-zero exit: killed; past --timeout: timed out),
restore the original. Results go to a JSON file (default ``.mutants-MODULE.json``) so that an interrupted
run resumes where it stopped; survivors are printed as diffs with the score.

Edits MODULE in place while it runs (restored on exit, also on Ctrl-C / SIGTERM): run it in a copy of the
tree if you keep working. The tests must import this tree's files (the script puts the tree first on
PYTHONPATH).
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def mutants_of(path: Path) -> list:
    """mutmut's mutants of the file, in mutmut's order (its RelativeMutationID: line text, index, line number)."""
    from mutmut import ALL, Context, list_mutations
    return list_mutations(Context(source=path.read_text(), mutation_id=ALL, filename=str(path)))


def mutated_source(path: Path, original: str, mutant) -> str:
    from mutmut import Context, mutate
    return mutate(Context(source=original, mutation_id=mutant, filename=str(path)))[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("module")
    ap.add_argument("--tests", required=True, help="test files (space-separated) that should kill the mutants")
    ap.add_argument("--lines", default=None, help="only mutants on these lines, e.g. 140-250")
    ap.add_argument("--results", default=None, help="JSON file of results (resumed when present)")
    ap.add_argument("--recheck", action="store_true", help="test the survivors of an earlier run again")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per mutant (default: 5x the unmutated run + 10)")
    args = ap.parse_args(argv)

    root = Path(__file__).resolve().parents[1]
    os.chdir(root)
    path = Path(args.module)
    original = path.read_text()
    results_path = Path(args.results or f".mutants-{str(path).replace('/', '.')}.json")
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    if args.recheck:
        results = {k: v for k, v in results.items() if v["status"] != "survived"}
    env = dict(os.environ, PYTHONPATH=str(root) + (os.pathsep + os.environ["PYTHONPATH"]
                                                   if os.environ.get("PYTHONPATH") else ""))
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *args.tests.split()]

    def restore(*_):
        path.write_text(original)
        if _:
            sys.exit(130)
    signal.signal(signal.SIGTERM, restore)
    signal.signal(signal.SIGINT, restore)

    start = time.monotonic()
    if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        print("the tests fail without mutations: nothing to measure", file=sys.stderr)
        return 2
    timeout = args.timeout or 5 * (time.monotonic() - start) + 10
    lo, hi = (int(x) for x in args.lines.split("-")) if args.lines else (1, 10 ** 9)

    mutants = mutants_of(path)
    try:
        for number, mutant in enumerate(mutants, 1):
            key = str(number)
            if not lo <= mutant.line_number + 1 <= hi or key in results:
                continue
            text = mutated_source(path, original, mutant)
            diff = "".join(l for l in difflib.unified_diff(original.splitlines(True), text.splitlines(True), n=0)
                           if l[:1] in "+-" and not l.startswith(("+++", "---")))
            path.write_text(text)
            try:
                rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    timeout=timeout).returncode
                status = "killed" if rc != 0 else "survived"
            except subprocess.TimeoutExpired:
                status = "timeout"
            finally:
                path.write_text(original)
            results[key] = {"line": mutant.line_number + 1, "status": status, "diff": diff}
            results_path.write_text(json.dumps(results, indent=1))
            print(f"{number}/{len(mutants)} line {mutant.line_number + 1}: {status}", flush=True)
    finally:
        path.write_text(original)

    mine = {k: v for k, v in results.items() if lo <= v["line"] <= hi}
    counts = {s: sum(1 for v in mine.values() if v["status"] == s) for s in ("killed", "timeout", "survived")}
    for k, v in sorted(mine.items(), key=lambda kv: int(kv[0])):
        if v["status"] == "survived":
            print(f"--- survived: mutant {k}, line {v['line']}\n{v['diff']}")
    print(f"{path}: {len(mutants)} mutants, {len(mine)} checked, {counts['killed']} killed, "
          f"{counts['timeout']} timed out, {counts['survived']} survived")
    return 0


if __name__ == "__main__":
    sys.exit(main())
