"""Out-of-core benchmark: `memlens ati` and `memlens outliers` on a big recorded-shape trace, both engines.

The trace has the shape of a memlens recording of a training loop: parameters and optimizer state alive for
the whole run; every step a forward pass (each op reads its input activation, a parameter and sometimes an
earlier activation, and writes a new activation; a third of activations are saved for backward, the rest
are temporaries freed after their consumer), a backward pass in reverse (reads the saved activation, the
incoming gradient and the parameter, writes a gradient; parameter gradients live until the optimizer) and an
optimizer step (reads each gradient and both state tensors, writes the parameter and the state). Op times
are jittered per step. It is generated step by step and written with `PartitionedTraceWriter`, so generating
100M accesses needs no more memory than 20M.

Each (engine, analysis) runs as its own `memlens` process; time is wall-clock, peak RSS that process's own
high-water mark (``VmHWM`` from /proc, written by the child as it exits: ``wait4``'s ``ru_maxrss`` would also
count this benchmark process, which forked it). The two engines' JSON answers are compared field by field.

    .venv/bin/python benchmarks/out_of_core.py --accesses 20000000          # both engines
    .venv/bin/python benchmarks/out_of_core.py --accesses 100000000 --engines dask
    .venv/bin/python benchmarks/out_of_core.py --sweep 2M,5M,10M,20M        # peak RSS against trace length
    .venv/bin/python benchmarks/out_of_core.py --accesses 5M --analyses report   # the HTML report, both engines

``--sweep`` generates one trace per length and runs every (analysis, engine) on each; the in-memory engine
is skipped where its estimated need (`outofcore.choose.memory_needed`) exceeds ``--memory-cap``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

OP_NAMES = np.array(["aten::mm", "aten::addmm", "aten::gelu", "aten::add", "aten::mul", "aten::layer_norm",
                     "aten::softmax", "aten::bmm", "aten::dropout", "aten::copy_"], dtype=object)


class StepTemplate:
    """One training step: its ops, the accesses they make and the step-local blocks they allocate/free.

    Block references: >= 0 a persistent block id (parameter or optimizer state), < 0 step-local block
    ``-1 - k``. Times are op indices here; `StepTemplate.materialise` turns them into ns.
    """

    def __init__(self, layers: int, ops_per_layer: int, params_per_layer: int, rng):
        self.n_params = layers * params_per_layer
        self.n_persistent = 3 * self.n_params  # parameter + two optimizer states each
        acc_op, acc_ref, acc_w = [], [], []
        alloc_op, free_op, size, category, module = [], [], [], [], []
        op_module = []

        def new_local(op, nbytes, cat, mod) -> int:
            alloc_op.append(op)
            free_op.append(-1)
            size.append(int(nbytes))
            category.append(cat)
            module.append(mod)
            return -len(alloc_op)  # -1 - k

        def access(op, ref, write=False):
            acc_op.append(op)
            acc_ref.append(ref)
            acc_w.append(write)

        op = 0
        fwd = []  # (op, out ref, saved?, layer, param)
        prev = None
        pending_free = None
        for layer in range(layers):
            mod = f"model.layers.{layer}"
            for j in range(ops_per_layer):
                param = layer * params_per_layer + int(rng.integers(params_per_layer))
                out = new_local(op, np.exp(rng.uniform(np.log(64 << 10), np.log(32 << 20))), "activation", mod)
                if prev is not None:
                    access(op, prev)
                access(op, param)
                if fwd and rng.random() < 0.3:
                    access(op, fwd[int(rng.integers(max(0, len(fwd) - 8), len(fwd)))][1])
                access(op, out, True)
                if pending_free is not None:  # the temporary consumed by this op dies after it
                    free_op[-1 - pending_free] = op
                saved = rng.random() < 0.35
                pending_free = None if saved else out
                fwd.append((op, out, saved, layer, param))
                op_module.append(mod)
                prev = out
                op += 1
        if pending_free is not None:
            free_op[-1 - pending_free] = op - 1
        grad_in = None
        param_grads: dict[int, int] = {}
        for f_op, out, saved, layer, param in reversed(fwd):
            mod = f"model.layers.{layer}"
            g = new_local(op, size[-1 - out], "gradient", mod)
            if grad_in is not None:
                access(op, grad_in)
            if saved:
                access(op, out)
                free_op[-1 - out] = op
            access(op, param)
            access(op, g, True)
            if param not in param_grads:
                param_grads[param] = new_local(op, np.exp(rng.uniform(np.log(1 << 20), np.log(64 << 20))),
                                               "gradient", mod)
            access(op, param_grads[param], True)
            if grad_in is not None:
                free_op[-1 - grad_in] = op
            grad_in = g
            op_module.append(mod)
            op += 1
        free_op[-1 - grad_in] = op - 1
        for param, g in sorted(param_grads.items()):
            access(op, g)
            access(op, self.n_params + 2 * param)
            access(op, self.n_params + 2 * param + 1)
            access(op, param, True)
            access(op, self.n_params + 2 * param, True)
            access(op, self.n_params + 2 * param + 1, True)
            free_op[-1 - g] = op
            op_module.append("optimizer")
            op += 1
        self.n_ops = op
        self.acc_op = np.asarray(acc_op, dtype=np.int64)
        self.acc_ref = np.asarray(acc_ref, dtype=np.int64)
        self.acc_write = np.asarray(acc_w, dtype=bool)
        self.alloc_op = np.asarray(alloc_op, dtype=np.int64)
        self.free_op = np.asarray(free_op, dtype=np.int64)
        assert (self.free_op >= self.alloc_op).all()
        self.size = np.asarray(size, dtype=np.int64)
        self.category = np.asarray(category, dtype=object)
        self.module = np.asarray(module, dtype=object)
        self.op_module = np.asarray(op_module, dtype=object)
        self.op_name = OP_NAMES[rng.integers(0, len(OP_NAMES), self.n_ops)]
        self.duration = np.exp(rng.uniform(np.log(5e3), np.log(2e5), self.n_ops))  # 5 us .. 200 us
        # accesses in time order: by op, an op's reads before its writes as recorded
        order = np.argsort(self.acc_op, kind="stable")
        self.acc_op, self.acc_ref, self.acc_write = self.acc_op[order], self.acc_ref[order], self.acc_write[order]

    @property
    def accesses_per_step(self) -> int:
        return len(self.acc_op)

    def materialise(self, step: int, t0: int, local_base: int, op_base: int, seq_base: int, rng):
        """(blocks, accesses, ops frames, end time, events used) of step `step` starting at `t0` ns."""
        dur = np.maximum(self.duration * rng.lognormal(0.0, 0.1, self.n_ops), 1e3).astype(np.int64)
        gap = 1_000  # 1 us between ops: an alloc never shares a timestamp with the previous op's free
        start = t0 + np.concatenate([[0], np.cumsum(dur + gap)[:-1]])
        end = start + dur
        ref = self.acc_ref
        bid = np.where(ref >= 0, ref, local_base + (-1 - ref))
        acc = pd.DataFrame({"block_id": bid, "t_ns": start[self.acc_op], "op_id": op_base + self.acc_op,
                            "is_write": self.acc_write})
        n_local = len(self.size)
        a_t, f_t = start[self.alloc_op], end[self.free_op]
        # global event order: by time; a free at an op's end precedes the next op's allocs
        t = np.concatenate([a_t, f_t])
        kind = np.concatenate([np.ones(n_local), np.zeros(n_local)])
        order = np.lexsort((kind, t))
        rank = np.empty(2 * n_local, dtype=np.int64)
        rank[order] = np.arange(2 * n_local)
        blocks = pd.DataFrame({
            "block_id": local_base + np.arange(n_local), "device": "cuda:0", "size": self.size,
            "alloc_ns": a_t, "free_ns": f_t, "alloc_seq": seq_base + rank[:n_local],
            "free_seq": seq_base + rank[n_local:], "category": self.category, "op": self.op_name[self.alloc_op],
            "module": self.module, "source": "dispatch"})
        ops = pd.DataFrame({"op_id": op_base + np.arange(self.n_ops), "name": self.op_name, "start_ns": start,
                            "end_ns": end, "module": self.op_module, "iteration": step})
        return blocks, acc, ops, int(end[-1]) + gap, 2 * n_local


def generate(path: Path, accesses: int, *, layers: int = 24, ops_per_layer: int = 40, params_per_layer: int = 4,
             seed: int = 0, rows_per_group: int = 1 << 20) -> dict:
    """Write a trace of about `accesses` accesses (whole steps) to `path`; returns its facts."""
    from memlens.trace.partitioned import PartitionedTraceWriter
    rng = np.random.default_rng(seed)
    tpl = StepTemplate(layers, ops_per_layer, params_per_layer, rng)
    steps = max(1, math.ceil(accesses / tpl.accesses_per_step))
    n_p = tpl.n_params
    psize = np.exp(rng.uniform(np.log(1 << 20), np.log(64 << 20), n_p)).astype(np.int64)
    persistent = pd.DataFrame({
        "block_id": np.arange(3 * n_p), "device": "cuda:0",
        "size": np.concatenate([psize, np.repeat(psize, 2)]), "alloc_ns": np.arange(3 * n_p),
        "free_ns": pd.array([None] * (3 * n_p), dtype="Int64"), "alloc_seq": np.arange(3 * n_p),
        "free_seq": pd.array([None] * (3 * n_p), dtype="Int64"),
        "category": ["parameter"] * n_p + ["optimizer_state"] * (2 * n_p),
        "op": "aten::empty", "module": [f"model.layers.{i // params_per_layer}" for i in range(n_p)] +
        [f"model.layers.{(i // 2) // params_per_layer}" for i in range(2 * n_p)], "source": "dispatch"})
    t0, local_base, op_base, seq_base = 3 * n_p + 1_000, 3 * n_p, 0, 3 * n_p
    meta = {"source_kind": "memlens_record", "clock": {"kind": "host"},
            "notes": [f"synthetic recorded-shape trace: {steps} steps (benchmarks/out_of_core.py)"]}
    written = 0
    with PartitionedTraceWriter(path, meta, rows_per_group=rows_per_group, overwrite=True) as w:
        w.add("blocks", persistent)
        for step in range(steps):
            blocks, acc, ops, t0, n_ev = tpl.materialise(step, t0, local_base, op_base, seq_base, rng)
            w.add("blocks", blocks)
            w.add("accesses", acc)
            w.add("ops", ops)
            local_base += len(blocks)
            op_base += len(ops)
            seq_base += n_ev
            written += len(acc)
    return {"steps": steps, "accesses": written, "blocks": local_base, "ops": op_base,
            "accesses_per_step": tpl.accesses_per_step, "bytes_on_disk": _du(path)}


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).iterdir())


# The child runs the CLI and, as it exits (atexit runs on SystemExit too), writes its own VmHWM to a file.
_CHILD = """
import atexit, sys
def _hwm(path=sys.argv[1]):
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            open(path, 'w').write(str(int(line.split()[1]) * 1024))
atexit.register(_hwm)
from memlens.cli import main
sys.exit(main(sys.argv[2:]))
"""


def run_cli(args: list[str]) -> tuple[float, int, str, int]:
    """(seconds, peak RSS bytes of the child itself, stdout, exit code) of one `memlens` process."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile(suffix=".hwm") as hwm:
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, hwm.name, *args], stdout=out, stderr=err)
        proc.wait()
        seconds = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        text = out.read().decode()
        if proc.returncode:
            sys.stderr.write(err.read().decode()[-2000:])
        peak = Path(hwm.name).read_text().strip()
    return seconds, int(peak) if peak else -1, text, proc.returncode


# Sums of float products added bucket by bucket (another order than numpy's pairwise sum of the whole
# column), and WDOA, whose memory limit is such a sum: equal to float rounding, not bit for bit.
FLOAT_SUMS = ("std_ns", "wdoa_ns", "idle_bytes_ns", "swappable_bytes_ns", "swappable_share")


def compare(a, b, path="", rel=1e-9) -> list[str]:
    """Fields where two JSON answers differ: exactly, except the `FLOAT_SUMS` fields to `rel` relative."""
    diffs = []
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            diffs += compare(a.get(k), b.get(k), f"{path}.{k}", rel)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            diffs += compare(x, y, f"{path}[{i}]", rel)
    elif path.endswith(FLOAT_SUMS) and isinstance(a, float) and isinstance(b, float):
        if abs(a - b) > rel * max(abs(a), 1.0):
            diffs.append(path)
    elif a != b:
        diffs.append(path)
    return diffs


def _count(text: str) -> int:
    """'20M' / '500k' / '2000000' -> an int."""
    text = text.strip().lower()
    scale = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def _make(trace: Path, accesses: int, reuse: bool) -> None:
    if reuse and trace.exists():
        return
    start = time.perf_counter()
    facts = generate(trace, accesses)
    print(f"generated {facts['accesses']:,} accesses, {facts['blocks']:,} blocks, {facts['ops']:,} ops "
          f"({facts['steps']} steps) in {time.perf_counter() - start:.1f} s; "
          f"{facts['bytes_on_disk'] / 2**30:.2f} GiB on disk: {trace}", flush=True)


def measure(trace: Path, engines: list[str], analyses: list[str], workers: int, memory_cap: float,
            label: str = "") -> list[dict]:
    """Run every (analysis, engine) on `trace` in its own process; print and return one row per run."""
    from memlens.analysis.outofcore.choose import memory_needed
    from memlens.analysis.outofcore.files import TraceFiles
    rows = TraceFiles.open(trace).rows
    need = memory_needed(rows)["memory"]
    answers, out = {}, []
    for analysis in analyses:
        for engine in engines:
            if engine == "memory" and need > memory_cap:
                print(f"{label:>6} {analysis:<10} {engine:<7} skipped: needs ~{need / 2**30:.1f} GiB "
                      f"> --memory-cap {memory_cap / 2**30:.1f} GiB", flush=True)
                continue
            cmd = [analysis, str(trace), "--json", "--engine", engine]
            if analysis == "report":  # the page beside the trace; its sections' statuses are compared
                cmd += ["-o", str(Path(trace).with_name(f"{Path(trace).name}.{engine}.html"))]
            if engine == "dask":
                cmd += ["--workers", str(workers)]
            seconds, rss, text, rc = run_cli(cmd)
            print(f"{label:>6} {analysis:<10} {engine:<7} {seconds:8.1f} s {rss / 2**30:8.2f} GiB"
                  + ("" if rc == 0 else f"  (exit {rc})"), flush=True)
            out.append({"accesses": rows["accesses"], "blocks": rows["blocks"], "analysis": analysis,
                        "engine": engine, "seconds": seconds, "peak_rss_bytes": rss, "exit": rc})
            if rc == 0:
                doc = json.loads(text)
                answers[(analysis, engine)] = ({s["key"]: s["status"] for s in doc["sections"]}
                                               if analysis == "report" else doc)
        got = [answers.get((analysis, e)) for e in engines]
        if len(got) == 2 and None not in got:
            diffs = compare(*got)
            exact = compare(*got, rel=0.0)
            print(f"{label:>6} {analysis}: engines agree ({len(exact)} float sums to rounding: "
                  f"{sorted(set(x.rsplit('.', 1)[-1] for x in exact))})" if not diffs
                  else f"{label:>6} {analysis}: engines differ in {diffs[:10]}", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--accesses", type=_count, default=20_000_000, help="accesses to generate (issue: 100M)")
    p.add_argument("--sweep", default=None, help="comma-separated lengths (2M,5M,10M,20M): one trace each")
    p.add_argument("--trace", type=Path, default=None, help="where to write it (default: a temp directory); "
                   "with --sweep, the directory of the traces")
    p.add_argument("--reuse", action="store_true", help="reuse the trace(s) if they exist")
    p.add_argument("--engines", default="memory,dask")
    p.add_argument("--analyses", default="ati,outliers",
                   help="comma-separated: ati, outliers, info, report (the report's page is written beside the "
                        "trace; the engines' section statuses are compared)")
    p.add_argument("--workers", type=int, default=2, help="threads of the dask engine")
    p.add_argument("--memory-cap", type=float, default=12.0,
                   help="GiB: skip the in-memory engine where it would need more (default 12)")
    args = p.parse_args()
    engines, analyses = args.engines.split(","), args.analyses.split(",")
    cap = args.memory_cap * 2**30
    if args.sweep:
        where = args.trace or Path(tempfile.mkdtemp(prefix="memlens-ooc-sweep-"))
        where.mkdir(parents=True, exist_ok=True)
        results = []
        for n in [_count(x) for x in args.sweep.split(",")]:
            trace = where / f"{n}.memlens"
            _make(trace, n, args.reuse)
            results += measure(trace, engines, analyses, args.workers, cap, label=f"{n / 1e6:g}M")
        print("\naccesses,blocks,analysis,engine,seconds,peak_rss_gib")
        for r in results:
            print(f"{r['accesses']},{r['blocks']},{r['analysis']},{r['engine']},{r['seconds']:.1f},"
                  f"{r['peak_rss_bytes'] / 2**30:.3f}")
        return 0
    trace = args.trace or Path(tempfile.mkdtemp(prefix="memlens-ooc-bench-")) / "big.memlens"
    _make(trace, args.accesses, args.reuse)
    measure(trace, engines, analyses, args.workers, cap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
