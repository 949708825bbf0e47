"""NCCL's own device memory per rank: an explicit, stated allowance (NCCL allocates it with cudaMalloc, outside
PyTorch's caching allocator, so it is never in a trace; it counts against the device's capacity only).

The model: each channel of a ring keeps a receive buffer of ``NCCL_BUFFSIZE`` bytes for each of its two ring
neighbours, so ``bytes = NCCL_BUFFSIZE x channels x 2``. ``NCCL_BUFFSIZE`` defaults to 4,194,304 bytes
(4 MiB) per the NCCL user guide, "Environment Variables", NCCL_BUFFSIZE
(https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html); the environment's value is used when
set. The channel count is NCCL's own choice at run time (it depends on the topology: NVLink systems use more);
16 is an assumption, overridable. LL/LL128 protocol buffers, proxy and network-plugin memory, and one such
allowance per extra communicator (each process group / mesh dimension has its own) are not included. A world
of one rank has no ring neighbours: 0 bytes.
"""
from __future__ import annotations

import os

NCCL_BUFFSIZE_DEFAULT = 4 * 1024 * 1024     # bytes, NCCL user guide: NCCL_BUFFSIZE default
DEFAULT_CHANNELS = 16                        # an assumption: NCCL picks the channel count per topology
SOURCE = ("NCCL user guide, Environment Variables, NCCL_BUFFSIZE (default 4194304 bytes): "
          "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html")


def nccl_allowance(world_size: int, channels: int = DEFAULT_CHANNELS, buffsize: int | None = None) -> dict:
    """NCCL's device memory per rank for a world of `world_size` ranks (bytes) and how it was reckoned:
    ``{"bytes", "buffsize", "channels", "peers", "formula", "source"}``."""
    if buffsize is None:
        env = os.environ.get("NCCL_BUFFSIZE")
        buffsize = int(env) if env and env.strip().isdigit() else NCCL_BUFFSIZE_DEFAULT
    peers = 0 if world_size <= 1 else 2
    return {"bytes": int(buffsize) * int(channels) * peers, "buffsize": int(buffsize), "channels": int(channels),
            "peers": peers, "formula": "NCCL_BUFFSIZE x channels x ring neighbours (0 for one rank)",
            "source": SOURCE}
