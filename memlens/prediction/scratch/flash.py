"""Flash attention backward's own scratch: ``softmax_d`` and ``dq_accum``, which the fake kernel never makes.

From ``mha_bwd`` in torch's aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp (FlashAttention-2
as vendored by PyTorch), for query (batch, heads, seqlen_q, head_dim) in PyTorch's layout:

- ``head_size`` is the head dim padded to a multiple of 8 (the SDPA front end pads it before the kernel);
  ``head_size_rounded`` rounds that up to a multiple of 32 (head size <= 128) or 64 (larger);
  ``seqlen_q_rounded`` rounds the query length up to a multiple of 128;
- after the gradients dq, dk, dv (the op's outputs, which the fake kernel makes), it allocates ``softmax_d``,
  fp32 (batch, heads, seqlen_q_rounded), then ``dq_accum``, fp32 (batch, seqlen_q_rounded, heads,
  head_size_rounded), or with deterministic algorithms fp32 zeros (nsplits, batch, seqlen_q_rounded, heads,
  head_size_rounded) with nsplits = ceil(SM count / (batch x heads)); ``loop`` is always true there;
- both are freed when the op returns (``softmax_d`` is returned to the SDPA wrapper, which drops it).

With grouped key/value heads, ``mha_bwd`` then allocates ``dk_expanded`` / ``dv_expanded``, which the prediction
session makes as two ``aten::empty`` ops right after the backward op (`memlens.prediction.session`); the scratch
is then freed just after them (locals go when ``mha_bwd`` returns), so all four are alive together.

Not modelled: the variable-length (nested tensor) backward ``mha_varlen_bwd``.
"""
from __future__ import annotations


from memlens.prediction.scratch.blocks import events_to_blocks, next_block_id


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def flash_backward_facts(args) -> tuple | None:
    """(batch, heads, seqlen_q, head_dim, deterministic, grouped) of a
    ``_scaled_dot_product_flash_attention_backward`` call from its fake operands (grad_out, query, key, value,
    out, logsumexp, cum_seq_q, ...); grouped: fewer key/value heads than query heads. None for the
    variable-length form (cumulative sequence lengths given) or a query that is not 4-d on cuda."""
    import torch
    query = args[1] if len(args) > 1 else None
    cum_seq_q = args[6] if len(args) > 6 else None
    if not isinstance(query, torch.Tensor) or query.dim() != 4 or query.device.type != "cuda":
        return None
    if cum_seq_q is not None:
        return None
    batch, heads, seqlen_q, head_dim = (int(s) for s in query.shape)
    grouped = isinstance(args[2], torch.Tensor) and int(args[2].shape[-3]) != heads
    return batch, heads, seqlen_q, head_dim, bool(torch.are_deterministic_algorithms_enabled()), grouped


def flash_backward_scratch_bytes(batch: int, heads: int, seqlen_q: int, head_dim: int, deterministic: bool,
                                 sm_count: int) -> tuple[int, int]:
    """(softmax_d bytes, dq_accum bytes) requested by ``mha_bwd`` for these shapes (see the module docstring)."""
    head_size = _round_up(head_dim, 8)
    head_size_rounded = _round_up(head_size, 32 if head_size <= 128 else 64)
    seqlen_q_rounded = _round_up(seqlen_q, 128)
    softmax_d = 4 * batch * heads * seqlen_q_rounded
    dq_accum = 4 * batch * seqlen_q_rounded * heads * head_size_rounded
    if deterministic:
        dq_accum *= -(-int(sm_count) // (batch * heads))
    return softmax_d, dq_accum


def flash_backward_scratch_blocks(trace, facts: dict, sm_count: int, round_size) -> list[dict]:
    """Block rows (category ``workspace``) for every recorded flash attention backward (`facts`: op_id ->
    `flash_backward_facts`): ``softmax_d`` then ``dq_accum`` allocated, ``dq_accum`` then ``softmax_d`` freed,
    inside the op (with grouped heads, freed just after the session's two group buffers); `round_size` maps
    requested bytes to the allocator's."""
    if not facts:
        return []
    ops = trace.ops.set_index("op_id", drop=False)
    next_id = next_block_id(trace)
    rows: list[dict] = []
    for op_id, fact in sorted(facts.items()):
        if op_id not in ops.index:
            continue
        batch, heads, seqlen_q, head_dim, deterministic, grouped = fact
        softmax_d, dq_accum = flash_backward_scratch_bytes(batch, heads, seqlen_q, head_dim, deterministic,
                                                           sm_count)
        events = [("alloc", "softmax_d", softmax_d, "flash_bwd softmax_d"),
                  ("alloc", "dq_accum", dq_accum, "flash_bwd dq_accum"),
                  ("free", "dq_accum"), ("free", "softmax_d")]
        new = events_to_blocks(events, ops.loc[op_id], next_id + len(rows), round_size)
        group_free = _group_buffers_freed(trace, ops, op_id) if grouped else None
        if group_free is not None:
            new[1]["free_ns"], new[0]["free_ns"] = group_free + 1, group_free + 2
        rows += new
    return rows




def _group_buffers_freed(trace, ops, op_id) -> int | None:
    """When the last of the two group buffers the session allocates right after flash backward op `op_id` (the
    next two ``aten::empty`` ops) is freed (ns); None when they are not there or not freed."""
    after = ops[(ops.index > op_id) & (ops.index <= op_id + 2)]
    if len(after) != 2 or not (after["name"] == "aten::empty").all():
        return None
    blocks = trace.blocks
    frees = blocks[blocks["alloc_op_id"].isin(after.index)]["free_ns"]
    if len(frees) != 2 or frees.isna().any():
        return None
    return int(frees.max())
