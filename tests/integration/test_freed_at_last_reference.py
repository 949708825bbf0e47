"""A tensor's block is freed when the program drops its last reference, in memlens.record and memlens.prediction.

The workload is a model head's bf16 logits and a loss made from ``logits.float()`` (the autograd graph saves no
reference to the bf16 logits: the head's matmul saves its input and weight, ToCopyBackward nothing,
log_softmax its fp32 output). Two statement orders: ``del logits`` before ``loss.backward()`` (the block must
go right after the loss's last forward op, before backward starts), and ``F.cross_entropy(...).backward()``
then ``del logits`` (the program holds it through backward: it must go after backward's last op and before
the next op of the program). The references are op names and the program's order, not memlens's output; for
the recorder a weak reference on the real CPU tensor says when torch really let go.
"""
from __future__ import annotations

import inspect

import pytest
import torch

import memlens
from _predict_cases import built_shim, run_child  # noqa: F401  (the shim fixture)

B, S, D, V = 1, 48, 64, 1000
LOGITS_BYTES = B * S * V * 2            # bf16 logits; the head's weight gradient is V * D * 2 = 128,000 B, not this

STEP = f"""
import weakref
import torch
import torch.nn as nn
import torch.nn.functional as F
B, S, D, V = {B}, {S}, {D}, {V}
class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.head = nn.Linear(D, D, bias=False), nn.Linear(D, V, bias=False)
    def forward(self, x):
        return self.head(self.lin(x))
def run(model, dev, order, probe=None):
    x = torch.randn(B, S, D, device=dev, dtype=torch.bfloat16)
    y = torch.randint(0, V, (B * S,), device=dev)
    logits = model(x)
    if probe is not None:
        probe.append(weakref.ref(logits))
    if order == "del_first":
        loss = F.cross_entropy(logits.float().view(-1, V), y)
        del logits
        if probe is not None:
            probe.append(probe[0]() is None)          # really gone at `del`
        loss.backward()
    else:
        F.cross_entropy(logits.view(-1, V).float(), y).backward()
        if probe is not None:
            probe.append(probe[0]() is None)          # still held by `logits` after backward
        del logits
    torch.zeros(7, device=dev).add_(1)                # the program's next ops: the block must be gone by then
"""
_step_names: dict = {}
exec(STEP, _step_names)   # Head and run() here too, for the recorder tests: one source for both paths
Head, run = _step_names["Head"], _step_names["run"]


def free_window(blocks, ops, device: str) -> dict:
    """The logits block's free time (ns, the trace's clock) beside the program's landmarks around it."""
    # a recorded CPU block's size is what was asked; a predicted one is rounded and says the request apart
    asked = blocks["requested_size"] if "requested_size" in blocks else blocks["size"]
    b = blocks[(blocks.device.astype(str) == device) & (blocks.op == "aten::mm") & (asked == LOGITS_BYTES)]
    assert len(b) == 1, b
    assert b.free_ns.notna().all(), "the logits block is never freed in the trace (something kept it alive)"
    names = ops.name.tolist()
    nll = ops[ops.name == "aten::nll_loss_forward"]
    ones = ops[ops.name == "aten::ones_like"]
    marker = ops[ops.name == "aten::zeros"]
    # backward's ops: from the loss gradient's ones_like up to the marker, the step's first op after backward
    bw = ops[(ops.start_ns >= ones.start_ns.iloc[0]) & (ops.index < marker.index[-1])
             & (ops.name != "aten::ones_like")]
    assert len(nll) == 1 and len(ones) == 1 and len(marker) and len(bw), names
    return {"free_ns": int(b.free_ns.iloc[0]), "nll_end": int(nll.end_ns.iloc[0]),
            "ones_start": int(ones.start_ns.iloc[0]), "bw_end": int(bw.end_ns.max()),
            "marker_start": int(marker.start_ns.iloc[-1])}


def check(w: dict, order: str, exact: bool) -> None:
    """del_first: freed after the loss's last forward op and before backward's first; the other order: after
    backward's last op and before the program's next op. ``exact`` (the modeled clock, where frees between ops
    take no time): the free lands on that op's end."""
    if order == "del_first":
        assert w["nll_end"] <= w["free_ns"] <= w["ones_start"], w
        if exact:
            assert w["free_ns"] == w["nll_end"], w
    else:
        assert w["bw_end"] <= w["free_ns"] <= w["marker_start"], w
        if exact:
            assert w["free_ns"] == w["bw_end"], w


@pytest.mark.parametrize("order", ["del_first", "backward_first"])
@pytest.mark.parametrize("backend", ["compiled", "python"])
def test_record_frees_the_logits_when_the_program_drops_them(backend, order):
    model = Head().to(torch.bfloat16)
    probe = []
    with memlens.record(model, backend=backend) as rec:
        run(model, "cpu", order, probe)
    assert probe[1] is (order == "del_first")          # torch's own answer, on the real tensor
    check(free_window(rec.trace.blocks, rec.trace.ops, "cpu"), order, exact=False)


def test_predict_frees_the_logits_when_the_program_drops_them():
    """One GPU, and rank 0 of FSDP2 on 2 ranks (bf16 compute): the block goes at the same point of the program."""
    r = run_child(STEP + inspect.getsource(free_window) + _PREDICT_BODY)
    assert sorted(r) == ["1gpu/backward_first", "1gpu/del_first", "fsdp2/backward_first", "fsdp2/del_first"]
    for key, w in r.items():
        check(w, key.split("/")[1], exact=True)


_PREDICT_BODY = f"""
LOGITS_BYTES = {LOGITS_BYTES}
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
result = {{}}
for order in ("del_first", "backward_first"):
    with memlens.predict(gpu="H100") as p:
        with torch.device("cuda"):
            model = Head().to(torch.bfloat16)
        run(model, "cuda", order)
    result["1gpu/" + order] = free_window(p.trace.blocks, p.trace.ops, "cuda:0")
    def fsdp_step(order=order):
        with torch.device("cuda"):
            model = Head()
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
        fully_shard(model.head, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        run(model, "cuda", order)
    d = memlens.predict(fsdp_step, gpu="H100", world_size=2, ranks="first")
    assert not d.errors, d.errors
    t = d.predictions[0].trace
    result["fsdp2/" + order] = free_window(t.blocks, t.ops, "cuda:0")
"""
