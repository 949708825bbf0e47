"""Correlating GPU kernels with the ops that launched them, on the real H100 / MI300X Kineto traces
(cpu op -> runtime launch -> kernel), and on a hand-made frame where the answer is known."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from memlens.gpu_activity import (attribute_activity, innermost_containing, kernel_class, kernels_per_op,
                                       kineto_frames, load_kineto)
from memlens.errors import InputError

TRACES = {"h100": ("kineto/tracelens_h100_bert_small.json.gz", 307.197),
          "mi300": ("kineto/tracelens_mi300_bert_small.json.gz", 388.344)}


def test_hand_made_frames_external_id_and_containment():
    # outer op 0 [0, 100] contains inner op 1 [10, 50]; op 2 [200, 300] on another thread
    ops = pd.DataFrame({"name": ["aten::linear", "aten::addmm", "aten::add"], "start_ns": [0, 10, 200],
                        "end_ns": [100, 50, 300], "tid": ["1", "1", "2"], "external_id": [-1, -1, -1]})
    launches = pd.DataFrame({"name": ["cudaLaunchKernel"] * 3, "start_ns": [20, 60, 250], "tid": ["1", "1", "2"],
                             "correlation": [7, 8, 9], "external_id": [-1, -1, -1]})
    acts = pd.DataFrame({"name": ["gemm", "bias", "add"], "category": ["kernel"] * 3, "start_ns": [400, 500, 600],
                         "end_ns": [450, 510, 620], "correlation": [7, 8, 9], "stream": [7, 7, 7]})
    att = attribute_activity(ops, launches, acts)
    assert att["op"].tolist() == [1, 0, 2]            # innermost containing op on the launch's thread
    assert att["launch_ns"].tolist() == [20, 60, 250]
    # an External id on the launch wins over containment
    launches.loc[1, "external_id"] = 55
    ops.loc[2, "external_id"] = 55
    assert attribute_activity(ops, launches, acts)["op"].tolist() == [1, 2, 2]
    per = kernels_per_op(ops, attribute_activity(ops, launches, acts)).set_index("op")
    assert per.loc[2, "kernels"] == 2 and per.loc[2, "kernel_busy_ns"] == 10 + 20
    assert per.loc[2, "kernel_start_ns"] == 500 and per.loc[2, "kernel_end_ns"] == 620
    # a kernel whose launch is unknown belongs to no op
    acts.loc[0, "correlation"] = 99
    assert attribute_activity(ops, launches, acts)["op"].tolist()[0] == -1


def test_innermost_without_threads():
    ops = pd.DataFrame({"start_ns": [0, 10, 60], "end_ns": [100, 50, 70]})
    assert innermost_containing(ops, np.array([5, 20, 55, 65, 150])).tolist() == [0, 1, 0, 2, -1]


@pytest.mark.parametrize("gpu", ["h100", "mi300"])
def test_real_traces_every_kernel_has_its_launching_op(shared, gpu):
    rel, busy_us = TRACES[gpu]
    doc = load_kineto(shared(rel))
    ops, launches, acts = kineto_frames(doc)
    att = attribute_activity(ops, launches, acts)
    kernels = att[att["category"] == "kernel"]
    # counted from the raw events: every complete event of category "kernel", and their summed durations
    raw = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") == "kernel"]
    assert len(kernels) == len(raw) == 60
    raw_busy_us = sum(float(e["dur"]) for e in raw)
    assert raw_busy_us == pytest.approx(busy_us, abs=0.01)
    assert kernels["end_ns"].sub(kernels["start_ns"]).sum() / 1e3 == pytest.approx(raw_busy_us, abs=len(raw) * 1e-3)
    assert len(att) == sum(1 for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
                           and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    assert (att["op"] >= 0).all()
    # a kernel starts after its launch, and its op was running at the launch
    assert (att["start_ns"] >= att["launch_ns"]).all()
    owner = ops.iloc[att["op"].to_numpy()]
    assert (owner["start_ns"].to_numpy() <= att["launch_ns"].to_numpy()).all()
    assert (att["launch_ns"].to_numpy() <= owner["end_ns"].to_numpy()).all()
    names = owner["name"].to_numpy()
    cls = np.array([kernel_class(n) for n in kernels["name"]])
    k_names = names[(att["category"] == "kernel").to_numpy()]
    # the innermost op: GEMMs come from addmm (not linear), attention from the flash op
    assert set(k_names[cls == "gemm"]) == {"aten::addmm"} and (cls == "gemm").sum() == 26
    assert set(k_names[cls == "attention"]) == {"aten::_flash_attention_forward"} and (cls == "attention").sum() == 4
    assert set(k_names[cls == "normalization"]) == {"aten::native_layer_norm"} and (cls == "normalization").sum() == 10
    # containment alone (no External ids, as in the recorder's path) finds the same ops
    bare = attribute_activity(ops.assign(external_id=-1), launches.assign(external_id=-1), acts)
    assert (bare["op"] == att["op"]).all()


def test_not_a_kineto_file(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(InputError, match="traceEvents"):
        load_kineto(bad)
