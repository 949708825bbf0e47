"""The close's small decoding and array helpers, each against a hand-worked case or numpy's / pandas' own answer:
op records and their wide escapes, signature words, backward-op module mapping, np.unique's first index as one
sort, the device factorize and its no-pandas path, the clock-offset median (an earlier second round of close
work; the join's cases themselves are in test_record_close_mutants.py)."""
from __future__ import annotations

import numpy as np
import pytest


def _op_records(dstart, dur, sig, nacc):
    from memlens.recording.compiled_drain import OP_DTYPE
    ops = np.zeros(len(dstart), dtype=OP_DTYPE)
    ops["dstart"], ops["dur"] = dstart, dur
    ops["sig_nacc"] = (np.asarray(sig, dtype=np.int64) << 8) | np.asarray(nacc, dtype=np.int64)
    return ops


def test_decoded_op_times_with_and_without_escaped_records():
    """The C++ op records hold start deltas; an op whose start, duration, access count or signature does
    not fit its 16 bytes has a wide record (kind 0..3) that overrides it. Worked by hand."""
    from memlens.recording.compiled_drain import CTX_DTYPE, WIDE_DTYPE, CompiledDrain
    ops = _op_records([0, 10, 5, 7], [3, 4, 5, 6], [1, 2, 3, 4], [1, 0, 2, 1])
    ctxs = np.array([(0, 4), (2, 8), (2, 12)], dtype=CTX_DTYPE)      # the last change at an op wins
    no_wide = np.zeros(0, dtype=WIDE_DTYPE)
    start, end, sig, nacc, ctx = CompiledDrain._decode_ops(ops, no_wide, ctxs, 1000)
    assert all(a.dtype == np.int64 for a in (start, end, sig, nacc, ctx))
    assert start.tolist() == [1000, 1010, 1015, 1022] and end.tolist() == [1003, 1014, 1020, 1028]
    assert sig.tolist() == [1, 2, 3, 4] and nacc.tolist() == [1, 0, 2, 1] and ctx.tolist() == [4, 4, 12, 12]
    wide = np.array([(2, 0, 5000), (1, 1, 10 ** 10), (3, 2, 300), (0, 3, 70000)], dtype=WIDE_DTYPE)
    start, end, sig, nacc, ctx = CompiledDrain._decode_ops(ops, wide, ctxs, 1000)
    # op 2 starts at its absolute 5000 and op 3 follows it by its own delta (7)
    assert start.tolist() == [1000, 1010, 5000, 5007]
    assert end.tolist() == [1003, 1010 + 10 ** 10, 5005, 5013]
    assert sig.tolist() == [70000, 2, 3, 4] and nacc.tolist() == [1, 0, 2, 300]
    assert all(a.dtype == np.int64 for a in (start, end, sig, nacc, ctx))
    # one wide record only, the first op's absolute start; the context set from op 1 on (op 0 has none)
    one = np.array([(0, 0, 7000)], dtype=WIDE_DTYPE)
    start, end, sig, nacc, ctx = CompiledDrain._decode_ops(ops, one, np.array([(1, 8)], dtype=CTX_DTYPE), 1000)
    assert start.tolist() == [7000, 7010, 7015, 7022] and end.tolist() == [7003, 7014, 7020, 7028]
    assert ctx.tolist() == [0, 8, 8, 8] and ctx.dtype == np.int64
    start, end, sig, nacc, ctx = CompiledDrain._decode_ops(ops, wide, np.zeros(0, dtype=CTX_DTYPE), 1000)
    assert ctx.tolist() == [0, 0, 0, 0] and ctx.dtype == np.int64
    empty = CompiledDrain._decode_ops(_op_records([], [], [], []), wide[:0], ctxs[:0], 1000)
    assert all(len(a) == 0 and a.dtype == np.int64 for a in empty)


def test_backward_ops_take_the_module_of_the_first_forward_op_of_their_node():
    """Forward ops read the autograd counter after their node was made: node s belongs to the first
    forward op reading s + 1; backward ops hold -2 - s. Worked by hand."""
    from memlens.recording.build import _backward_modules
    module_idx = np.array([5, 6, 7, 8, 0, 0, 0], dtype=np.int64)
    aseq = np.array([3, 3, 4, 4, -2 - 2, -2 - 3, -2 - 9], dtype=np.int64)   # nodes 2, 3 and an unknown 9
    backward = aseq < 0
    out = _backward_modules(module_idx, aseq, backward)
    # node 2 -> first forward reading 3 is op 0 (module 5); node 3 -> first reading 4 is op 2 (module 7)
    assert out.tolist() == [5, 6, 7, 8, 5, 7, 0]


def test_backward_module_mapping_matches_a_brute_force_reference():
    """Many forward ops share counter values (a sort that is not stable would pick a later one), and the
    one-forward-op / one-backward-op edges."""
    from memlens.recording.build import _backward_modules
    rng = np.random.default_rng(7)
    n_fwd, n_bwd = 400, 150
    fwd_seq = rng.integers(0, 40, n_fwd)       # (in op order counters grow; any order keeps the rule)
    module_idx = np.concatenate([rng.integers(1, 1000, n_fwd), np.zeros(n_bwd, np.int64)])
    nodes = rng.integers(-1, 45, n_bwd)
    aseq = np.concatenate([fwd_seq, -2 - nodes])
    expected = module_idx.copy()
    for j, node in enumerate(nodes):                            # the first forward op reading node + 1
        hits = [i for i in range(n_fwd) if fwd_seq[i] == node + 1]
        if hits:
            expected[n_fwd + j] = module_idx[hits[0]]
    assert _backward_modules(module_idx, aseq, aseq < 0).tolist() == expected.tolist()
    one = _backward_modules(np.array([9, 0]), np.array([1, -2]), np.array([False, True]))
    assert one.tolist() == [9, 9]                               # node 0 -> the forward op reading 1


def test_signature_words_decode_to_each_tagged_value():
    """recorder.cpp writes a signature as int64 words: the op-name number, tagged inputs, '|', tagged
    outputs. Built by hand: every tag, a nested list, a double's bits, an unknown tag and a 0-d output."""
    import struct

    from memlens.recording.compiled_signatures import decode_signature
    o = ord
    bits = struct.unpack("<q", struct.pack("<d", -2.5))[0]
    words = [1, o("T"), 6, 2, 3, 4, o("T"), 6, -1, o("L"), 2, o("I"), 5, o("N"), o("W"), 7, o("D"), bits,
             o("B"), 1, o("B"), 0, o("X"), o("|"), o("T"), 15, 0, o("I"), -3]
    name, inputs, outputs = decode_signature(struct.pack(f"<{len(words)}q", *words), ["aten::a", "aten::b"])
    assert name == "aten::b"
    assert inputs == [("tensor", 6, (3, 4)), ("tensor", 6, None), [5, None], ("scalar", 7), -2.5, True, False, "?"]
    assert outputs == [("tensor", 15, ()), -3]
    assert type(inputs[0][2][0]) is int and type(inputs[4]) is float and type(inputs[5]) is bool
    assert decode_signature(struct.pack("<q", 0), ["aten::a"]) == ("aten::a", [], [])


@pytest.mark.parametrize("seed", range(6))
def test_sort_based_unique_helpers_equal_numpy_unique(seed):
    """`first_occurrences` replaces `np.unique(return_index=True)` in the close: the same arrays, on
    repeated values, one value, and no values."""
    from memlens.recording.columns import first_occurrences
    rng = np.random.default_rng(seed)
    for values in (rng.integers(-5, 5, 300), rng.integers(0, 10 ** 12, 50), np.full(7, 3), np.empty(0, np.int64)):
        values = values.astype(np.int64)
        distinct, first = first_occurrences(values)
        expected_distinct, expected_first = np.unique(values, return_index=True)
        np.testing.assert_array_equal(distinct, expected_distinct)
        np.testing.assert_array_equal(first, expected_first)


def test_factorize_fast_path_equals_pandas():
    """One string device takes a path without pandas; everything else is pandas' own answer."""
    import pandas as pd

    from memlens.recording.join import _factorize
    cases = [np.array(["cpu"] * 5, dtype=object), np.array(["cuda:0", "cpu", "cuda:0"], dtype=object),
             np.array([None, "cpu", None], dtype=object), np.array([np.nan, np.nan], dtype=object),
             np.array([3, 3], dtype=object), np.empty(0, dtype=object)]
    for values in cases:
        for sentinel in (True, False):
            codes, uniques = _factorize(values, use_na_sentinel=sentinel)
            expected_codes, expected_uniques = pd.factorize(values, use_na_sentinel=sentinel)
            np.testing.assert_array_equal(codes, expected_codes)
            assert codes.dtype == np.int64
            def spelled(values):
                return [("<missing>" if pd.isna(v) else v) for v in values]
            assert spelled(uniques) == spelled(expected_uniques)
    codes, uniques = _factorize(np.array(["cpu"] * 3, dtype=object), use_na_sentinel=True)
    assert codes.tolist() == [0, 0, 0] and uniques.tolist() == ["cpu"]


@pytest.mark.parametrize("n", [1, 2, 3, 8, 51])
def test_clock_offset_is_the_median_distance_outside_the_ops(n):
    """estimate_offset = int(np.median(distance of each matched allocation outside its op's interval)),
    odd and even counts (the mean of the middle two, truncated toward zero), against numpy's median."""
    from memlens.recording.columns import Columns, Nullable
    from memlens.recording.join import estimate_offset
    rng = np.random.default_rng(n)
    starts = np.sort(rng.integers(0, 10 ** 9, n))
    ops = Columns(n, {"start_ns": starts, "end_ns": starts + rng.integers(0, 1000, n)})
    op = rng.permutation(n)
    blocks = Columns(n, {"alloc_op_id": Nullable.of(op)})
    alloc_t = starts[op] + rng.integers(-5000, 5001, n)          # before, inside or after each op
    rows = np.arange(n)
    distance = alloc_t - np.clip(alloc_t, starts[op], ops["end_ns"][op])
    assert estimate_offset(blocks, ops, alloc_t, rows) == int(np.median(distance))
    if n == 2:   # two distances, -1 and -2: their mean -1.5 truncates toward zero, to -1
        ops2 = Columns(4, {"start_ns": np.zeros(4, np.int64), "end_ns": np.full(4, 10)})
        blocks2 = Columns(4, {"alloc_op_id": Nullable.of(np.array([0, 1, 2, 3]))})
        assert estimate_offset(blocks2, ops2, np.array([-1, -2, 5, 5]), np.array([0, 1, -1, -1])) == -1


def test_one_string_device_is_factorized_without_pandas(monkeypatch):
    """The usual recording has one device: its codes come without a pandas call (the fast path's only
    purpose); two devices, a missing one or a non-string one go to pandas."""
    from memlens.recording import join
    calls = []
    real = join.pd.factorize
    monkeypatch.setattr(join.pd, "factorize", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    codes, uniques = join._factorize(np.array(["cuda:0"] * 4, dtype=object), use_na_sentinel=True)
    assert calls == [] and codes.tolist() == [0, 0, 0, 0] and uniques.dtype == object
    assert uniques.tolist() == ["cuda:0"]
    for values in (["cpu", "cuda:0"], [None, None], [1, 1]):
        join._factorize(np.array(values, dtype=object), use_na_sentinel=False)
    assert len(calls) == 3
    codes, cpu = join._device_codes(np.array(["cpu", None, "cuda:0", None, "cpu"], dtype=object))
    # a missing device is a name of its own (pandas keeps it as NaN: "nan", after "cpu" and "cuda:0" in the
    # sorted names), not a -1 sentinel that would alias the last name
    assert codes.tolist() == [0, 2, 1, 2, 0] and cpu.tolist() == [True, False, False, False, True]
    codes, cpu = join._device_codes(np.array(["cpu"] * 3, dtype=object))
    assert codes.tolist() == [0, 0, 0] and codes.dtype == np.int64 and cpu.tolist() == [True] * 3
