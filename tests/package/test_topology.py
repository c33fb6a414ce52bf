"""The link with nodes (``workbook.link.topology``): each cost against a value computed by hand.

The fabrics are round numbers so every expected value can be checked on paper: inside a node
100 GB/s and 1 us, between nodes 10 GB/s per rank and 10 us, four ranks per node, S = 1 GB.
"""
import pytest

from workbook.link import make_link
from workbook.link.topology import NETWORK, NVLINK, Fabric, Topology

S = 1e9
TOPO = Topology(4, Fabric(100e9, 1e-6), Fabric(10e9, 10e-6))
NODE0, NODE1 = [0, 1, 2, 3], [4, 5, 6, 7]


def t(op, ranks, size=S):
    return TOPO.time(op, size, ranks)


def test_a_group_inside_one_node_runs_at_the_node_fabric():
    assert t("all_reduce", NODE0) == pytest.approx(1e-6 + 1.5 * S / 100e9)          # 0.015001
    assert t("all_reduce", [4, 5]) == pytest.approx(1e-6 + 1.0 * S / 100e9)         # 0.010001
    assert t("all_gather", NODE1) == pytest.approx(1e-6 + 0.75 * S / 100e9)         # 0.007501
    assert t("send", [2, 3]) == pytest.approx(1e-6 + S / 100e9)
    assert TOPO.fabrics("all_reduce", NODE0) == (NVLINK,)


def test_one_rank_per_node_runs_at_one_network_card():
    assert t("all_reduce", [0, 4]) == pytest.approx(10e-6 + 1.0 * S / 10e9)         # 0.10001
    assert t("all_reduce", [0, 4, 8, 12]) == pytest.approx(10e-6 + 1.5 * S / 10e9)  # 0.15001
    assert t("reduce_scatter", [1, 5]) == pytest.approx(10e-6 + 0.5 * S / 10e9)
    assert t("send", [3, 4]) == pytest.approx(10e-6 + S / 10e9)                     # next node
    assert TOPO.fabrics("send", [3, 4]) == (NETWORK,)


def test_a_group_spanning_both_is_hierarchical():
    both = NODE0 + NODE1                                     # k = 2 nodes, m = 4 ranks each
    # reduce-scatter inside, all-reduce of S/4 across (each rank on its own card), all-gather
    inside = 1e-6 + 0.75 * S / 100e9                         # 0.007501
    assert t("all_reduce", both) == pytest.approx(2 * inside + 10e-6 + 1.0 * (S / 4) / 10e9)
    assert t("all_reduce", both) == pytest.approx(0.040012)
    assert t("all_gather", both) == pytest.approx(inside + 10e-6 + 0.5 * (S / 4) / 10e9)
    assert t("reduce_scatter", both) == pytest.approx(0.020011)
    assert t("broadcast", both) == pytest.approx((1e-6 + S / 100e9) + (10e-6 + S / 10e9))
    assert t("barrier", both) == pytest.approx(11e-6)
    # all-to-all: 3/8 of the buffer over the node, 4/8 over the card, at once: the card decides
    assert t("all_to_all", both) == pytest.approx(10e-6 + 0.5 * S / 10e9)
    assert TOPO.fabrics("all_reduce", both) == (NVLINK, NETWORK)


def test_an_uneven_group_is_costed_at_its_fullest_node():
    ranks = [0, 1, 2, 4]                                     # 3 ranks on node 0, 1 on node 1
    assert TOPO.spread(ranks) == (2, 3)
    expected = 2 * (1e-6 + (2 / 3) * S / 100e9) + 10e-6 + 1.0 * (S / 3) / 10e9
    assert t("all_reduce", ranks) == pytest.approx(expected)


def test_crossing_nodes_costs_more_than_staying_inside():
    assert t("all_reduce", [0, 4]) > t("all_reduce", NODE0 + NODE1) > t("all_reduce", NODE0)
    assert t("all_reduce", [0]) == 0.0


def test_the_dgx_h100_preset_at_full_speed():
    """Calibrated to the H100's own rate, the link is the real machine: NVLink 900 GB/s, one
    400 Gb/s card (50 GB/s) per GPU; 2 nodes of 8 all-reduce 1 GB in 4.45 ms, its network part
    at the node's 400 GB/s (what the flat dgx-h100-ib preset charges for the whole op)."""
    lk = make_link("dgx-h100", 790e12, ranks_per_node=8)
    assert (lk.bandwidth_Bps, lk.network_Bps) == (pytest.approx(900e9), pytest.approx(50e9))
    assert (lk.latency_s, lk.network_latency_s) == (pytest.approx(2e-6), pytest.approx(5e-6))
    both = list(range(16))
    network_part = 5e-6 + 1.0 * (S / 8) / 50e9                # = 5 us + 1 GB / 400 GB/s
    assert network_part == pytest.approx(5e-6 + S / 400e9)
    assert lk.op_time("all_reduce", S, both) == pytest.approx(
        2 * (2e-6 + (7 / 8) * S / 900e9) + network_part)      # 4.453 ms
    assert lk.op_time("all_reduce", S, list(range(8))) == pytest.approx(2e-6 + 1.75 * S / 900e9)
    assert lk.op_time("all_reduce", S, 8) == lk.op_time("all_reduce", S, list(range(8)))


def test_flat_links_ignore_nodes():
    lk = make_link("dgx-h100-ib", 790e12, ranks_per_node=2)  # no network: every pair at 400 GB/s
    assert lk.topology is None
    assert lk.op_time("all_reduce", S, [0, 2]) == pytest.approx(5e-6 + S / 400e9)
    one_node = make_link("dgx-h100", 790e12)                  # ranks_per_node 0: one node
    assert one_node.topology is None
    assert one_node.op_time("send", S, [0, 5]) == pytest.approx(2e-6 + S / 900e9)
