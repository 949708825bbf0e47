"""Hierarchical collectives at world sizes that are not a multiple of the node size, by hand.

A GPU of round links: NVLink 100 GB/s (80 GB/s at the 0.8 efficiency), network 25 GB/s (20 GB/s), 8 GPUs per
node; step latencies 1 us (node) and 5 us (network). 12 ranks = 2 nodes (8 + 4), M = ceil(12 / 8) = 2.
"""
from __future__ import annotations

import pytest

from memlens.devicetime.collectives import collective_time
from memlens.devicetime.gpu import GPU

LINKS = GPU(name="links", flops={"bf16": 1e15, "fp32": 1e14}, mem_bw=1e12, launch_ns=1000.0, compute_units=4,
            gemm_floor_ns=2000.0, gemm_k_ns=0.01, attention_floor_ns=3000.0, gemm_efficiency=1.0,
            attention_efficiency=1.0, mem_efficiency=1.0, misaligned_gemm_penalty=2.0, norm_efficiency=0.4,
            softmax_block_efficiency=0.2, pageable_bw=11e9, host_bw=(25e9, 25e9), nvlink_bw=1e11,
            network_bw=2.5e10, gpus_per_node=8)


@pytest.mark.parametrize("world", [9, 12, 15])
def test_all_reduce_over_a_partly_filled_last_node(world):
    """S = 1.6 GB over 2 nodes: reduce-scatter over the node's 8 (ring: 7/8 x S / 80 GB/s = 17.5 ms + 7 x 1 us),
    all-reduce of S/8 = 200 MB over the 2 nodes (ring, a tree needs 3: 2 x 1/2 x 200 MB / 20 GB/s = 10 ms +
    2 x 5 us), all-gather over the node (17.507 ms). Total 45.024 ms, for 9, 12 or 15 ranks alike.
    Mutant killed: the node count as ``world_size // g`` (1 node: the network stage vanishes, 35.014 ms)."""
    t, algo = collective_time("all_reduce", 1_600_000_000, world, LINKS)
    assert t == pytest.approx(17_507_000 + 10_010_000 + 17_507_000, rel=1e-12)
    assert algo == "hierarchical: ring (node) + ring (network) + ring (node)"


def test_all_gather_over_three_nodes_of_17_ranks():
    """17 ranks = 3 nodes (8 + 8 + 1). All-gather of S = 2.4 GB: S/8 = 300 MB over 3 nodes (ring: 2/3 x
    300 MB / 20 GB/s = 10 ms + 2 x 5 us), then S over the node (7/8 x 2.4 GB / 80 GB/s = 26.25 ms + 7 us).
    Mutant killed: ``world_size // g`` nodes (2: 1/2 x 300 MB / 20 GB/s = 7.5 ms + 5 us)."""
    t, algo = collective_time("all_gather", 2_400_000_000, 17, LINKS)
    assert t == pytest.approx(10_010_000 + 26_257_000, rel=1e-12)
    assert algo == "hierarchical: ring (network) + ring (node)"


def test_all_to_all_is_bounded_by_the_ranks_of_the_partly_filled_node():
    """12 ranks (8 + 4), S = 1.2 GB per rank, 1/12 of it to each rank. A rank of the 4-GPU node has 3 node
    peers and 8 remote ones: 8/12 x 1.2 GB / 20 GB/s = 40 ms + 8 x 5 us, longer than a full node's rank
    (7 node peers: 7/12 x 1.2 GB / 80 GB/s = 8.75 ms + 7 us; 4 remote: 20.02 ms).
    Mutant killed (and the bug this test found): remote peers taken as ``N - g`` = 4 for every rank
    (20.02 ms)."""
    t, algo = collective_time("all_to_all", 1_200_000_000, 12, LINKS)
    assert t == pytest.approx(40_040_000, rel=1e-12)
    assert algo == "pairwise: node (NVLink) alongside network"
    # 16 ranks fill both nodes: 8 remote peers for everyone, 8/16 x 60 ms + 40 us
    assert collective_time("all_to_all", 1_200_000_000, 16, LINKS)[0] == pytest.approx(30_040_000, rel=1e-12)


@pytest.mark.parametrize("kind, nbytes, world, algo", [
    ("all_gather", 8_000_000, 16, "hierarchical: ring (network) + ring (node)"),
    ("reduce_scatter", 8_000_000, 16, "hierarchical: ring (node) + ring (network)"),
    ("broadcast", 8_000_000, 16, "hierarchical: ring (network) + ring (node)"),
    ("all_reduce", 8_000, 32, "hierarchical: ring (node) + tree (network) + ring (node)"),
    ("all_to_all", 8_000, 12, "pairwise: node (NVLink) alongside network"),
])
def test_each_hierarchical_algorithm_names_its_stages_and_their_links(kind, nbytes, world, algo):
    """The order of the stages and the link each runs on, by hand: an all-gather gathers the node shards
    across the network first, a reduce-scatter reduces in the node first, a broadcast crosses the network
    first. The all-reduce of 8 kB over 4 nodes takes the tree across them: 2 x 1 kB / 20 GB/s + 2 x 2 x 5 us
    = 20.1 us against the ring's 2 x 3/4 x 1 kB / 20 GB/s + 2 x 3 x 5 us = 30.075 us.
    Mutants killed: a stage's link label or its order changed (the time is the same sum)."""
    assert collective_time(kind, nbytes, world, LINKS)[1] == algo


def test_a_broadcast_across_nodes_sends_the_whole_message_on_each_link():
    """8 MB from one rank to 16 (2 nodes): across the network a ring broadcast pipelines the whole message
    (8 MB / 20 GB/s = 400 us + 1 x 5 us), then within each node (8 MB / 80 GB/s = 100 us + 7 x 1 us):
    512 us, not the (n - 1) / n share of a gather.
    Mutant killed: the network stage timed as another kind (a 1/2 share: 312 us)."""
    t, _ = collective_time("broadcast", 8_000_000, 16, LINKS)
    assert t == pytest.approx(405_000 + 107_000, rel=1e-12)
