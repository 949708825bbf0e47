"""Mutation spot-check: apply small plausible bugs one at a time and check the named tests catch each.

Each mutant is (file, original text, mutated text, tests). The file is restored after every run, also on
Ctrl-C. Exit status 1 when a mutant survives (its tests still pass). Run: ``bash scripts/mutation.sh --spot``.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MUTANTS = [
    ("unpickler admits every builtins global", "memlens/io/safe_pickle.py",
     "        if (module, name) in _ALLOWED_GLOBALS:",
     "        if module == \"builtins\" or (module, name) in _ALLOWED_GLOBALS:",
     ["tests/test_mutants.py::test_no_builtin_callable_is_admitted"]),
    ("unpickler admits bytearray again", "memlens/io/safe_pickle.py",
     "(\"builtins\", \"complex\"),",
     "(\"builtins\", \"complex\"), (\"builtins\", \"bytearray\"),",
     ["tests/test_hostile_input.py::test_bytearray_global_is_refused"]),
    ("memo index may skip ahead", "memlens/io/safe_pickle.py",
     "                    if index > filled:",
     "                    if index > filled + (1 << 30):",
     ["tests/test_hostile_input.py::test_huge_long_binput_memo_index_is_refused",
      "tests/test_hostile_input.py::test_mutated_real_pickle_memo_index_is_refused"]),
    ("decompression limit off by a factor", "memlens/io/gzipfile.py",
     "                if total > limit:",
     "                if total > limit * 64:",
     ["tests/test_hostile_input.py::test_limit_variable_raises_the_limit"]),
    ("frames cap ignored by the interner", "memlens/io/snapshot_frames.py",
     "        if len(frames) > self.max_frames:",
     "        if len(frames) > self.max_frames * 1000:",
     ["tests/test_hostile_input.py::test_frames_limit_can_be_raised",
      "tests/test_hostile_input.py::test_frames_limit_holds_for_in_memory_snapshots"]),
    ("validator skips the next live buffer", "memlens/plan/_validate_kernel.py",
     "        if pos < count and offset[live[pos]] < o + size[b] and k < limit:",
     "        if False:",
     ["tests/test_mutants.py::test_validator_catches_an_overlap_only_the_next_live_buffer_shows"]),
    ("validator skips alignment", "memlens/plan/validate.py",
     "np.flatnonzero(offsets % problem.alignment != 0)",
     "np.flatnonzero(offsets < -1)",
     ["tests/test_mutants.py::test_validator_checks_alignment"]),
    ("'<' left raw in script JSON", "memlens/report/markup.py",
     "obj_json.replace(\"<\", \"\\\\u003c\")",
     "obj_json",
     ["tests/test_mutants.py::test_script_json_cannot_end_the_element"]),
    ("report shows the median as p90", "memlens/report/sections_access.py",
     "f\"{ns_text(st['p90_ns'])}, 99th",
     "f\"{ns_text(st['p50_ns'])}, 99th",
     ["tests/test_mutants.py::test_report_ati_percentiles_are_the_real_ones"]),
    ("negative sizes accepted", "memlens/io/store.py",
     "            if (values < 0).any():",
     "            if (values < -(1 << 40)).any():",
     ["tests/test_hostile_store.py::test_snapshot_values_out_of_range"]),
    ("checksum before the size check", "memlens/io/store.py",
     "        check_table_file(fpath, info, mpath, verify_checksums)\n",
     "",
     ["tests/test_hostile_store.py::test_sparse_terabyte_table_is_refused_without_hashing",
      "tests/test_hostile_store.py::test_load_trace_checks_sizes_before_hashing"]),
    ("bool accepted as schema version", "memlens/io/store.py",
     "    if isinstance(version, bool) or not isinstance(version, int)",
     "    if not isinstance(version, int)",
     ["tests/test_hostile_store.py::test_schema_version_of_the_wrong_type",
      "tests/test_hostile_store.py::test_load_trace_refuses_a_boolean_schema_version"]),
    ("option sizes unbounded", "memlens/units.py",
     "    if value >= MAX_BYTES:\n        raise InputError(f\"size",
     "    if value >= MAX_BYTES * 1024:\n        raise InputError(f\"size",
     ["tests/test_hostile_cli.py::test_option_helpers_values"]),
]


def run(tests: list[str], timeout: float) -> int:
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return 124  # a hang counts as killed: the suite noticed


def main() -> int:
    survived = []
    for name, rel, old, new, tests in MUTANTS:
        path = ROOT / rel
        original = path.read_text()
        if original.count(old) != 1:
            print(f"STALE    {name}: the text to mutate is not in {rel} exactly once; update scripts/mutants.py")
            survived.append(name)
            continue
        # the tests must pass unmutated, or a "kill" would mean nothing
        if run(tests, 600) != 0:
            print(f"BROKEN   {name}: {' '.join(tests)} fail without the mutant")
            survived.append(name)
            continue
        t = time.perf_counter()
        try:
            path.write_text(original.replace(old, new))
            code = run(tests, 600)
        finally:
            path.write_text(original)
        status = "killed" if code != 0 else "SURVIVED"
        print(f"{status:8} {name} ({rel}; {time.perf_counter() - t:.0f} s)")
        if code == 0:
            survived.append(name)
    killed = len(MUTANTS) - len(survived)
    print(f"mutation score: {killed}/{len(MUTANTS)} killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
