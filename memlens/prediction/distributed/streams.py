"""Which CUDA stream each predicted block was allocated on, so the allocator replay keeps per-stream pools.

PyTorch's caching allocator pools cached blocks per stream: a block freed after use on FSDP2's all-gather
copy-in stream or reduce-scatter stream can only be reused by a later request on that same stream. FSDP2
allocates its all-gather buffers and reduce-scatter inputs inside ``with torch.cuda.stream(...)`` blocks,
which under prediction switch the fake-CUDA shim's current stream (see `environment`), so the stream is known
at each allocation. The recorder keeps no stream per block; `track_allocation_streams` notes it beside the
recording and `apply_streams` writes it into the predicted trace's ``stream`` column (0, the default stream,
for blocks made on it and for blocks first seen as inputs), which `memlens.simulate` replays per stream.
"""
from __future__ import annotations

import torch


def track_allocation_streams(session) -> dict[int, int]:
    """Note the current stream of every block `session` creates from now on; returns the live map
    ``{block_id: stream id}`` (only blocks made on a stream other than the default)."""
    streams: dict[int, int] = {}
    discover = session._discover
    current = torch.accelerator.current_stream

    def discover_with_stream(st, op, t, before):
        bid = discover(st, op, t, before)
        if bid >= 0 and not before:
            sid = current().stream_id
            if sid:
                streams[bid] = int(sid)
        return bid

    session._discover = discover_with_stream     # the recorder looks it up per op: the instance wins
    return streams


def apply_streams(trace, streams: dict[int, int]) -> int:
    """Write `streams` into `trace`'s ``cuda:0`` blocks' ``stream`` column; returns how many blocks moved off
    the default stream."""
    if trace is None or not streams:
        return 0
    blocks = trace.blocks
    mask = (blocks["device"] == "cuda:0") & blocks["block_id"].isin(list(streams))
    blocks.loc[mask, "stream"] = blocks.loc[mask, "block_id"].map(streams).astype("int64")
    return int(mask.sum())
