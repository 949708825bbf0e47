"""The recorder's allocations agree with torch.profiler's allocation events.

Tolerance, explained: the dispatch mode sees tensor storages, the profiler sees every allocator call.
So (1) every block the dispatch mode saw is one of the profiler's allocations (same address and size),
exactly; (2) the profiler's extra allocations are all made inside an op (temporaries, workspaces) or
are Python numbers wrapped as 0-dim tensors (<= 8 bytes) by PyTorch's argument parser; and (3) with
the allocator join on, the recorder's allocations equal a plain profiler run's, except for two
effects PyTorch itself has whenever any TorchDispatchMode is active (so every dispatch-mode recorder
has them): each Python-number argument is wrapped as a 0-dim tensor once more when the mode calls
the op (one extra <= 8-byte temporary freed inside the op), and autograd stops accumulating a
gradient in place when a tensor feeds several ops (`isTensorSubclassLike` is true under a mode), so
such accumulations allocate a new buffer (made by a backward `aten::add`). The test checks that every
extra allocation is one of these two, and that nothing is missing.
"""
from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest

torch = pytest.importorskip("torch")

import memlens  # noqa: E402
from memlens.demo import make_cnn, make_mlp, make_transformer, train_transformer_steps  # noqa: E402

WRAPPED_NUMBER_BYTES = 8


def profiler_allocations(prof) -> pd.DataFrame:
    """Allocation events (delta > 0) with the name of the op they happened in ('' when none)."""
    kind_alloc = torch._C._profiler._EventType.Allocation
    rows, stack = [], [(r, "") for r in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        node, parent = stack.pop()
        kind, fields = node.typed
        if kind == kind_alloc:
            if fields.alloc_size > 0:
                rows.append((node.start_time_ns, fields.ptr, fields.alloc_size, parent))
        else:
            stack.extend((c, node.name) for c in node.children)
    return pd.DataFrame(rows, columns=["t_unix_ns", "addr", "size", "parent"])


def _workload(name):
    torch.manual_seed(0)
    if name == "mlp_sgd":
        model = make_mlp(d_in=16, hidden=32, d_out=4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def run():
            for _ in range(2):
                torch.nn.functional.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 4, (8,))).backward()
                opt.step()
                opt.zero_grad()
    elif name == "cnn_adam":
        model = make_cnn(channels=4)
        opt = torch.optim.Adam(model.parameters())

        def run():
            for _ in range(2):
                model(torch.randn(2, 3, 32, 32)).sum().backward()
                opt.step()
                opt.zero_grad()
    elif name == "transformer_adamw":
        model = make_transformer(vocab=64, d_model=32, n_heads=2, n_layers=1, seq_len=8)
        opt = torch.optim.AdamW(model.parameters())

        def run():
            train_transformer_steps(model, opt, 2, batch=2, seq_len=8, vocab=64, mark_steps=False)
    else:  # cnn inference
        model = make_cnn(channels=4).eval()

        def run():
            with torch.no_grad():
                for _ in range(2):
                    model(torch.randn(2, 3, 32, 32))
    return model, run


WORKLOADS = ["mlp_sgd", "cnn_adam", "transformer_adamw", "cnn_infer"]


@pytest.mark.parametrize("name", WORKLOADS)
def test_dispatch_blocks_are_profiler_allocations(name):
    model, run = _workload(name)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                record_shapes=True) as prof:
        with memlens.record(model, allocator="none") as rec:
            run()
    trace = rec.trace
    t0 = trace.metadata["t0_unix_ns"]
    events = profiler_allocations(prof)
    events = events[(events["t_unix_ns"] >= t0 - 1_000_000) &
                    (events["t_unix_ns"] <= t0 + trace.metadata["recording_ns"] + trace.metadata["recorder_own_ns"]
                     + 1_000_000)]
    made = trace.blocks[trace.blocks["alloc_ns"].notna()]
    ours = Counter(zip(made["addr"].astype(int), made["size"]))
    theirs = Counter(zip(events["addr"], events["size"]))
    assert not (ours - theirs), f"blocks the profiler never allocated: {list((ours - theirs).items())[:5]}"
    assert made["size"].sum() <= events["size"].sum()
    known = set(zip(trace.blocks["addr"].astype(int), trace.blocks["size"]))
    extra = events[[k not in known for k in zip(events["addr"], events["size"])]]
    outside_ops = extra[extra["parent"] == ""]
    assert (outside_ops["size"] <= WRAPPED_NUMBER_BYTES).all(), outside_ops.head()


@pytest.mark.parametrize("name", WORKLOADS)
def test_joined_trace_matches_plain_profiler_run(name):
    model, run = _workload(name)
    run()   # warm-up: lazy initialisation (optimizer state, kernels) happens once in both runs below
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    plain = Counter(profiler_allocations(prof)["size"])
    with memlens.record(model) as rec:
        run()
    trace = rec.trace
    assert {"profiler", "memory_hook"} & set(trace.metadata["sources"])
    made = trace.blocks[trace.blocks["alloc_ns"].notna() & trace.blocks["source"].str.contains("profiler")]
    recorded = Counter(made["size"])
    assert not (plain - recorded), f"allocations the recorder missed: {dict(plain - recorded)}"
    added = recorded - plain
    accumulations = Counter(made.loc[(made["op"] == "aten::add") &
                                     made["alloc_op_id"].map(trace.ops.set_index("op_id")["phase"]).eq("backward"),
                                     "size"])
    unexplained = {s: n for s, n in added.items() if s > WRAPPED_NUMBER_BYTES and n > accumulations[s]}
    assert not unexplained, unexplained
    stats = trace.metadata["join"]["profiler"]
    assert stats["matched"] + stats["allocator_only"] == len(made)
    # every tensor the model made during recording was matched to its allocator event
    mine = trace.blocks[trace.blocks["source"] == "dispatch"]
    assert mine["alloc_ns"].isna().all(), mine[mine["alloc_ns"].notna()].head()
    # the joined times keep every access inside its block's lifetime
    a = trace.accesses.merge(trace.blocks[["block_id", "alloc_ns", "free_ns"]], on="block_id")
    assert not (a["alloc_ns"].notna() & (a["t_ns"] < a["alloc_ns"])).any()
    assert not (a["free_ns"].notna() & (a["t_ns"] > a["free_ns"])).any()
