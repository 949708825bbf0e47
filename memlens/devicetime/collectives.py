"""Modeled duration of one NCCL collective (ns, modeled GPU clock): ring or double binary tree, the faster per
message as NCCL's tuner picks, and a hierarchical (intra-node then inter-node) form across nodes.

Conventions: S is the message in bytes (all-gather: the gathered output; reduce-scatter: the unreduced input;
all-reduce and broadcast: the tensor); ``bw`` is the link's bytes/s per GPU in one direction, used at
`EFFICIENCY` (0.8); ``lat`` is the latency of one algorithm step (`INTRA_NODE_STEP_NS` over NVLink or PCIe,
`INTER_NODE_STEP_NS` over the network). All constants are assumptions, stated and not fitted.

Within one node (N <= ``gpus_per_node`` ranks, link NVLink, or PCIe without NVLink):

- ring (nccl-tests doc/PERFORMANCE.md): each rank sends ``(N-1)/N x S`` in ``N-1`` steps for all-gather and
  reduce-scatter, twice that for all-reduce (reduce-scatter then all-gather), ``S`` for broadcast (pipelined)::

      ring_ns = f x (N-1)/N x S / (0.8 bw) + f x (N-1) x lat        f = 2 for all-reduce, else 1
      (broadcast: S / (0.8 bw) + (N-1) x lat)

- double binary tree (all-reduce only; NCCL offers trees for all-reduce alone): half the message goes up and
  down each of two binary trees, a rank being interior in one and a leaf in the other, so each rank sends
  ``S/2 + 2 x S/2`` (interior: to its parent, to two children) ``+ S/2`` (leaf) = ``2 S`` and receives as
  much; reduction up then broadcast down crosses ``ceil(log2 N)`` levels each way, pipelined::

      tree_ns = 2 x S / (0.8 bw) + 2 x ceil(log2 N) x lat

  (the tree's bandwidth term is ``N/(N-1)`` times the ring's; it wins for small messages on many ranks). NCCL's
  own tuner (``src/graph/tuning.cc``) agrees on the bandwidth terms: it converts bus bandwidth to algorithm
  bandwidth with the ratio 0.5 for the tree and ``N / (2 (N-1))`` for the ring all-reduce. Its latencies are
  per-protocol tables; here one step latency per link, as for the ring.

- all-to-all (NCCL runs it as grouped sends and receives, one peer offset per round; nccl-tests' bus
  bandwidth for it is the algorithm bandwidth x (N-1)/N): each rank sends ``(N-1)/N x S`` (S: its whole send
  buffer, equal splits) in ``N-1`` rounds, the ring all-gather's formula (algorithm ``"pairwise"``).

Across nodes (N > ``gpus_per_node`` = g, M = ceil(N / g) nodes; each GPU has its own NIC, ``network_bw``, and
talks to the GPUs of the same local rank on the other nodes: rail-aligned), hierarchical, stages in sequence
(not pipelined with each other), each stage ring or tree per the rules above on its own link:

- all-reduce: reduce-scatter of S over the g GPUs of a node (NVLink), all-reduce of S/g over the M nodes
  (network), all-gather of S over the node (NVLink);
- all-gather: all-gather of S/g over the M nodes (network), then of S over the node (NVLink);
- reduce-scatter: reduce-scatter of S over the node (NVLink), then of S/g over the M nodes (network);
- broadcast: S over the M nodes (network), then S over the node (NVLink);
- all-to-all, not staged: the ``(g-1)/N x S`` for the node's other GPUs go over NVLink in ``g-1`` rounds while
  the ``(N-r)/N x S`` for the other nodes' GPUs go over the GPU's NIC in ``N-r`` rounds, r = N - g (M-1) the
  GPUs of the last node (r = g when N is a multiple of g; its GPUs have the most remote peers); it lasts the
  longer.
"""
from __future__ import annotations

import math

EFFICIENCY = 0.8                 # assumed achieved fraction of the link's bus bandwidth (not fitted)
INTRA_NODE_STEP_NS = 1_000.0     # assumed latency per algorithm step over NVLink / PCIe, ns
INTER_NODE_STEP_NS = 5_000.0     # assumed latency per algorithm step over the network, ns
SOURCE = ("ring model and bus-bandwidth convention: nccl-tests doc/PERFORMANCE.md "
          "(https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md); double binary tree for "
          "all-reduce (2 S per rank as in NCCL's src/graph/tuning.cc, 2 ceil(log2 N) steps), the faster of ring and tree per message; across "
          "nodes hierarchical (node, then network per rail, then node); efficiency 0.8 and step latencies "
          "1 us (NVLink) / 5 us (network) are assumptions, not fitted")
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all")


def ring_ns(kind: str, nbytes: float, n: int, bw: float, step_ns: float) -> float:
    """A ring collective of `nbytes` over `n` ranks on a link of `bw` bytes/s per GPU (module docstring), ns."""
    if n <= 1:
        return 0.0
    if kind == "broadcast":
        return nbytes / (EFFICIENCY * bw) * 1e9 + (n - 1) * step_ns
    factor = 2 if kind == "all_reduce" else 1
    return factor * (n - 1) / n * nbytes / (EFFICIENCY * bw) * 1e9 + factor * (n - 1) * step_ns


def tree_ns(nbytes: float, n: int, bw: float, step_ns: float) -> float:
    """A double-binary-tree all-reduce of `nbytes` over `n` ranks (module docstring), ns."""
    if n <= 1:
        return 0.0
    return 2 * nbytes / (EFFICIENCY * bw) * 1e9 + 2 * math.ceil(math.log2(n)) * step_ns


def pairwise_ns(nbytes: float, peers: int, n: int, bw: float, step_ns: float) -> float:
    """The part of an all-to-all of `nbytes` per rank over `n` ranks that goes to `peers` of them over one link
    of `bw` bytes/s per GPU, one peer per round (module docstring), ns."""
    if peers <= 0:
        return 0.0
    return peers / n * nbytes / (EFFICIENCY * bw) * 1e9 + peers * step_ns


def flat_ns(kind: str, nbytes: float, n: int, bw: float, step_ns: float) -> tuple[float, str]:
    """(ns, "ring", "tree" or "pairwise"): the faster algorithm for one message on one link (trees for
    all-reduce only; a tie goes to the ring; all-to-all is pairwise)."""
    if kind == "all_to_all":
        return pairwise_ns(nbytes, n - 1, n, bw, step_ns), "pairwise"
    ring = ring_ns(kind, nbytes, n, bw, step_ns)
    if kind == "all_reduce" and n > 2:
        tree = tree_ns(nbytes, n, bw, step_ns)
        if tree < ring:
            return tree, "tree"
    return ring, "ring"


def intra_link(gpu) -> tuple[float, str]:
    """(bytes/s per GPU, name) of the link between GPUs of one node: NVLink (Infinity Fabric on AMD parts, the
    same field), else the host link (PCIe)."""
    if gpu.nvlink_bw > 0:
        return gpu.nvlink_bw, "Infinity Fabric" if gpu.vendor == "amd" else "NVLink"
    return min(gpu.host_bw), "PCIe"


def network_bw(gpu, world_size: int) -> float:
    """The GPU's network bytes/s per GPU, or a clear error naming the GPU when the table has none."""
    if not gpu.network_bw > 0:
        from memlens.errors import InputError
        raise InputError(f"GPU {gpu.name!r} has no network_bw, so {world_size} ranks (> {gpu.gpus_per_node} per "
                         "node) cannot be timed; give one with memlens.GPU(..., network_bw=bytes/s)")
    return gpu.network_bw


def collective_time(kind: str, nbytes: int, world_size: int, gpu) -> tuple[float, str]:
    """(ns, algorithm) of one collective of `nbytes` over `world_size` ranks of `gpu` (module docstring);
    the algorithm reads e.g. ``"ring"``, ``"tree"`` or ``"hierarchical: ring (node) + tree (network) + ring
    (node)"``. One rank: (0, "none")."""
    if kind not in KINDS:
        raise ValueError(f"unknown collective kind {kind!r} (one of {KINDS})")
    if world_size <= 1:
        return 0.0, "none"
    bw, _ = intra_link(gpu)
    g = max(1, int(gpu.gpus_per_node))
    if world_size <= g:
        return flat_ns(kind, nbytes, world_size, bw, INTRA_NODE_STEP_NS)
    net, m = network_bw(gpu, world_size), math.ceil(world_size / g)
    node = lambda k, s: flat_ns(k, s, g, bw, INTRA_NODE_STEP_NS)          # noqa: E731
    across = lambda k, s: flat_ns(k, s, m, net, INTER_NODE_STEP_NS)       # noqa: E731
    if kind == "all_to_all":
        # the slowest rank bounds it: one on the last node, partly filled when world_size is not a multiple
        # of g, has the fewest node peers and so the most peers across the network
        last_node = world_size - g * (m - 1)
        t = max(pairwise_ns(nbytes, g - 1, world_size, bw, INTRA_NODE_STEP_NS),
                pairwise_ns(nbytes, world_size - last_node, world_size, net, INTER_NODE_STEP_NS))
        return t, "pairwise: node (NVLink) alongside network"
    if kind == "all_reduce":
        stages = [node("reduce_scatter", nbytes), across("all_reduce", nbytes / g), node("all_gather", nbytes)]
        where = ["node", "network", "node"]
    elif kind == "all_gather":
        stages, where = [across("all_gather", nbytes / g), node("all_gather", nbytes)], ["network", "node"]
    elif kind == "reduce_scatter":
        stages, where = [node("reduce_scatter", nbytes), across("reduce_scatter", nbytes / g)], ["node", "network"]
    else:
        stages, where = [across("broadcast", nbytes), node("broadcast", nbytes)], ["network", "node"]
    algo = " + ".join(f"{a} ({w})" for (_, a), w in zip(stages, where))
    return sum(t for t, _ in stages), f"hierarchical: {algo}"


def collective_ns(kind: str, nbytes: int, world_size: int, gpu) -> float:
    """Modeled duration (ns) of one collective: `collective_time` without the algorithm's name."""
    return collective_time(kind, nbytes, world_size, gpu)[0]
