"""Hand-computed values for the allocator join's helpers on branches the recorded workloads do not reach:
block ids that do not ascend (`_first_seen`), and allocator-only rows with no ops, between ops, after the last
op (`allocator_only`)."""
import numpy as np

from memlens.recording.columns import Columns, Nullable
from memlens.recording.join import _first_seen
from memlens.recording.join_unmatched import MATCH_TOLERANCE_NS, allocator_only


def _nullable(values, missing):
    return Nullable(np.asarray(values, dtype=np.int64), np.asarray(missing, dtype=bool))


def test_first_seen_with_ascending_and_unordered_block_ids():
    ops = Columns(1, {"end_ns": np.array([100])})
    # block 7 is accessed but not in the table; block 2's first access is at 30 (not its later one at 50)
    accesses = Columns(4, {"block_id": np.array([2, 2, 9, 7]), "t_ns": np.array([50, 30, 70, 10])})
    unordered = Columns(3, {"block_id": np.array([5, 2, 9]), "alloc_op_id": _nullable([0, 0, 0], [0, 1, 1])})
    np.testing.assert_array_equal(_first_seen(unordered, accesses, ops), [100, 30, 70])
    ascending = Columns(3, {"block_id": np.array([2, 5, 9]), "alloc_op_id": _nullable([0, 0, 0], [1, 0, 1])})
    np.testing.assert_array_equal(_first_seen(ascending, accesses, ops), [30, 100, 70])
    # a made block keeps its op's end even when accessed earlier
    made = Columns(1, {"block_id": np.array([2]), "alloc_op_id": _nullable([0], [0])})
    np.testing.assert_array_equal(_first_seen(made, accesses, ops), [100])


def _blocks(with_stack):
    cols = {"block_id": np.array([4]), "device": np.array(["cpu"], dtype=object), "addr": _nullable([64], [0]),
            "size": np.array([10]), "alloc_ns": _nullable([5], [0]), "free_ns": _nullable([9], [0]),
            "category": np.array(["activation"], dtype=object), "op": np.array(["a"], dtype=object),
            "alloc_op_id": _nullable([0], [0]), "module": np.array(["m"], dtype=object), "stream": np.array([0]),
            "allocated_before": np.array([False]), "free_without_alloc": np.array([False]),
            "source": np.array(["dispatch"], dtype=object), "category_rule": np.array(["r"], dtype=object),
            "allocator_size": _nullable([10], [0])}
    if with_stack:
        cols["stack_id"] = _nullable([3], [0])
    return Columns(1, cols)


def _alloc_blocks(alloc_t, alloc_missing, free_t, free_missing):
    n = len(alloc_t)
    return Columns(n, {"device": np.array(["cpu"] * n, dtype=object), "addr": np.arange(1, n + 1) * 64,
                       "size": np.arange(1, n + 1) * 10, "alloc_t": _nullable(alloc_t, alloc_missing),
                       "free_t": _nullable(free_t, free_missing)})


def test_allocator_only_without_ops():
    alloc = _alloc_blocks([5, 0, 7], [0, 1, 0], [9, 3, 0], [0, 0, 1])
    ops = Columns(0, {"start_ns": np.zeros(0, np.int64), "end_ns": np.zeros(0, np.int64),
                      "name": np.zeros(0, object), "module": np.zeros(0, object)})
    # row 0 matched block 4, row 1 was allocated before the instrument: only row 2 is left
    out = allocator_only(alloc, np.array([0]), ops, _blocks(False), "profiler")
    assert len(out) == 1 and out.columns == _blocks(False).columns
    assert out["block_id"].tolist() == [5] and out["addr"].values.tolist() == [192]
    assert out["size"].tolist() == [30] and out["allocator_size"].values.tolist() == [30]
    assert out["alloc_ns"].values.tolist() == [7] and not out["alloc_ns"].missing[0]
    assert out["free_ns"].missing.tolist() == [True]
    assert out["alloc_op_id"].missing.tolist() == [True]
    assert out["op"].tolist() == [""] and out["module"].tolist() == [""]
    assert out["category"].tolist() == ["unknown"] and out["category_rule"].tolist() == ["seen only by the allocator"]
    assert out["source"].tolist() == ["profiler"]


def test_allocator_only_inside_between_and_after_ops():
    ops = Columns(2, {"start_ns": np.array([0, 20]), "end_ns": np.array([10, 30]),
                      "name": np.array(["a", "b"], dtype=object), "module": np.array(["m", "n"], dtype=object),
                      "stack_id": _nullable([7, 0], [0, 1])})
    late = 30 + MATCH_TOLERANCE_NS + 1
    # 0: inside op 0, freed inside it; 1: made between the ops, freed inside op 1 (the next op's argument);
    # 2: after the last op, never freed; 3: between the ops, freed after op 1 ended (past the tolerance)
    alloc = _alloc_blocks([5, 12, 40, 15], [0, 0, 0, 0], [8, 25, 0, late], [0, 0, 1, 0])
    out = allocator_only(alloc, np.array([-1]), ops, _blocks(True), "profiler")
    assert out["block_id"].tolist() == [5, 6, 7, 8]
    assert out["alloc_ns"].values.tolist() == [5, 20, 40, 15]           # row 1 clamped to op 1's start
    assert out["free_ns"].values.tolist() == [8, 25, 0, late]
    assert out["free_ns"].missing.tolist() == [False, False, True, False]
    assert out["alloc_op_id"].missing.tolist() == [False, False, True, True]
    assert out["alloc_op_id"].values[:2].tolist() == [0, 1]
    assert out["op"].tolist() == ["a", "b", "", ""] and out["module"].tolist() == ["m", "n", "", ""]
    assert out["category"].tolist() == ["temporary", "temporary", "unknown", "unknown"]
    assert out["category_rule"].tolist() == ["seen only by the allocator, freed inside the op that made it"] * 2 \
        + ["seen only by the allocator"] * 2
    assert out["stack_id"].missing.tolist() == [False, True, True, True] and out["stack_id"].values[0] == 7
