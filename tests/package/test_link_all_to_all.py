"""The simulated link's all-to-all with uneven splits: bound by the busiest rank, on each fabric.

Every expected time is computed by hand from one matrix of rows (4 ranks, rank 3 receives
nothing; a row is 4 float64 = 32 bytes)::

    rows sent   to: r0 r1 r2 r3     sent (off the diagonal)   received (off the diagonal)
    from r0         1  2  1  0      3                          3 (2 + 1 + 0)
    from r1         0  0  3  0      3                          4 (2 + 1 + 1)
    from r2         2  1  0  0      3                          5 (1 + 3 + 1)
    from r3         1  1  1  0      3                          0

One node: the busiest rank is r2, receiving 5 rows (160 B). Two nodes of two ({0, 1}, {2, 3}):
inside the nodes the busiest carries 2 rows (r0 to r1: 64 B); across, r2 receives 4 rows from
node 0 (1 from r0, 3 from r1: 128 B).
"""
import pytest
import torch
import torch.distributed as dist

from workbook import link
from workbook.link import Link
from workbook.link.topology import Fabric, Topology, busiest_rank_bytes
from workbook.runtime import launch

ROWS = [[1, 2, 1, 0], [0, 0, 3, 0], [2, 1, 0, 0], [1, 1, 1, 0]]
ROW_BYTES = 4 * 8
M = [[r * ROW_BYTES for r in row] for row in ROWS]
FLAT = Link("dgx-h100", bandwidth_Bps=1e6, latency_s=1e-3, local_flops=5e10, scale=1.0)
NODES = Link("dgx-h100", bandwidth_Bps=1e6, latency_s=1e-3, local_flops=5e10, scale=1.0,
             ranks_per_node=2, network_Bps=1e5, network_latency_s=2e-3)
FLAT_S = 1e-3 + 160 / 1e6                                 # 1.16 ms: r2 receives 160 B
NODES_S = max(1e-3 + 64 / 1e6, 2e-3 + 128 / 1e5)          # 3.28 ms: the network decides


def test_the_busiest_rank_sets_the_time_on_one_fabric():
    assert busiest_rank_bytes(M) == 160
    assert Fabric(1e6, 1e-3).all_to_all_time(M) == pytest.approx(FLAT_S)
    assert FLAT.all_to_all_time(M, range(4)) == pytest.approx(FLAT_S)
    # a sender can be the busiest: r0 sends 7 rows to the others, nobody receives more than 3
    heavy = [[0, 3, 2, 2], [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]]
    assert busiest_rank_bytes(heavy) == 7
    # nothing sent: the latency alone; one rank: nothing at all
    assert Fabric(1e6, 1e-3).all_to_all_time([[0] * 4] * 4) == pytest.approx(1e-3)
    assert Fabric(1e6, 1e-3).all_to_all_time([[100]]) == 0.0


def test_even_splits_give_the_bus_factor_formula():
    S, n = 8000, 4                                          # S bytes per rank, S / n to each
    even = [[S // n] * n for _ in range(n)]
    assert FLAT.all_to_all_time(even, range(n)) == pytest.approx(FLAT.op_time("all_to_all", S, n))
    assert NODES.all_to_all_time(even, range(n)) == pytest.approx(
        NODES.op_time("all_to_all", S, list(range(n))))


def test_two_nodes_cost_each_fabric_by_its_own_busiest_rank():
    topo = NODES.topology
    assert busiest_rank_bytes(M, lambda s, d: topo.node_of(s) == topo.node_of(d)) == 64
    assert busiest_rank_bytes(M, lambda s, d: topo.node_of(s) != topo.node_of(d)) == 128
    assert NODES.all_to_all_time(M, range(4)) == pytest.approx(NODES_S)
    # the same exchange with a fast network: the node's fabric is now the slower one
    fast = Topology(2, Fabric(1e6, 1e-3), Fabric(1e9, 0.0))
    assert fast.all_to_all_time(M, range(4)) == pytest.approx(1e-3 + 64 / 1e6)
    # one rank per node: every pair crosses the network (ranks 0 and 2 of nodes of two)
    pair = [[5, 7], [0, 1]]
    assert topo.all_to_all_time(pair, [0, 2]) == pytest.approx(2e-3 + 7 * 1.0 / 1e5)


def uneven_exchange(lk):
    """Rank r sends ``ROWS[r][d]`` rows of ``[4]`` float64 to rank d on the link ``lk``; returns
    what it received and the link's record of the exchange."""
    rank = dist.get_rank()
    link.set_link(lk)
    try:
        send = ROWS[rank]
        recv = [ROWS[s][rank] for s in range(4)]
        rows = [torch.full((c, 4), 100.0 * rank + d, dtype=torch.float64)
                for d, c in enumerate(send)]
        out = torch.empty(sum(recv), 4, dtype=torch.float64)
        dist.barrier()
        dist.all_to_all_single(out, torch.cat(rows), recv, send)
        rec = [r for r in link.op_log() if r.op == "all_to_all"][-1]
        return out, (rec.size_bytes, rec.recv_bytes, rec.split_bytes, rec.modelled_ns)
    finally:
        link.set_link(None)


@pytest.mark.parametrize("lk, nnodes, seconds", [(FLAT, 1, FLAT_S), (NODES, 2, NODES_S)],
                         ids=["one-node", "two-nodes"])
def test_all_to_all_single_with_uneven_splits_on_ranks(lk, nnodes, seconds):
    results = launch.run(uneven_exchange, 4, lk, backend="gloo", pool=True, nnodes=nnodes)
    for rank, (out, (sent, received, matrix, modelled_ns)) in enumerate(results):
        want = torch.cat([torch.full((ROWS[s][rank], 4), 100.0 * s + rank, dtype=torch.float64)
                          for s in range(4)])
        assert torch.equal(out, want), f"rank {rank}: received {out.tolist()}"
        assert sent == sum(ROWS[rank]) * ROW_BYTES, f"rank {rank}: sent {sent} B"
        assert received == sum(ROWS[s][rank] for s in range(4)) * ROW_BYTES
        assert matrix == tuple(tuple(b) for b in M), f"rank {rank}: matrix {matrix}"
        assert modelled_ns == int(seconds * 1e9), f"rank {rank}: {modelled_ns} ns"
    assert results[3][0].shape == (0, 4)                    # rank 3 received nothing


def traced_exchange(trace_dir):
    """The uneven exchange inside a profiled block: the trace's link span and its collectives."""
    import json

    from workbook import trace
    from workbook.trace.capture import rank_trace
    rank = dist.get_rank()
    link.set_link(FLAT)
    try:
        send, recv = ROWS[rank], [ROWS[s][rank] for s in range(4)]
        out = torch.empty(sum(recv), 4, dtype=torch.float64)
        dist.barrier()
        with rank_trace(trace_dir, lab="link"):
            dist.all_to_all_single(out, torch.ones(sum(send), 4, dtype=torch.float64), recv, send)
    finally:
        link.set_link(None)
    path = f"{trace_dir}/rank{rank}.trace.json"
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    spans = [e["args"] for e in events if e.get("cat") == "link" and e.get("name") == "all_to_all"]
    return spans, trace.collectives(trace.load_trace(path))


def test_the_trace_carries_each_ranks_bytes(tmp_path):
    """What a grader reads: the link span of the all-to-all names the bytes the rank sent and
    received, and the matrix; the trace's collectives count the bytes sent."""
    for rank, (spans, collectives) in enumerate(launch.run(traced_exchange, 4, str(tmp_path),
                                                           backend="gloo", pool=True)):
        assert len(spans) == 1, f"rank {rank}: {len(spans)} all-to-all spans"
        args = spans[0]
        assert args["bytes"] == sum(ROWS[rank]) * ROW_BYTES
        assert args["recv_bytes"] == sum(ROWS[s][rank] for s in range(4)) * ROW_BYTES
        assert args["split_bytes"] == M
        assert args["modelled_us"] == pytest.approx(FLAT_S * 1e6, abs=1e-3)
        assert collectives["all_to_all"]["count"] == 1
        assert collectives["all_to_all"]["bytes"] == sum(ROWS[rank]) * ROW_BYTES


def measured_exchange_through_host_copies():
    """The exchange as gloo-cuda ranks run it: every tensor staged through a host copy
    (``gloo_backend.needs_host_copy`` says yes to CPU tensors here), no link modelled, each op
    logged as it really ran."""
    from workbook.link import gloo_backend
    rank, real = dist.get_rank(), gloo_backend.needs_host_copy
    gloo_backend.needs_host_copy = lambda tensor: True
    link.set_link(None)
    link.measure_real_ops(True)
    try:
        send, recv = ROWS[rank], [ROWS[s][rank] for s in range(4)]
        out = torch.empty(sum(recv), 4, dtype=torch.float64)
        dist.all_to_all_single(out, torch.full((sum(send), 4), float(rank), dtype=torch.float64),
                               recv, send)
        rec = [r for r in link.op_log() if r.op == "all_to_all"][-1]
        return out, rec.size_bytes, rec.recv_bytes, rec.split_bytes, rec.measured
    finally:
        link.measure_real_ops(False)
        gloo_backend.needs_host_copy = real


def test_gpu_ranks_path_records_the_bytes_without_a_model():
    for rank, (out, sent, received, matrix, measured) in enumerate(
            launch.run(measured_exchange_through_host_copies, 4, backend="gloo", pool=True)):
        want = torch.cat([torch.full((ROWS[s][rank], 4), float(s), dtype=torch.float64)
                          for s in range(4)])
        assert torch.equal(out, want), f"rank {rank}: {out.tolist()}"
        assert (sent, received) == (sum(ROWS[rank]) * ROW_BYTES,
                                    sum(ROWS[s][rank] for s in range(4)) * ROW_BYTES)
        assert matrix is None and measured          # nothing modelled: no splits swapped
