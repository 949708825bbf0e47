"""Categories of the blocks a predicted step made on the CPU and moved onto the GPU.

``model = Net(); model.cuda()`` builds each parameter on the CPU and copies it in (``aten::_to_copy``); the
recorder learns which tensors are parameters (or buffers) only once they are on the GPU, so the CPU originals,
freed by the move, would be left "unknown". A CPU block that a copy op read to make a GPU parameter (buffer)
is that parameter's (buffer's) earlier self and takes its category.
"""
from __future__ import annotations

COPY_OPS = frozenset({"aten::_to_copy", "aten::copy_", "aten::to"})
MOVED_CATEGORIES = ("parameter", "buffer")


def categorise_moved_in(trace) -> int:
    """Give each "unknown" CPU block that a copy op moved into a GPU parameter or buffer that block's
    category, in place; returns how many blocks changed."""
    blocks, ops, acc = trace.blocks, trace.ops, trace.accesses
    if len(blocks) == 0 or len(acc) == 0:
        return 0
    copies = ops.loc[ops["name"].isin(COPY_OPS), "op_id"]
    moved = acc[acc["op_id"].isin(copies)]
    if len(moved) == 0:
        return 0
    by_id = blocks.set_index("block_id")
    device, category = by_id["device"].astype(str), by_id["category"].astype(str)
    written = moved[moved["is_write"]]
    target = written[written["block_id"].map(device).str.startswith("cuda")
                     & written["block_id"].map(category).isin(MOVED_CATEGORIES)]
    op_category = target.groupby("op_id")["block_id"].first().map(category)
    read = moved[~moved["is_write"] & moved["op_id"].isin(op_category.index)]
    read = read[(read["block_id"].map(device) == "cpu") & (read["block_id"].map(category) == "unknown")]
    if len(read) == 0:
        return 0
    new = dict(zip(read["block_id"], read["op_id"].map(op_category)))
    hit = blocks["block_id"].isin(new.keys())
    blocks.loc[hit, "category"] = blocks.loc[hit, "block_id"].map(new)
    return int(hit.sum())
