"""The trace build at the end of a recording gives the same tables as before it was
vectorised: the as-of join of dispatch blocks to allocator blocks, the autograd-seed refinement and the
per-process cost-facts cache are checked against the earlier pandas implementations, kept here as the
reference, on generated inputs (ties, missing times, several devices) and on recorded workloads (the whole
Trace built both ways from one recording, with both recorders)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import memlens
from memlens.recording import compiled_signatures, join, joining
from memlens.recording import recorder as recorder_module
from memlens.recording.pipeline import build_trace
from memlens.recording.columns import Columns
from record_workloads import transformer_training


# ---- the reference: the pandas implementations the vectorised code replaced ----------------------------
def reference_match_blocks(blocks, seen, alloc_blocks, tolerance_ns):
    result = np.full(len(blocks), -1, dtype=np.int64)
    if len(alloc_blocks) == 0 or len(blocks) == 0:
        return result
    left = pd.DataFrame({"row": np.arange(len(blocks)), "device": blocks["device"].to_numpy(dtype=object),
                         "addr": blocks["addr"].to_numpy(dtype="float64", na_value=-1).astype(np.int64),
                         "size": blocks["size"].to_numpy(), "key": seen})
    left = left[seen >= 0].sort_values("key", kind="stable")
    right = alloc_blocks.reset_index(drop=True)
    right = pd.DataFrame({"arow": np.arange(len(right)), "device": right["device"].to_numpy(dtype=object),
                          "addr": right["addr"].to_numpy(), "asize": right["size"].to_numpy(),
                          "key": right["alloc_t"].to_numpy(dtype="float64", na_value=-np.inf),
                          "free_t": right["free_t"].to_numpy(dtype="float64", na_value=np.inf)})
    right["alloc_t"] = right["key"]
    right["key"] = right["key"].clip(lower=-2.0 ** 62).astype(np.int64)
    right = right.sort_values("key", kind="stable")
    containing = pd.merge_asof(left, right, on="key", by=["device", "addr"], direction="backward")
    ok = _reference_usable(containing) & (containing["free_t"].to_numpy(dtype="float64", na_value=np.inf)
                                          >= containing["key"].to_numpy())
    nearest = pd.merge_asof(left, right, on="key", by=["device", "addr"], direction="nearest",
                            tolerance=tolerance_ns)
    near_ok = _reference_usable(nearest)
    choice = np.where(ok, containing["arow"].to_numpy(dtype="float64", na_value=-1),
                      np.where(near_ok, nearest["arow"].to_numpy(dtype="float64", na_value=-1), -1))
    picked = pd.DataFrame({"row": containing["row"].to_numpy(), "arow": choice.astype(np.int64), "exact": ok})
    picked = picked[picked["arow"] >= 0].sort_values("exact", ascending=False, kind="stable")
    picked = picked[~picked["arow"].duplicated(keep="first")]
    result[picked["row"].to_numpy(dtype=np.int64)] = picked["arow"].to_numpy(dtype=np.int64)
    return result


def _reference_usable(merged):
    found = merged["arow"].notna().to_numpy()
    asize = merged["asize"].to_numpy(dtype="float64", na_value=-1)
    size = merged["size"].to_numpy()
    exact = merged["device"].astype(str).str.startswith("cpu").to_numpy()
    return found & np.where(exact, asize == size, asize >= size)


def reference_first_seen(blocks, accesses, ops):
    seen = np.full(len(blocks), -1, dtype=np.int64)
    made = blocks["alloc_op_id"].notna().to_numpy()
    if len(ops) and made.any():
        seen[made] = ops["end_ns"].to_numpy()[blocks.loc[made, "alloc_op_id"].to_numpy(dtype=np.int64)]
    if len(accesses):
        first = accesses.groupby("block_id")["t_ns"].min()
        pos = pd.Index(blocks["block_id"]).get_indexer(first.index)
        ok = pos >= 0
        rows = pos[ok]
        vals = first.to_numpy()[ok]
        fill = seen[rows] < 0
        seen[rows[fill]] = vals[fill]
    return seen


def reference_refine_autograd_seeds(blocks, accesses, ops):
    cand = blocks["category"].eq("unknown") & blocks["alloc_op_id"].notna()
    if not cand.any() or len(accesses) == 0:
        return blocks
    made_by = blocks.loc[cand, ["block_id", "alloc_op_id"]].astype({"alloc_op_id": "int64"})
    acc = accesses.merge(made_by, on="block_id")
    acc = acc[acc["op_id"] != acc["alloc_op_id"]].sort_values(["block_id", "t_ns", "op_id"], kind="stable")
    first = acc.drop_duplicates("block_id")
    phase = ops.set_index("op_id")["phase"]
    seeds = first.loc[first["op_id"].map(phase).eq("backward").to_numpy(), "block_id"]
    hit = blocks["block_id"].isin(seeds).to_numpy() & cand.to_numpy()
    blocks = blocks.copy()
    blocks.loc[hit, "category"] = "autograd_detail"
    blocks.loc[hit, "category_rule"] = "made outside modules with no autograd history, first read by backward"
    return blocks


# ---- generated inputs ----------------------------------------------------------------------------------
def _generated_join(seed: int):
    """Dispatch blocks and allocator blocks on few addresses and few distinct times, so that equal keys,
    equal distances, containing and only-near candidates, missing alloc/free times and size mismatches
    all occur."""
    rng = np.random.default_rng(seed)
    nb, na = int(rng.integers(0, 40)), int(rng.integers(0, 40))
    devices = np.array(["cpu", "cuda:0", "cuda:1"], dtype=object)
    addrs = np.array([4096, 8192, 1 << 40, (1 << 47) + 64])
    sizes = np.array([8, 64, 100, 128])
    blocks = pd.DataFrame({
        "device": devices[rng.integers(0, 3, nb)],
        "addr": pd.array(np.where(rng.random(nb) < 0.1, 0, addrs[rng.integers(0, 4, nb)]), dtype="Int64"),
        "size": sizes[rng.integers(0, 4, nb)]})
    blocks.loc[rng.random(nb) < 0.1, "addr"] = pd.NA
    seen = np.where(rng.random(nb) < 0.15, -1, rng.integers(0, 12, nb) * 50).astype(np.int64)
    alloc_t = rng.integers(0, 12, na) * 50 + rng.integers(-1, 2, na) * 7
    free_t = alloc_t + rng.integers(0, 6, na) * 50
    alloc = pd.DataFrame({
        "device": devices[rng.integers(0, 3, na)], "addr": addrs[rng.integers(0, 4, na)],
        "size": sizes[rng.integers(0, 4, na)],
        "alloc_t": pd.array(alloc_t, dtype="Int64"), "free_t": pd.array(free_t, dtype="Int64")})
    alloc.loc[rng.random(na) < 0.1, "alloc_t"] = pd.NA
    alloc.loc[rng.random(na) < 0.2, "free_t"] = pd.NA
    return blocks, seen, alloc


@pytest.mark.parametrize("seed", range(300))
def test_match_blocks_matches_the_pandas_as_of_join(seed):
    blocks, seen, alloc = _generated_join(seed)
    for tolerance in (0, 60, 200):
        expected = reference_match_blocks(blocks, seen, alloc, tolerance)
        np.testing.assert_array_equal(join.match_blocks(Columns.from_frame(blocks), seen, Columns.from_frame(alloc),
                                                        tolerance), expected)


def test_match_blocks_hand_computed_ties():
    """Two allocations at one address allocated at the same instant: the containing join takes the later
    row; a block seen between two allocations at equal distance takes the earlier one (nearest, ties
    backward); a CPU size mismatch matches nothing; each allocation goes to one block only."""
    blocks = pd.DataFrame({"device": ["cpu", "cpu", "cuda:0", "cpu"],
                           "addr": pd.array([16, 32, 48, 16], dtype="Int64"), "size": [8, 8, 100, 9]})
    seen = np.array([110, 150, 500, 120], dtype=np.int64)
    alloc = pd.DataFrame({"device": ["cpu", "cpu", "cpu", "cpu", "cuda:0"], "addr": [16, 16, 32, 32, 48],
                          "size": [8, 8, 8, 8, 128],
                          "alloc_t": pd.array([100, 100, 100, 200, 400], dtype="Int64"),
                          "free_t": pd.array([105, 300, 120, 250, 450], dtype="Int64")})
    # block 0 (seen 110 at 16): rows 0 and 1 tie at 100, backward takes row 1 (free 300 >= 110: contains)
    # block 1 (seen 150 at 32): row 2 ended at 120, row 3 starts at 200; equal distance 50 -> row 2
    # block 2 (cuda, seen 500 at 48): row 4 ended at 450, within 100 ns -> row 4 (128 >= 100 on CUDA)
    # block 3 (cpu, 9 bytes): no 9-byte allocation at 16 -> none
    blocks, alloc = Columns.from_frame(blocks), Columns.from_frame(alloc)
    np.testing.assert_array_equal(join.match_blocks(blocks, seen, alloc, 100), [1, 2, 4, -1])
    np.testing.assert_array_equal(join.match_blocks(blocks, seen, alloc, 10), [1, -1, -1, -1])


def test_a_block_without_an_address_matches_no_allocation():
    """A dispatch block whose address is missing (its -1 stand-in is no address) matches nothing, even
    an allocation of its size and time at address 0, 1 or -1's neighbours; the block beside it with the
    address matches."""
    blocks = Columns.from_frame(pd.DataFrame({"device": ["cpu", "cpu"], "addr": pd.array([None, 1], dtype="Int64"),
                                              "size": [8, 8]}))
    for addr in (0, 1):
        alloc = Columns.from_frame(pd.DataFrame({"device": ["cpu"], "addr": [addr], "size": [8],
                                                 "alloc_t": pd.array([100], dtype="Int64"),
                                                 "free_t": pd.array([300], dtype="Int64")}))
        expected = [-1, 0] if addr == 1 else [-1, -1]
        np.testing.assert_array_equal(join.match_blocks(blocks, np.array([150, 150]), alloc, 100), expected)


@pytest.mark.parametrize("seed", range(200))
def test_refine_autograd_seeds_matches_the_pandas_version(seed):
    rng = np.random.default_rng(seed)
    n_ops, nb, na = int(rng.integers(1, 15)), int(rng.integers(0, 15)), int(rng.integers(0, 40))
    ops = pd.DataFrame({"op_id": np.arange(n_ops),
                        "phase": np.array(["forward", "backward", "other", "optimizer"], dtype=object)[
                            rng.integers(0, 4, n_ops)]})
    alloc_op = pd.array(rng.integers(0, n_ops, nb), dtype="Int64")
    alloc_op[rng.random(nb) < 0.2] = pd.NA
    blocks = pd.DataFrame({"block_id": rng.permutation(nb + 3)[:nb].astype(np.int64),
                           "category": np.array(["unknown", "activation"], dtype=object)[
                               (rng.random(nb) < 0.3).astype(int)],
                           "category_rule": "r", "alloc_op_id": alloc_op})
    accesses = pd.DataFrame({"block_id": rng.integers(0, nb + 3, na).astype(np.int64),
                             "t_ns": rng.integers(0, 5, na).astype(np.int64) * 10,
                             "op_id": rng.integers(0, n_ops + 2, na).astype(np.int64)})
    expected = reference_refine_autograd_seeds(blocks, accesses, ops)
    refined = joining.refine_autograd_seeds(*(Columns.from_frame(t) for t in (blocks, accesses, ops)))
    # (values; the traces' dtypes are compared in test_recorded_trace_is_the_same_as_with_the_pandas_build)
    pd.testing.assert_frame_equal(refined.to_frame(), expected, check_dtype=len(blocks) > 0)


@pytest.mark.parametrize("seed", range(100))
def test_first_seen_matches_the_groupby_version(seed):
    rng = np.random.default_rng(seed)
    n_ops, nb, na = int(rng.integers(0, 10)), int(rng.integers(0, 15)), int(rng.integers(0, 40))
    ops = pd.DataFrame({"op_id": np.arange(n_ops), "end_ns": np.sort(rng.integers(0, 1000, n_ops))})
    alloc_op = pd.array(rng.integers(0, max(n_ops, 1), nb), dtype="Int64")
    alloc_op[(rng.random(nb) < 0.4) | (n_ops == 0)] = pd.NA
    blocks = pd.DataFrame({"block_id": rng.permutation(nb + 5)[:nb].astype(np.int64), "alloc_op_id": alloc_op})
    accesses = pd.DataFrame({"block_id": rng.integers(0, nb + 5, na).astype(np.int64),
                             "t_ns": rng.integers(0, 1000, na).astype(np.int64)})
    np.testing.assert_array_equal(join._first_seen(*(Columns.from_frame(t) for t in (blocks, accesses, ops))),
                                  reference_first_seen(blocks, accesses, ops))


# ---- recorded workloads: the whole Trace built both ways from one recording ----------------------------
def _conv_training():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))

    def run():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    run()
    return run, model


def _on_frames(reference):
    """`reference` (written on DataFrames) called with the recorder's `Columns` tables; a frame it returns
    given back as Columns."""
    def call(*args):
        out = reference(*(a.to_frame() if isinstance(a, Columns) else a for a in args))
        return Columns.from_frame(out) if isinstance(out, pd.DataFrame) else out
    return call


def _assert_traces_equal(a, b):
    for name in ("blocks", "accesses", "ops"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    assert a.metadata["join"] == b.metadata["join"]


@pytest.mark.parametrize("backend", ["compiled", "python"])
@pytest.mark.parametrize("workload", ["transformer", "conv"])
def test_recorded_trace_is_the_same_as_with_the_pandas_build(monkeypatch, backend, workload):
    from memlens.recording import native
    if backend == "compiled" and not native.available():
        pytest.skip("compiled recorder does not build here")
    run, model = transformer_training() if workload == "transformer" else _conv_training()
    built = {}
    original_build = recorder_module.Recorder._build

    def build_both(self, session, allocator_data, exception):
        trace = original_build(self, session, allocator_data, exception)
        with monkeypatch.context() as m:      # the reference: pandas join/refine, no cached cost facts
            m.setattr(join, "match_blocks", _on_frames(reference_match_blocks))
            m.setattr(join, "_first_seen", _on_frames(reference_first_seen))
            m.setattr(joining, "refine_autograd_seeds", _on_frames(reference_refine_autograd_seeds))
            m.setattr(compiled_signatures, "_FACTS_BY_SIGNATURE", {})
            m.setattr(compiled_signatures, "_FACTS_BY_SHAPES", {})
            built["reference"] = build_trace(session, allocator_data, settings=self._settings(), clock=self._clock,
                                             exception=exception).trace
        return trace

    monkeypatch.setattr(recorder_module.Recorder, "_build", build_both)
    for _ in range(2):          # the second recording takes its cost facts from the process cache
        with memlens.record(model, backend=backend) as rec:
            run()
        assert rec.trace is not None and len(rec.trace.blocks) > 0
        _assert_traces_equal(rec.trace, built["reference"])
        assert rec.trace.ops["flops"].sum() > 0


# ---- the tables' construction: one frame each, owned by the trace ----------------------------------------
def test_conform_puts_extra_columns_after_the_schema_and_renumbers_rows():
    from memlens.trace.schema import SCHEMA, conform
    df = pd.DataFrame({"extra": ["x", "y"], "is_write": [True, False], "t_ns": [5, 7], "op_id": [1, 0],
                       "block_id": [3, 4], "later": [9, 8]}, index=[10, 20])
    out = conform("accesses", df)
    assert list(out.columns) == list(SCHEMA["accesses"]) + ["extra", "later"]
    assert list(out.index) == [0, 1]
    assert out["block_id"].tolist() == [3, 4] and out["t_ns"].tolist() == [5, 7]
    assert out["op_id"].tolist() == [1, 0] and out["is_write"].tolist() == [True, False]
    assert out["extra"].tolist() == ["x", "y"] and out["later"].tolist() == [9, 8]
    same = conform("accesses", df.reset_index(drop=True))     # already 0..n-1: the same table
    pd.testing.assert_frame_equal(same, out, check_exact=True)


@pytest.mark.parametrize("backend", ["compiled", "python"])
def test_recorded_tables_can_be_changed_in_place(backend):
    """The built frames own their arrays: no read-only view of the recorder's buffers ends up in a trace."""
    from memlens.recording import native
    if backend == "compiled" and not native.available():
        pytest.skip("compiled recorder does not build here")
    run, model = _conv_training()
    with memlens.record(model, backend=backend) as rec:
        run()
    for name in ("blocks", "accesses", "ops"):
        df = getattr(rec.trace, name)
        for col in df.columns:
            last = df[col].iloc[-1]
            df.loc[0, col] = last
            assert df[col].iloc[0] is pd.NA if last is pd.NA else df[col].iloc[0] == last


def test_float_arguments_alone_do_not_recompute_facts_of_ops_without_a_flop_formula(monkeypatch):
    """addcdiv_ (no flop formula) met again with another float `value` takes the known facts; addmm (a flop
    formula, which may read any argument) is computed for each distinct signature; the facts are those
    `op_costs` gives for the new arguments."""
    from memlens.opfacts.costs import op_costs
    monkeypatch.setattr(compiled_signatures, "_FACTS_BY_SIGNATURE", {})
    monkeypatch.setattr(compiled_signatures, "_FACTS_BY_SHAPES", {})
    assert compiled_signatures._shapes_only("aten::addcdiv_") and not compiled_signatures._shapes_only("aten::addmm")
    t = ("tensor", 6, (4, 8))                               # float32 [4, 8]
    decoded = [("aten::addcdiv_", [t, t, t, 0.5], [t]), ("aten::addcdiv_", [t, t, t, -0.25], [t]),
               ("aten::addmm", [("tensor", 6, (8,)), t, ("tensor", 6, (8, 8)), 1.0, 1.0], [t]),
               ("aten::addmm", [("tensor", 6, (8,)), t, ("tensor", 6, (8, 8)), 0.5, 2.0], [t])]
    names = ["aten::addcdiv_", "aten::addmm"]
    raws = [np.int64(names.index(d[0])).tobytes() + bytes([i]) for i, d in enumerate(decoded)]   # distinct keys
    computed = []

    def counting(*args):
        computed.append(args[0])
        return op_costs(*args)
    monkeypatch.setattr("memlens.opfacts.costs.op_costs", counting)
    facts = compiled_signatures.signature_facts(raws, names, lambda i: decoded[i])
    assert computed == ["aten::addcdiv_", "aten::addmm", "aten::addmm"]
    for f, d in zip(facts, decoded):
        assert f == op_costs(*compiled_signatures.compiled_record(*d))
    assert facts[0] == facts[1] and facts[0].bytes_read == 3 * 4 * 8 * 4 and facts[0].bytes_written == 4 * 8 * 4
    assert facts[2].flops == facts[3].flops == 2 * 4 * 8 * 8
