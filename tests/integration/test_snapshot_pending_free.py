"""Blocks the final allocator state lists as pending free (``active_pending_free`` / ``active_awaiting_free``):
the program freed them and the caching allocator holds them until their streams' queued work completes. Without
stronger evidence they are ``temporary``; a stack, phase or structure rule still wins; the in-memory import and
the row-group conversion agree."""
from __future__ import annotations

import pickle

from memlens.analysis.peak import peak_breakdown
from memlens.io.snapshot.importer import import_snapshot, snapshot_to_trace
from memlens.trace.read import load_trace
from test_snapshot_convert import assert_same_saved_trace, converted_and_imported

PENDING_RULE = ("freed by the program, held by the allocator until its streams' queued work completes "
                "(pending free)")
PARAMETER_FRAMES = [{"name": "__init__", "filename": "/x/torch/nn/modules/linear.py", "line": 100},
                    {"name": "build", "filename": "/home/u/model.py", "line": 5}]
OPTIMIZER_FRAMES = [{"name": "build_optimizer", "filename": "/home/u/train.py", "line": 9}]
WORKSPACE_FRAMES = [{"name": "cublasCreate_v2", "filename": "", "line": 0},
                    {"name": "main", "filename": "/home/u/train.py", "line": 3}]


def _segments_only() -> dict:
    """One segment, segments only (no device trace): blocks at 0x1000... with the given states and frames;
    the last block is inactive (free in the allocator, no block of the trace). Every size differs, so the
    structure rules (same-size partners of gradients / optimizer state) decide none of them."""
    blocks = [
        ("active_pending_free", 512, None),          # 0x1000: freed, no frames -> temporary (pending free)
        ("active_awaiting_free", 1024, None),        # 0x1200: the docstrings' spelling -> temporary
        ("active_pending_free", 2048, PARAMETER_FRAMES),  # 0x1600: made by model construction -> parameter
        ("active_pending_free", 256, OPTIMIZER_FRAMES),   # 0x1e00: made while building the optimizer
        ("active_pending_free", 768, WORKSPACE_FRAMES),   # 0x1f00: cuBLAS -> workspace
        ("active_allocated", 4096, None),            # 0x2200: live, no frames -> unknown (nothing says)
        ("inactive", 1024, None),
    ]
    rows, addr = [], 0x1000
    for state, size, frames in blocks:
        row = {"address": addr, "size": size, "requested_size": size - 8 if state != "inactive" else 0,
               "state": state}
        if frames is not None:
            row["frames"] = frames
        rows.append(row)
        addr += size
    total = addr - 0x1000
    seg = {"device": 0, "address": 0x1000, "total_size": total, "allocated_size": total - 1024,
           "active_size": total - 1024, "requested_size": total - 1024 - 8 * 6, "stream": 0,
           "segment_type": "small", "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
           "blocks": rows}
    return {"segments": [seg], "device_traces": []}


# (category, rule) by block address: hand-derived from the module docstring's rules
EXPECTED = {
    0x1000: ("temporary", PENDING_RULE),
    0x1200: ("temporary", PENDING_RULE),
    0x1600: ("parameter", "made by model construction, weight init/loading or Module.to (stack) and never freed"),
    0x1E00: ("optimizer_state", "made while building the optimizer (stack)"),
    0x1F00: ("workspace", "cuBLAS / cuDNN frame on the stack"),
    0x2200: ("unknown", "nothing in the file says"),
}


def _by_addr(trace) -> dict:
    b = trace.blocks.set_index("addr")
    return {int(a): (b.at[a, "category"], b.at[a, "category_rule"]) for a in b.index}


def test_pending_free_without_stronger_evidence_is_temporary():
    tr = snapshot_to_trace(_segments_only(), source="pending")
    assert _by_addr(tr) == EXPECTED
    # the temporary's bytes are the requested size of the block (what the peak counts)
    b = tr.blocks.set_index("addr")
    assert b.at[0x1000, "size"] == 504 and b.at[0x1200, "size"] == 1016


def test_both_import_paths_give_the_same_categories(tmp_path):
    src = tmp_path / "pending.pickle"
    src.write_bytes(pickle.dumps(_segments_only(), protocol=4))
    got, want = converted_and_imported(src, tmp_path, rows_per_group=2)
    assert_same_saved_trace(got, want)
    assert _by_addr(got) == EXPECTED


def test_a_pending_free_block_freed_in_a_phase_keeps_that_phase_s_rule():
    """A block allocated and freed in the forward pass whose free is still pending at the end: the phase rule
    (temporary, forward) decides, not the pending-free rule."""
    fwd = [{"name": "forward", "filename": "/home/u/model.py", "line": 20},
           {"name": "_call_impl", "filename": "/x/torch/nn/modules/module.py", "line": 1},
           {"name": "main", "filename": "/home/u/train.py", "line": 30}]
    entries = [{"action": "alloc", "addr": 0x1000, "size": 512, "stream": 0, "time_us": 10, "frames": fwd},
               {"action": "alloc", "addr": 0x1200, "size": 512, "stream": 0, "time_us": 11, "frames": fwd},
               {"action": "free_requested", "addr": 0x1000, "size": 512, "stream": 0, "time_us": 12,
                "frames": fwd},
               {"action": "alloc", "addr": 0x1400, "size": 512, "stream": 0, "time_us": 13, "frames": fwd}]
    seg = {"device": 0, "address": 0x1000, "total_size": 2048, "allocated_size": 1536, "active_size": 1536,
           "requested_size": 1536, "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
           "is_expandable": False, "frames": [],
           "blocks": [{"address": 0x1000, "size": 512, "requested_size": 512, "state": "active_pending_free"},
                      {"address": 0x1200, "size": 512, "requested_size": 512, "state": "active_allocated"},
                      {"address": 0x1400, "size": 512, "requested_size": 512, "state": "active_allocated"},
                      {"address": 0x1600, "size": 512, "requested_size": 0, "state": "inactive"}]}
    tr = snapshot_to_trace({"segments": [seg], "device_traces": [entries]}, source="pending-fwd")
    got = _by_addr(tr)
    assert got[0x1000] == ("temporary", "allocated and freed within the forward pass")
    assert got[0x1200][0] == got[0x1400][0] == "activation"


def test_verl_pending_free_block_is_temporary_and_unknown_is_at_most_2_percent_of_the_peak(shared, tmp_path):
    src = shared("snapshots/verl_segments_only.pickle")
    tr = import_snapshot(src)
    pb = peak_breakdown(tr)["cuda:0"]
    cats = pb.by_category.set_index("category")["bytes"]
    assert cats.sum() == pb.peak_bytes
    assert cats["unknown"] <= 0.02 * pb.peak_bytes  # 2.32% before the pending-free rule, 1.25% with it
    b = tr.blocks
    largest = b[b["size"] == 272_269_312]
    assert len(largest) == 1
    assert (largest["category"] == "temporary").all() and (largest["category_rule"] == PENDING_RULE).all()
    assert largest["block_size"].tolist() == [272_629_760]
    # the conversion says the same
    from memlens.io.snapshot.convert import convert_snapshot
    conv = load_trace(convert_snapshot(src, tmp_path / "verl.memlens"))
    assert conv.blocks["category"].tolist() == tr.blocks["category"].tolist()
    assert conv.blocks["category_rule"].tolist() == tr.blocks["category_rule"].tolist()
