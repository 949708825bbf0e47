"""Recorder overhead: a transformer training step and a CNN inference on CPU, timed in one process

    plain                      no instrument
    memlens (tensor level)     memlens.record(allocator="none")
    memlens (default)          memlens.record()  (+ the profiler's allocation events, joined)
    torch.profiler             profile(profile_memory=True, record_shapes=True)

Each instrument wraps `--steps` steps; the time per step is measured inside it (the one-off cost of
building the trace / the profiler's post-processing is printed separately). Modes are interleaved
over `--reps` rounds and the median is taken, so load from other processes hits all of them alike.
Prints ratios to plain, and the recorder's own memory (event buffer bytes, bytes per op).

    .venv/bin/python benchmarks/recorder_overhead.py [--size small|medium|both] [--reps 5] [--steps 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import memlens
from memlens.demo import make_cnn, make_transformer

SIZES = {
    # transformer: (vocab, d_model, heads, layers, seq, batch); cnn: (channels, batch)
    "small": {"transformer": (256, 64, 4, 2, 32, 8), "cnn": (16, 16)},
    "medium": {"transformer": (1024, 256, 8, 4, 128, 8), "cnn": (32, 64)},
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
    channels, batch = cfg
    torch.manual_seed(0)
    model = make_cnn(channels=channels).eval()
    x = torch.randn(batch, 3, 32, 32)

    def step():
        with torch.no_grad():
            model(x)
    return model, step


def _instrument(mode, model):
    if mode == "plain":
        return None
    if mode == "memlens_tensor":
        return memlens.record(model, allocator="none")
    if mode == "memlens":
        return memlens.record(model)
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                  record_shapes=True)


def measure(mode, model, step, steps):
    """(seconds per step inside the instrument, seconds to close it, recorder overhead dict or None)."""
    inst = _instrument(mode, model)
    if inst is not None:
        inst.__enter__()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    t1 = time.perf_counter()
    if inst is not None:
        inst.__exit__(None, None, None)
    t2 = time.perf_counter()
    overhead = None
    if mode.startswith("memlens") and inst.trace is not None:
        overhead = dict(inst.trace.metadata["recorder_overhead"], ops=len(inst.trace.ops))
    return (t1 - t0) / steps, t2 - t1, overhead


MODES = ["plain", "memlens_tensor", "memlens", "profiler"]


def bench(name, model, step, reps, steps):
    for _ in range(2):
        step()          # warm-up: lazy init, optimizer state
    per_mode = {m: [] for m in MODES}
    close = {m: [] for m in MODES}
    overheads = {}
    for _ in range(reps):
        for mode in MODES:
            t_step, t_close, over = measure(mode, model, step, steps)
            per_mode[mode].append(t_step)
            close[mode].append(t_close)
            if over:
                overheads[mode] = over
    base = statistics.median(per_mode["plain"])
    print(f"\n{name}: plain step {base * 1e3:.2f} ms (median of {reps} rounds x {steps} steps)")
    for mode in MODES:
        med = statistics.median(per_mode[mode])
        print(f"  {mode:15s} {med * 1e3:9.2f} ms/step  ratio {med / base:5.2f}x   close/build "
              f"{statistics.median(close[mode]) * 1e3:8.1f} ms")
    for mode, over in overheads.items():
        ops = over["ops"]
        print(f"  {mode} memory: {over['event_buffer_bytes'] / 1024:.1f} KiB event buffer for {ops} ops "
              f"({over['bytes_per_op']} B/op; {ops / steps:.0f} ops/step, "
              f"{(med_us := 1e6 * (statistics.median(per_mode[mode]) - base) * steps / max(ops, 1)):.1f} us added/op)")
    return {m: statistics.median(v) / base for m, v in per_mode.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["small", "medium", "both"], default="both")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s)")
    sizes = ["small", "medium"] if args.size == "both" else [args.size]
    for size in sizes:
        cfg = SIZES[size]
        model, step = transformer_workload(cfg["transformer"])
        bench(f"transformer training step ({size}: vocab, d, heads, layers, seq, batch = {cfg['transformer']})",
              model, step, args.reps, args.steps)
        model, step = cnn_workload(cfg["cnn"])
        bench(f"CNN inference ({size}: channels, batch = {cfg['cnn']})", model, step, args.reps, args.steps)


if __name__ == "__main__":
    main()
