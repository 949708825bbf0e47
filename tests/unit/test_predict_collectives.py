"""Collective algorithms (memlens.devicetime.collectives): ring, double binary tree, hierarchical,
each compared with the formula worked by hand here (0.8 x link bandwidth, 1 us NVLink / 5 us network steps)."""
import pytest

from memlens.devicetime.gpus import gpu
from memlens.devicetime.collectives import collective_time, ring_ns, tree_ns

H100 = gpu("H100")          # NVLink 450 GB/s, network 50 GB/s per GPU, 8 GPUs per node
NVL, NET = 0.8 * 450e9, 0.8 * 50e9


def test_ring_and_tree_formulas_by_hand():
    # ring all-reduce, 8 ranks, 1 MB: 2 x 7/8 x 1 MB / 360 GB/s + 14 steps x 1 us
    assert ring_ns("all_reduce", 1e6, 8, 450e9, 1_000) == pytest.approx(2 * 7 / 8 * 1e6 / NVL * 1e9 + 14_000)
    # tree: 2 x 1 MB / 360 GB/s + 2 x log2(8) = 6 steps
    assert tree_ns(1e6, 8, 450e9, 1_000) == pytest.approx(2e6 / NVL * 1e9 + 6_000)
    # ceil(log2 5) = 3 levels
    assert tree_ns(1e6, 5, 450e9, 1_000) == pytest.approx(2e6 / NVL * 1e9 + 6_000)
    # broadcast: the whole message once (pipelined), N-1 steps
    assert ring_ns("broadcast", 1e6, 4, 450e9, 1_000) == pytest.approx(1e6 / NVL * 1e9 + 3_000)


def test_the_faster_algorithm_is_chosen_per_message():
    # 1 MB on 8 ranks: ring 4.861 + 14 = 18.861 us, tree 5.556 + 6 = 11.556 us -> tree
    t, algo = collective_time("all_reduce", 1_000_000, 8, H100)
    assert algo == "tree" and t == pytest.approx(2e6 / NVL * 1e9 + 6_000)
    # 100 MB on 8 ranks: ring 486.1 + 14 us, tree 555.6 + 6 us -> ring
    t, algo = collective_time("all_reduce", 100_000_000, 8, H100)
    assert algo == "ring" and t == pytest.approx(2 * 7 / 8 * 1e8 / NVL * 1e9 + 14_000)
    # trees only for all-reduce; two ranks: the ring (half the bytes per rank)
    assert collective_time("all_gather", 1_000, 8, H100)[1] == "ring"
    assert collective_time("all_reduce", 1_000, 2, H100) == (pytest.approx(2 * 0.5 * 1_000 / NVL * 1e9 + 2_000),
                                                             "ring")
    assert collective_time("all_reduce", 1_000, 1, H100) == (0.0, "none")


def test_hierarchical_across_nodes_by_hand():
    S = 48_000_000
    # 16 ranks = 2 nodes of 8. all-reduce: node reduce-scatter (7/8 S over NVLink, 7 steps), network
    # all-reduce of S/8 over 2 nodes (ring: 2 x 1/2 x S/8 / 40 GB/s + 2 x 5 us), node all-gather
    node = 7 / 8 * S / NVL * 1e9 + 7_000
    net = 2 * 0.5 * (S / 8) / NET * 1e9 + 10_000
    t, algo = collective_time("all_reduce", S, 16, H100)
    assert t == pytest.approx(2 * node + net) and t == pytest.approx(407_333.33, abs=0.01)
    assert algo == "hierarchical: ring (node) + ring (network) + ring (node)"
    # all-gather: network all-gather of S/8 over 2 nodes, then the node's all-gather of S
    t, algo = collective_time("all_gather", S, 16, H100)
    assert t == pytest.approx(0.5 * S / 8 / NET * 1e9 + 5_000 + node)
    assert algo == "hierarchical: ring (network) + ring (node)"
    # reduce-scatter: the same stages in the other order
    assert collective_time("reduce_scatter", S, 16, H100)[0] == pytest.approx(0.5 * S / 8 / NET * 1e9 + 5_000 + node)
    # 64 KiB on 64 ranks (8 nodes): the network stage (8 KiB over 8 nodes) takes the tree:
    # ring 2 x 7/8 x 8192 / 40 GB/s + 14 x 5 us = 70.36 us; tree 2 x 8192 / 40 GB/s + 2 x 3 x 5 us = 30.41 us
    t, algo = collective_time("all_reduce", 65_536, 64, H100)
    node = 7 / 8 * 65_536 / NVL * 1e9 + 7_000
    assert t == pytest.approx(2 * node + 2 * 8_192 / NET * 1e9 + 30_000)
    assert t == pytest.approx(44_728.18, abs=0.01)
    assert algo == "hierarchical: ring (node) + tree (network) + ring (node)"


def test_a_gpu_without_nvlink_uses_its_host_link_within_a_node():
    pcie = gpu("L4")
    assert pcie.nvlink_bw == 0
    t, algo = collective_time("all_gather", 1_000_000, 4, pcie)
    assert algo == "ring" and t == pytest.approx(0.75 * 1e6 / (0.8 * min(pcie.host_bw)) * 1e9 + 3_000)


def test_all_to_all_by_hand_within_and_across_nodes():
    S = 48_000_000
    # 8 ranks on NVLink: each sends 7/8 of its buffer, one peer per round: 7/8 x 48 MB / 360 GB/s + 7 x 1 us
    assert collective_time("all_to_all", S, 8, H100) == (pytest.approx(7 / 8 * S / NVL * 1e9 + 7_000), "pairwise")
    # 16 ranks on 2 nodes: 7/16 of it to the node's 7 other GPUs over NVLink (7 rounds of 1 us) while 8/16 go to
    # the other node over the NIC (8 rounds of 5 us); the NIC's part is the longer
    nvlink = 7 / 16 * S / NVL * 1e9 + 7_000
    network = 8 / 16 * S / NET * 1e9 + 40_000
    t, algo = collective_time("all_to_all", S, 16, H100)
    assert network > nvlink and t == pytest.approx(network) and algo.startswith("pairwise")
    assert collective_time("all_to_all", S, 1, H100) == (0.0, "none")
