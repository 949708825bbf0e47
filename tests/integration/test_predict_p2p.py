"""Async sends under prediction keep the sent tensor alive until the work is waited, as NCCL's stash does; the
bytes are worked out by hand here (1 MiB fp32 tensors: 256 Ki elements x 4 B, no allocator rounding)."""
from __future__ import annotations

import pytest

from _predict_cases import built_shim, run_child  # noqa: F401  (the shim fixture)

MIB = 1 << 20


@pytest.mark.parametrize("batch", [False, True])
def test_a_sent_tensor_lives_until_its_work_is_waited(batch):
    r = run_child(f"""
import torch.distributed as dist
N = 256 * 1024
def step():
    if dist.get_rank() == 0:
        t = torch.empty(N, device="cuda")
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, 1)]) if {batch} else [dist.isend(t, dst=1)]
        held = [w.held_bytes() for w in works]
        del t                                 # the program drops it: the work still holds it
        u = torch.empty(N, device="cuda")     # so this cannot reuse its block
        for w in works:
            w.wait()                          # released here
        after = [w.held_bytes() for w in works]
        del u
        v = torch.empty(N, device="cuda")     # reuses a freed block: no new peak
        out.update(held=held, after=after)
    else:
        r = torch.empty(N, device="cuda")
        dist.irecv(r, src=0).wait()
out = {{}}
d = memlens.predict(step, gpu="H100", world_size=2, ranks="all")
b = d.predictions[0].trace.blocks
b = b[b.device == "cuda:0"].sort_values("alloc_seq")
result = {{"errors": d.errors, "peaks": [x.peak_allocated for x in d.results], **out,
          "seq": b[["alloc_seq", "free_seq"]].astype(int).values.tolist()}}
""")
    assert r["errors"] == {}
    assert r["held"] == [MIB] and r["after"] == [0]
    # rank 0: t (1 MiB) still held when u (1 MiB) is made: 2 MiB; without the hold it would be 1 MiB.
    # rank 1: its receive buffer, 1 MiB
    assert r["peaks"] == [2 * MIB, MIB]
    (t_alloc, t_free), (u_alloc, u_free), (v_alloc, _) = r["seq"]
    assert t_alloc < u_alloc < t_free < u_free < v_alloc    # t freed at the wait, after u exists
