"""Recorder overhead: a small GPT training step and a small CNN training step on CPU, in one process

    plain                      no instrument
    python                     memlens.record(backend="python")   (TorchDispatchMode + profiler allocations)
    compiled                   memlens.record(backend="compiled") (C++ RecordFunction callback + memory hook)
    profiler                   torch.profiler.profile(profile_memory=True, record_shapes=True)

Each instrument wraps `--steps` steps; the time per step is measured inside it (the one-off cost of
building the trace / the profiler's post-processing is printed separately as close/build). Modes are
interleaved over `--reps` rounds, in a rotated order, and the median is taken. Two clocks: process CPU
time (the headline: other processes on a shared machine do not inflate it) and wall time. Prints
ratios to plain, the recorder's own memory per recorded access (trace.metadata["recorder_bytes"]),
and the recorded step length on the trace's clock over the plain step (1.0 = the recorder's own
time is not in the trace).

    .venv/bin/python benchmarks/recorder_overhead.py [--workload gpt|cnn|both] [--reps 7] [--steps 3]
        [--whole 1,5,50] [--whole-reps 5] [--quick] [--only whole|steps]

Whole block: what a user pays from entering the block to a usable result, for 1, 5 and 50
steps (`--whole`): wall and process CPU time of the whole block -- enter, the steps, exit, and then
`rec.trace` (memlens: the trace is built at exit) or `prof.key_averages()` (torch.profiler: the per-op
table a user prints after the block; its exit already parses the Kineto events) -- against the same steps
run plainly, with the per-step time inside the block beside it. Modes are interleaved, in a rotated
order, over `--whole-reps` rounds; medians. Also printed: the close (exit until the result is usable)
per recorded op and as a share of the plain steps' own time, and the first recording's close in the
process (cost facts are computed once per distinct op signature for the process, lazy imports run).
`--quick`: 3 rounds for the per-step table and the 1- and 5-step blocks, 2 for 50 steps (a few minutes
on a loaded 2-core machine).

Measured (torch 2.13 CPU, 1 thread, a 2-core machine shared with other jobs, load average 4.6-6.7; CPU-time
ratios, medians of 9 rounds x 3 per-step samples; three runs on 2026-11-26 after the compiled recorder's
module hooks moved to C++ and its callback was switched off inside recorded kernels; "run 1, run 2, run 3"):

    workload                       plain/step   python        compiled           torch.profiler     compiled/profiler
    GPT train (d128, 3 layers)     36-37 ms     1.49-1.50x    1.05, 1.08, 1.08x  1.07, 1.07, 1.10x  0.981, 1.003, 0.983
    CNN train (BN, SGD momentum)   13 ms        1.19-1.21x    1.06, 1.04, 1.02x  1.04, 1.05, 1.04x  1.025, 0.999, 0.987

(an earlier set of three runs at load 7: GPT 1.001, 0.969, 0.989; CNN 1.003, 0.980, 0.985). The compiled
recorder and the profiler are within the run-to-run noise (+-0.03x here) of each other: "below the
profiler" is not a clear result. What is left of the compiled recorder's cost is mostly RecordFunction
boxing the recorded ops' inputs and outputs, which the profiler (record_shapes) pays too.

Measured, whole block (`--only whole`, 9 rounds for 1 and 5 steps, 3 for 50; 2026-11-28 08:12-08:14 UTC, load
average 0.6-1.0, CPU-time ratios to the plain steps; the README's "What we measured" has the table and an A/B of
the latest close changes): GPT 1 / 5 / 50 steps: compiled 1.15x / 1.12x / 1.05x, profiler with key_averages()
10.69x / 10.30x / 11.51x (up to its exit 1.96x / 1.77x / 2.44x); close 7.0 / 2.4 / 1.8 us per recorded op (6.1 /
10.2 / 80.2 ms). CNN: compiled 1.30x / 1.11x / 1.03x, profiler 2.45x / 2.56x / 3.87x (exit only 1.29x / 1.27x /
2.41x); close 44.4 / 11.3 / 2.9 us per op (3.4 / 4.4 / 11.2 ms: a fixed ~2.5-3.4 ms that
`recorder_close_parts.py` splits into drain, build, allocator join and the three DataFrames). This machine's
speed moved by about a third between runs that morning: compare runs made in one sitting only. Before the close
moved to numpy columns (02:55 UTC, load 2.4-3.7): 1-step closes 20.7 ms (GPT) and 16.4 ms (CNN), blocks 1.69x
and 2.38x.

Held-out steps (`--workload heldout`: MLP + AdamW, LSTM LM, small ResNet, ViT-like; `heldout_steps.py`), never
used to tune the recorder: measured the same way on 2026-11-28, the README's "Held-out steps" has the table
(whole block 1.10-1.33x at one step except the MLP of ~7 us ops, 2.78x; always below the profiler's).

Recorder memory (records delta+varint coded, plus chunk slack and chunk lists, signature arena and index,
the live-block map, per-thread buffers), per recorded access: 3-step recordings 24.9 B (GPT) / 30.2 B
(CNN); 20 steps 18.7 B (GPT) / 18.0-18.2 B (CNN) (2026-11-26, after the flat live-block map, 128 B
first chunks and one-byte signature tags; before: 30.0 / 36.2 B and 19.7-19.9 / 21.0 B).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import memlens
from memlens.demo import make_cnn, make_transformer

from heldout_steps import HELDOUT

WORKLOADS = {
    # gpt: (vocab, d_model, heads, layers, seq, batch); cnn: (channels, batch)
    "gpt": (256, 128, 4, 3, 64, 8),
    "cnn": (16, 32),
}


def transformer_workload(cfg):
    vocab, d, heads, layers, seq, batch = cfg
    torch.manual_seed(0)
    model = make_transformer(vocab=vocab, d_model=d, n_heads=heads, n_layers=layers, seq_len=seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, vocab, (batch, seq + 1))

    def step():
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, step


def cnn_workload(cfg):
    """A CNN training step (conv-bn-relu-pool x2, linear head, cross entropy, SGD with momentum)."""
    channels, batch = cfg
    torch.manual_seed(0)
    model = make_cnn(channels=channels).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, step


def workload(name: str):
    """(model, step, title) of a step by name: "gpt" and "cnn" (the tuned two, `WORKLOADS`) or a held-out one
    (`heldout_steps.HELDOUT`)."""
    if name in HELDOUT:
        model, step = HELDOUT[name][0]()
        return model, step, f"held out: {HELDOUT[name][1]}"
    cfg = WORKLOADS[name]
    if name == "gpt":
        model, step = transformer_workload(cfg)
        return model, step, f"GPT training step (vocab, d, heads, layers, seq, batch = {cfg}, AdamW)"
    model, step = cnn_workload(cfg)
    return model, step, f"CNN training step (channels, batch = {cfg}, BatchNorm, SGD momentum)"


def _instrument(mode, model):
    if mode == "plain":
        return None
    if mode in ("python", "compiled"):
        return memlens.record(model, backend=mode)
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                  record_shapes=True)


def measure(mode, model, step, steps):
    """([CPU s of each step], [wall s of each step], wall s to close the instrument, trace facts or None)."""
    inst = _instrument(mode, model)
    if inst is not None:
        inst.__enter__()
    cpu, wall = [], []
    for _ in range(steps):
        c0, t0 = time.process_time(), time.perf_counter()
        step()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    t1 = time.perf_counter()
    if inst is not None:
        inst.__exit__(None, None, None)
    t2 = time.perf_counter()
    facts = None
    if mode in ("python", "compiled") and inst.trace is not None:
        tr = inst.trace
        facts = {"ops": len(tr.ops), "accesses": len(tr.accesses), "recorder_bytes": tr.metadata["recorder_bytes"],
                 "recorded_step_ns": tr.metadata["recording_ns"] / steps, "steady_step_ns": steady_step_ns(tr, steps),
                 "backend": tr.metadata["recorder"],
                 "own_ns": tr.metadata.get("recorder_own_ns") or 0}
    return cpu, wall, t2 - t1, facts


def steady_step_ns(trace, steps):
    """One step on the trace's clock without the recording's edges (ns): from the first op of the second step to
    the first op of the last, over the steps between (steps split by the optimizer's iterations when the trace
    has them, else into equal op counts); None for fewer than 3 steps. The enter and exit of a recording put
    some of their own time between its start and its first op, which `recording_ns / steps` spreads over the
    steps: this figure is what an interval inside a step sees."""
    ops = trace.ops
    if steps < 3 or len(ops) < steps:
        return None
    starts = ops["start_ns"].to_numpy()
    if trace.metadata.get("iteration_source") == "optimizer.step" and ops["iteration"].notna().all():
        firsts = ops.groupby("iteration")["start_ns"].min().to_numpy()
        if len(firsts) >= steps:
            return (firsts[steps - 1] - firsts[1]) / (steps - 2)
    n = len(ops) // steps
    return (starts[(steps - 1) * n] - starts[n]) / (steps - 2)


def memory_per_access(model, step, steps):
    """The compiled recorder's memory (trace.metadata["recorder_bytes"]: its peak, coded records plus
    chunk slack, signature table and block maps) over a `steps`-step recording, per recorded access."""
    with memlens.record(model, backend="compiled") as rec:
        for _ in range(steps):
            step()
    md = rec.trace.metadata
    return md["recorder_bytes"], len(rec.trace.accesses), len(rec.trace.ops)


MODES = ["plain", "python", "compiled", "profiler"]


def bench(name, model, step, reps, steps):
    for _ in range(2):
        step()          # warm-up: lazy init, optimizer state
    memlens.record(model, backend="compiled").__enter__().__exit__(None, None, None)   # build/load once
    cpu = {m: [] for m in MODES}
    wall = {m: [] for m in MODES}
    close = {m: [] for m in MODES}
    facts = {m: [] for m in MODES}
    for r in range(reps):
        for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
            t_cpu, t_wall, t_close, f = measure(mode, model, step, steps)
            cpu[mode].extend(t_cpu)
            wall[mode].extend(t_wall)
            close[mode].append(t_close)
            if f:
                facts[mode].append(f)
    base_cpu, base_wall = statistics.median(cpu["plain"]), statistics.median(wall["plain"])
    base_q1 = _quantile(cpu["plain"], 0.25)
    print(f"\n{name}: plain step {base_cpu * 1e3:.2f} ms CPU, {base_wall * 1e3:.2f} ms wall "
          f"(medians of {reps} rounds x {steps} steps, each step timed; load average {os.getloadavg()[0]:.1f})")
    ratios = {}
    for mode in MODES:
        c, w = statistics.median(cpu[mode]), statistics.median(wall[mode])
        ratios[mode] = c / base_cpu
        print(f"  {mode:10s} {c * 1e3:9.2f} ms/step CPU  ratio {c / base_cpu:5.2f}x  (lower quartile "
              f"{_quantile(cpu[mode], 0.25) / base_q1:5.2f}x)   wall ratio {w / base_wall:5.2f}x   "
              f"close/build {statistics.median(close[mode]) * 1e3:8.1f} ms")
    if ratios["compiled"] < ratios["profiler"]:
        print(f"  compiled recorder / torch.profiler: {ratios['compiled'] / ratios['profiler']:.3f} (below the profiler)")
    else:
        print(f"  compiled recorder / torch.profiler: {ratios['compiled'] / ratios['profiler']:.3f} (NOT below the profiler)")
    for mode in ("python", "compiled"):
        if not facts[mode]:
            continue
        f = facts[mode][-1]
        per_acc = f["recorder_bytes"] / max(f["accesses"], 1)
        clock = statistics.median(x["recorded_step_ns"] for x in facts[mode]) / 1e9 / base_wall
        steady = [x["steady_step_ns"] for x in facts[mode] if x["steady_step_ns"] is not None]
        steady = f"{statistics.median(steady) / 1e9 / base_wall:.2f}x" if steady else "n/a (fewer than 3 steps)"
        added = 1e6 * (statistics.median(cpu[mode]) - base_cpu) * steps / max(f["ops"], 1)
        own = statistics.median(x["own_ns"] / max(x["ops"], 1) for x in facts[mode])
        print(f"  {mode} ({f['backend']}): {f['ops'] / steps:.0f} ops/step, {f['accesses']} accesses, "
              f"recorder memory {f['recorder_bytes'] / 1024:.1f} KiB = {per_acc:.1f} B/access; "
              f"{added:.2f} us CPU added per op ({own / 1e3:.2f} us of it measured inside the recorder); "
              f"recorded step on the trace clock / plain wall step {clock:.2f}x (without the recording's edges "
              f"{steady})")
    for n in (20,):
        rb, na, no = memory_per_access(model, step, n)
        print(f"  compiled recorder memory over {n} steps: {rb / 1024:.1f} KiB for {na} accesses ({no} ops) = "
              f"{rb / max(na, 1):.1f} B per recorded access")
    return ratios


WHOLE_MODES = ["plain", "compiled", "profiler"]


def whole_block(mode, model, step, steps):
    """(wall s, CPU s of the whole block; wall s, CPU s of its close; [wall s of each step inside];
    recorded ops; wall s, CPU s of the block up to the end of the exit) for `steps` steps under `mode`.
    The close is the exit plus, for the profiler, its key_averages(); memlens builds the trace at exit
    (rec.trace is then usable)."""
    c0, t0 = time.process_time(), time.perf_counter()
    if mode == "compiled":
        inst = memlens.record(model, backend="compiled")
    elif mode == "profiler":
        inst = _instrument("profiler", model)
    else:
        inst = None
    if inst is not None:
        inst.__enter__()
    inside = []
    for _ in range(steps):
        s0 = time.perf_counter()
        step()
        inside.append(time.perf_counter() - s0)
    c1, t1 = time.process_time(), time.perf_counter()
    n_ops = 0
    c_exit, t_exit = c1, t1
    if inst is not None:
        inst.__exit__(None, None, None)
        c_exit, t_exit = time.process_time(), time.perf_counter()
        if mode == "profiler":
            n_ops = sum(e.count for e in inst.key_averages())
        else:
            n_ops = len(inst.trace.ops)
    c2, t2 = time.process_time(), time.perf_counter()
    return t2 - t0, c2 - c0, t2 - t1, c2 - c1, inside, n_ops, t_exit - t0, c_exit - c0


def bench_whole(name, model, step, step_counts, reps_for):
    """The whole-block table of one workload (see the module docstring)."""
    for _ in range(2):
        step()
    t0, c0 = time.perf_counter(), time.process_time()
    with memlens.record(model, backend="compiled") as rec:   # the process's first recording of this step
        step()
    cold_wall, cold_cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"\n{name}: whole block, enter -> steps -> exit -> usable result (memlens: rec.trace; profiler: "
          f"key_averages()), 1 thread, load average {os.getloadavg()[0]:.1f}")
    print(f"  first recording in this process (1 step, whole block): {cold_wall * 1e3:.1f} ms wall, "
          f"{cold_cpu * 1e3:.1f} ms CPU; {len(rec.trace.ops)} ops")
    print(f"  {'steps':>5} {'mode':9} {'block wall':>11} {'block CPU':>10} {'x plain wall':>12} {'x plain CPU':>11} "
          f"{'step inside':>11} {'close wall':>10} {'close CPU':>9} {'close/op CPU':>12} {'close/steps':>11}")
    rows = {}
    for steps in step_counts:
        reps = reps_for(steps)
        res = {m: [] for m in WHOLE_MODES}
        for r in range(reps):
            for mode in WHOLE_MODES[r % len(WHOLE_MODES):] + WHOLE_MODES[:r % len(WHOLE_MODES)]:
                res[mode].append(whole_block(mode, model, step, steps))
        med = {m: {"wall": statistics.median(x[0] for x in res[m]), "cpu": statistics.median(x[1] for x in res[m]),
                   "close_wall": statistics.median(x[2] for x in res[m]),
                   "close_cpu": statistics.median(x[3] for x in res[m]),
                   "step": statistics.median(t for x in res[m] for t in x[4]),
                   "ops": statistics.median(x[5] for x in res[m]),
                   "exit_wall": statistics.median(x[6] for x in res[m]),
                   "exit_cpu": statistics.median(x[7] for x in res[m])} for m in WHOLE_MODES}
        plain = med["plain"]
        for mode in WHOLE_MODES:
            m = med[mode]
            per_op = f"{m['close_cpu'] / m['ops'] * 1e6:9.1f} us" if m["ops"] else f"{'':>12}"
            share = f"{m['close_cpu'] / plain['cpu'] * 100:10.0f}%" if mode != "plain" else f"{'':>11}"
            print(f"  {steps:5d} {mode:9} {m['wall'] * 1e3:8.1f} ms {m['cpu'] * 1e3:7.1f} ms "
                  f"{m['wall'] / plain['wall']:11.2f}x {m['cpu'] / plain['cpu']:10.2f}x "
                  f"{m['step'] / plain['step']:10.2f}x {m['close_wall'] * 1e3:7.1f} ms {m['close_cpu'] * 1e3:6.1f} ms "
                  f"{per_op} {share}")
        p = med["profiler"]
        print(f"  {steps:5d} {'prof-exit':9} {p['exit_wall'] * 1e3:8.1f} ms "
              f"{p['exit_cpu'] * 1e3:7.1f} ms {p['exit_wall'] / plain['wall']:11.2f}x {p['exit_cpu'] / plain['cpu']:10.2f}x")
        rows[steps] = med
        print(f"        ({reps} rounds; compiled whole block / profiler whole block: wall "
              f"{med['compiled']['wall'] / med['profiler']['wall']:.2f}, CPU "
              f"{med['compiled']['cpu'] / med['profiler']['cpu']:.2f}; recorded ops "
              f"{med['compiled']['ops']:.0f}, profiler ops {med['profiler']['ops']:.0f})")
    print("  (step inside: median wall time of a step inside the block / plain; close: exit until the result "
          "is usable; close/steps: close CPU / the plain steps' CPU; prof-exit: the profiler's block up to the end "
          "of its exit, before key_averages(), which is where it parses its events)")
    return rows


def _quantile(values, q):
    v = sorted(values)
    return v[int(q * (len(v) - 1))]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["gpt", "cnn", "both", "heldout", *HELDOUT], default="both",
                        help="the two tuned steps (both), or the held-out steps (heldout_steps.py; heldout = all four)")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--whole", default="1,5,50", help="step counts of the whole-block table ('' for none)")
    parser.add_argument("--whole-reps", type=int, default=5, help="rounds per step count of the whole-block table")
    parser.add_argument("--only", choices=["whole", "steps"], default=None, help="run one of the two tables")
    parser.add_argument("--quick", action="store_true", help="few rounds (see the module docstring)")
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.whole_reps = min(args.reps, 3), min(args.whole_reps, 3)
    step_counts = [int(x) for x in args.whole.split(",") if x.strip()]

    def reps_for(steps):
        return max(2, args.whole_reps - 1) if args.quick and steps >= 50 else args.whole_reps
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s), "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    names = {"both": ["gpt", "cnn"], "heldout": list(HELDOUT)}.get(args.workload, [args.workload])
    for name in names:
        model, step, title = workload(name)
        if step_counts and args.only != "steps":
            bench_whole(title, model, step, step_counts, reps_for)
        if args.only != "whole":
            bench(title, model, step, args.reps, args.steps)


if __name__ == "__main__":
    main()
