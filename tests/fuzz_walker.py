"""Fuzz target of the native snapshot-pickle parser (memlens/io/native/stream_walk.cpp, with its FrameTable)
against its Python twin.

Each case is a seed (a valid snapshot at pickle protocols 2 and 4, and the hostile files of
tests/hostile_pickles.py) mutated by byte flips, truncations, deletions, duplications, splices and inserted
opcodes. Both walkers read it; each must return a snapshot, hand the file to the general unpickler (None)
or refuse it with an `InputError`, never raise anything else, and both must decide the same way: the same
refusal message, or the same entry columns and the same stacks table.

    python tests/fuzz_walker.py --seconds 600 [--seed 1] [--out DIR]

prints the cases run and writes any failing input to DIR (default: a temporary folder). A hang shows as a
case that never ends: the last case is written to DIR/current.pickle before it runs. tests/unit/test_fuzz_walker.py
runs this for a few seconds; docs/limits.md gives a longer run's figures and the one under ASan + UBSan
(``MEMLENS_WALKER_SANITIZE=1``).
"""
from __future__ import annotations

import argparse
import os
import pickle
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hostile_pickles  # noqa: E402

OPCODES = [b"(", b"\x86", b"\x85", b"\x87", b"t", b"e", b"a", b"u", b"s", b"]", b"}", b")", b"N", b"\x94", b".",
           b"K\x07", b"J\xff\xff\xff\x7f", b"\x8a\x09" + b"\xff" * 9, b"h\x00", b"h\x03", b"j\x01\x00\x00\x00",
           b"j\xff\xff\xff\x7f", b"r\x00\x00\x00\x00", b"q\x05", b"\x8c\x06action", b"\x8c\x06frames",
           b"\x8c\x04name", b"\x8c\x04line", b"X\xff\xff\xff\x00", b"\x95" + b"\x00" * 8, b"\x1b[2J"]


def _snapshot() -> dict:
    frames = [{"name": "forward", "filename": "/home/u/model.py", "line": 7},
              {"name": "at::_ops::zeros_like::call(x)", "filename": "??", "line": 2**64 - 1}]
    other = [{"name": "backward", "filename": "/home/u/model.py", "line": 9}, "odd frame"]
    trace = [{"action": a, "addr": 4096 * (i // 2 + 1), "size": 1024 * (i // 2 + 1), "stream": 0,
              "time_us": 10 * i, "frames": frames if i % 3 else other, "compile_context": "N/A" if i % 2 else "c",
              "user_metadata": ""} for i, a in enumerate(["alloc", "free_completed"] * 5)]
    segments = [{"device": 0, "address": 1 << 20, "total_size": 2 << 20, "allocated_size": 1024, "stream": 0,
                 "segment_type": "large", "segment_pool_id": (0, 0), "frames": frames,
                 "blocks": [{"address": 1 << 20, "size": 1024, "state": "active_allocated", "frames": frames}]}]
    return {"segments": segments, "device_traces": [trace, trace[:3]]}


def seeds() -> list[bytes]:
    out = [pickle.dumps(_snapshot(), protocol=p) for p in (2, 4)]
    out += [build() for build in hostile_pickles.SEEDS.values()]
    return out


def mutate(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(1 if rng.random() < 0.7 else rng.randint(2, 4)):  # mostly one change: deeper cases
        if not buf:
            buf += rng.choice(pool)
        at = rng.randrange(len(buf))
        kind = rng.randrange(7)
        if kind == 0:
            buf[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            buf[at] = rng.randrange(256)
        elif kind == 2:
            del buf[at:]
        elif kind == 3:
            del buf[at:at + rng.randint(1, 16)]
        elif kind == 4:
            buf[at:at] = rng.choice(OPCODES) * rng.choice((1, 1, 2, 40))
        elif kind == 5:
            end = min(len(buf), at + rng.randint(1, 64))
            buf[at:at] = buf[at:end] * rng.randint(1, 3)
        else:
            other = rng.choice(pool)
            start = rng.randrange(len(other))
            buf[at:] = other[start:start + rng.randint(1, 256)] + buf[at:]
    return bytes(buf)


def outcome(data: bytes, walker: str):
    """("ok", digest) / ("fallback",) / ("refused", message) of one walker on `data`."""
    from memlens.errors import InputError
    from memlens.io.snapshot.frames import CompiledStackInterner, StackInterner
    from memlens.io.snapshot.stream import EntryColumns, stream_snapshot
    interner = CompiledStackInterner() if walker == "compiled" else StackInterner()
    saved = os.environ.get("MEMLENS_PICKLE_WALKER")
    os.environ["MEMLENS_PICKLE_WALKER"] = walker
    try:
        result = stream_snapshot(data, interner)
    except InputError as exc:
        return ("refused", exc.message)
    finally:
        if saved is None:
            os.environ.pop("MEMLENS_PICKLE_WALKER", None)
        else:
            os.environ["MEMLENS_PICKLE_WALKER"] = saved
    if result is None:
        return ("fallback",)
    columns = []
    traces = result.get("device_traces") if type(result) is dict else None
    for part in traces if type(traces) is list else []:
        if isinstance(part, EntryColumns):
            columns.append((tuple(bytes(part.ints[k]) for k in sorted(part.ints)), bytes(part.stack_id),
                            tuple(bytes(part.codes[k]) for k in sorted(part.codes)),
                            tuple(len(part.names[k]) for k in sorted(part.names))))
    stacks = interner.table()
    return ("ok", tuple(columns), tuple(stacks["name"]), tuple(stacks["filename"]), tuple(stacks["line"]))


def run(seconds: float, seed: int, out: Path, max_cases: int | None = None) -> tuple[int, list[str]]:
    """Fuzz for `seconds` (or `max_cases`); returns (cases run, failures)."""
    from memlens.io import native
    if not native.available():
        raise SystemExit("the compiled walker does not build here")
    rng = random.Random(seed)
    pool = seeds()
    out.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    cases = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (max_cases is None or cases < max_cases):
        base = rng.choice(pool[:2]) if rng.random() < 0.6 else rng.choice(pool)  # the valid seeds reach deepest
        data = mutate(rng, base, pool)
        (out / "current.pickle").write_bytes(data)
        try:
            compiled, python = outcome(data, "compiled"), outcome(data, "python")
            if compiled != python:
                raise AssertionError(f"walkers disagree: compiled {str(compiled)[:300]} python {str(python)[:300]}")
        except Exception as exc:  # anything but a snapshot, None or InputError is a finding
            name = out / f"failure-{len(failures)}.pickle"
            name.write_bytes(data)
            failures.append(f"{name}: {type(exc).__name__}: {str(exc)[:400]}")
        cases += 1
    return cases, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cases", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="memlens-fuzz-"))
    start = time.monotonic()
    cases, failures = run(args.seconds, args.seed, out, args.cases)
    took = time.monotonic() - start
    print(f"{cases} cases in {took:.1f} s ({cases / max(took, 1e-9):.0f}/s), {len(failures)} failures; inputs in {out}")
    for line in failures[:20]:
        print(line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
