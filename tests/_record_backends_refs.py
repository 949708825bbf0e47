"""Shared by the recorder-backend comparisons (tests/integration/test_record_backends.py and
tests/integration/test_record_backends_threads.py): what a user reads from a trace, reduced to what both backends must
agree on -- the ops that access memory, in order, with their accesses; the blocks tensors showed; the blocks
only the allocator saw, above 8 bytes -- and `assert_same`, which compares two traces on all of it (see
tests/integration/test_record_backends.py's docstring for why backward's gradient accumulations and the 0-d number
tensors are left out)."""
from __future__ import annotations

from collections import Counter

from record_workloads import assert_same_per_op

# Under a TorchDispatchMode autograd accumulates gradients out of place (`add`; the mode makes tensors
# "subclass-like"); in the plain program -- and under the compiled recorder, which is no mode -- in
# place (`add_`). These backward accumulations are compared by count only (see
# test_grad_accumulation in tests/integration/test_record_backends.py).
_ACCUMULATE = ("aten::add", "aten::add_")


def _accumulations(trace):
    ops = trace.ops
    return ops[(ops["phase"] == "backward") & ops["name"].isin(_ACCUMULATE)]


def _access_ops(trace):
    """[(op name, sorted ((size, category, is_write), ...))] for ops with at least one access."""
    b = trace.blocks.set_index("block_id")
    acc = trace.accesses.join(b[["size", "category"]], on="block_id")
    acc = acc[~acc["op_id"].isin(_accumulations(trace)["op_id"])]
    names = trace.ops.set_index("op_id")["name"]
    out = []
    for op_id, grp in acc.groupby("op_id", sort=True):
        keys = sorted(zip(grp["size"].astype(int), grp["category"], grp["is_write"].astype(bool)))
        out.append((names[op_id], tuple(keys)))
    return out


def _dispatch_blocks(trace):
    b = trace.blocks[trace.blocks["source"].str.startswith("dispatch")]
    b = b[~b["alloc_op_id"].isin(_accumulations(trace)["op_id"])]
    return Counter(zip(b["size"].astype(int), b["category"], b["op"], b["allocated_before"].astype(bool)))


def _allocator_blocks(trace):
    b = trace.blocks[~trace.blocks["source"].str.startswith("dispatch") & (trace.blocks["size"] > 8)]
    return Counter(zip(b["size"].astype(int), b["category"], b["op"]))


def assert_same(py, cc):
    assert_same_per_op(_access_ops(py), _access_ops(cc))
    assert _dispatch_blocks(py) == _dispatch_blocks(cc)
    assert _allocator_blocks(py) == _allocator_blocks(cc)
    assert len(_accumulations(py)) == len(_accumulations(cc))
    # the per-op cost facts agree too (computed from the signatures each backend logged)
    if "flops" in cc.ops.columns:
        keep = lambda t: t.ops[~t.ops["op_id"].isin(_accumulations(t)["op_id"])]   # noqa: E731
        for col in ("flops", "bytes_written"):
            assert keep(py)[col].sum() == keep(cc)[col].sum(), col
