"""The simulated link: the cost model, the queue, and overlap that is real wall-clock overlap."""
import time

import pytest
import torch
import torch.distributed as dist

from workbook import link
from workbook.runtime import launch
from workbook.link import Link, bus_factor, make_link


def test_bus_factors_are_nccl_tests():
    assert bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert bus_factor("reduce_scatter", 3) == pytest.approx(2 / 3)
    assert bus_factor("broadcast", 8) == 1.0
    assert bus_factor("send", 2) == 1.0
    assert bus_factor("barrier", 4) == 0.0
    assert bus_factor("all_reduce", 1) == 0.0


def test_calibration_keeps_the_hardware_ratio():
    lk = make_link("dgx-h100", local_flops=79e9)              # 10^4 times slower than an H100
    assert lk.scale == pytest.approx(1e-4)
    assert lk.bandwidth_Bps == pytest.approx(900e9 * 1e-4)
    assert lk.latency_s == pytest.approx(2e-6 * 1e4)
    # 1 MB all-reduce on 2 ranks: latency + 1e6 * 1 / 90 MB/s
    assert lk.op_time("all_reduce", 10**6, 2) == pytest.approx(0.02 + 1 / 90)
    assert "simulated" in lk.label
    assert make_link("none") is None
    with pytest.raises(ValueError, match="unknown link preset"):
        make_link("carrier-pigeon")


FIXED = Link("dgx-h100", bandwidth_Bps=40e6, latency_s=0.0, local_flops=5e10, scale=1.0)
N = 2 * 10**6            # float32 elements: 8 MB, 0.2 s on FIXED for a 2-rank all-reduce


def timed_ops():
    """Sync, async+compute, and two queued ops, on a link pinned to 0.2 s per all-reduce."""
    link.set_link(FIXED)
    x = torch.ones(N)
    out = {}
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(x)
    out["sync"] = time.perf_counter() - t0
    dist.barrier()
    t0 = time.perf_counter()
    work = dist.all_reduce(x, async_op=True)
    time.sleep(0.2)                                     # independent "compute" of the same length
    work.wait()
    out["async"] = time.perf_counter() - t0
    dist.barrier()
    t0 = time.perf_counter()
    y = torch.ones(N)
    w1 = dist.all_reduce(x, async_op=True)
    w2 = dist.all_reduce(y, async_op=True)
    w1.wait()
    out["first"] = time.perf_counter() - t0
    w2.wait()
    out["second"] = time.perf_counter() - t0
    out["value"] = x[0].item()
    out["log"] = [(r.op, r.size_bytes, r.modelled_ns) for r in link.op_log()]
    return out


def test_async_overlap_is_real_and_the_link_queues():
    res = launch.run(timed_ops, 2, backend="gloo", pool=True)
    for r in res:
        assert r["value"] == 2.0 ** 3
        assert 0.19 < r["sync"] < 0.6
        assert r["async"] < 0.2 * 1.6                  # serial would be 0.4 s
        assert 0.19 < r["first"] < 0.4
        assert r["second"] > 0.39                       # one op at a time on the link
        ops = [op for op, _, _ in r["log"]]
        assert ops.count("all_reduce") == 4
        assert (("all_reduce", 4 * N, int(0.2e9)) in r["log"])


def ops_and_sizes():
    link.set_link(Link("dgx-h100", 1e12, 0.0, 5e10, 1.0))
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.ones(6)
    out = torch.empty(6 * world)
    dist.all_gather_into_tensor(out, x)
    dist.reduce_scatter_tensor(x, out)
    if rank == 0:
        dist.send(x, 1)
    elif rank == 1:
        dist.recv(x, 0)
    dist.broadcast(x, src=0)
    dist.barrier()
    return [(r.op, r.size_bytes, r.group_size) for r in link.op_log()]


def test_every_op_is_charged_with_nccl_tests_sizes():
    logs = launch.run(ops_and_sizes, 3, backend="gloo", pool=True)
    assert logs[0] == [("all_gather", 72, 3), ("reduce_scatter", 72, 3), ("send", 24, 3),
                       ("broadcast", 24, 3), ("barrier", 0, 3)]
    assert logs[1][2] == ("recv", 24, 3)
    assert [op for op, _, _ in logs[2]] == ["all_gather", "reduce_scatter", "broadcast", "barrier"]


def calibrated_presets():
    return launch.context().rank, link.current_link()


def test_all_ranks_share_one_calibration():
    res = launch.shared_pool(2, "gloo").run(calibrated_presets, link="dgx-h100-ib")
    assert res[0][1] == res[1][1]
    assert res[0][1].local_flops == 5e10            # pinned by conftest


def exchange():
    """Both ranks send and receive at once: a full-duplex link carries both in one op time."""
    link.set_link(FIXED)
    peer = 1 - dist.get_rank()
    out, inbox = torch.ones(N), torch.empty(N)
    dist.barrier()
    t0 = time.perf_counter()
    works = [dist.isend(out, peer), dist.irecv(inbox, peer)]
    for w in works:
        w.wait()
    return time.perf_counter() - t0


def test_the_link_is_full_duplex():
    # one 8 MB send at 40 MB/s takes 0.2 s; a send and a receive together take 0.2 s, not 0.4 s
    for seconds in launch.run(exchange, 2, backend="gloo", pool=True):
        assert 0.19 < seconds < 0.32


def late_sender():
    """Rank 1 posts its receive at once; rank 0 computes 0.3 s, then sends."""
    link.set_link(FIXED)
    box = torch.ones(N // 4)                            # 2 MB: 0.05 s on FIXED
    dist.barrier()
    t0 = time.perf_counter()
    if dist.get_rank() == 0:
        time.sleep(0.3)
        dist.send(box, 1)
    else:
        work = dist.irecv(box, 0)
        time.sleep(0.1)                                 # compute that cannot hide a late send
        work.wait()
    rec = [r for r in link.op_log() if r.op in ("send", "recv")][-1]
    return {"seconds": time.perf_counter() - t0, "start_after_issue_s": (rec.start_ns - rec.issued_ns) / 1e9}


def test_an_early_receive_pays_its_transfer_when_the_data_lands():
    # posted at 0, sent at 0.3 s: the transfer runs 0.3-0.35 s, so the wait ends at ~0.35 s, and
    # the link track starts the receive at its arrival, not when it was posted
    _, recv = launch.run(late_sender, 2, backend="gloo", pool=True)
    assert 0.34 < recv["seconds"] < 0.6
    assert recv["start_after_issue_s"] > 0.25


def ops_in_nodes():
    """On 2 simulated nodes of 2: all-reduce inside a node, across nodes, over both; a send
    inside a node and one across. Returns what the rank knows and what the link charged."""
    import torch
    import torch.distributed as dist
    ctx, lk = launch.context(), link.current_link()
    groups = {name: dist.new_group(ranks) for name, ranks in
              [("inside", [0, 1]), ("across", [0, 2]), ("both", [0, 1, 2, 3])]}
    x = torch.ones(4096)
    for name, ranks in [("inside", [0, 1]), ("across", [0, 2]), ("both", [0, 1, 2, 3])]:
        if ctx.rank in ranks:
            dist.all_reduce(x, group=groups[name])
    if ctx.rank in (0, 1, 2):                                 # 0 -> 1 inside, 1 -> 2 across
        if ctx.rank < 2:
            dist.send(x, ctx.rank + 1)
        if ctx.rank > 0:
            dist.recv(x, ctx.rank - 1)
    charged = [(r.op, r.modelled_ns) for r in link.op_log()]
    return (ctx.node, ctx.local_rank, ctx.ranks_per_node, lk.ranks_per_node, charged, lk)


def test_ranks_in_nodes_pay_the_fabric_their_group_spans():
    results = launch.run(ops_in_nodes, 4, backend="gloo", link="dgx-h100", nnodes=2)
    assert [r[:4] for r in results] == [(0, 0, 2, 2), (0, 1, 2, 2), (1, 0, 2, 2), (1, 1, 2, 2)]
    lk = results[0][5]                                         # the calibration the ranks share
    assert lk.topology is not None and "nodes of 2 ranks" in lk.label
    ns = lambda op, ranks: int(lk.op_time(op, 4096 * 4, ranks) * 1e9)          # noqa: E731
    inside, across, both = (ns("all_reduce", g) for g in ([0, 1], [0, 2], [0, 1, 2, 3]))
    assert inside < across and inside < both                   # NVLink beats the network
    charged = [r[4] for r in results]
    assert charged[0][:3] == [("all_reduce", inside), ("all_reduce", across), ("all_reduce", both)]
    assert charged[1][:2] == [("all_reduce", inside), ("all_reduce", both)]
    assert charged[0][3] == ("send", ns("send", [0, 1]))       # inside node 0
    assert charged[1][2:] == [("send", ns("send", [1, 2])), ("recv", ns("send", [0, 1]))]
    assert charged[2][-1] == ("recv", ns("send", [1, 2]))      # across: the card's cost
    assert ns("send", [1, 2]) > ns("send", [0, 1])


def test_nodes_must_split_the_ranks_evenly():
    with pytest.raises(ValueError, match="3 ranks do not split into 2 nodes"):
        launch.run(ops_in_nodes, 3, backend="gloo", nnodes=2)


def every_op_through_host_copies():
    """Each op with every tensor staged through a host copy, as GPU tensors are on gloo-cuda
    ranks (``gloo_backend.needs_host_copy`` says yes to CPU tensors here): results land in the caller's
    tensors, inputs are left alone."""
    from workbook.link import gloo_backend
    staged, real = [], gloo_backend.needs_host_copy
    gloo_backend.needs_host_copy = lambda tensor: staged.append(tensor.numel()) or True
    try:
        got = _every_op()
    finally:
        gloo_backend.needs_host_copy = real             # the pool's rank goes on as it was
    got["staged"] = len(staged)
    return got


def _every_op() -> dict:
    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.arange(6, dtype=torch.float64) + 10 * rank
    got = {}
    t = x.clone(); dist.all_reduce(t); got["all_reduce"] = t
    t = x.clone(); dist.all_reduce(t, async_op=True).wait(); got["all_reduce_async"] = t
    t = x.clone(); dist.broadcast(t, src=1); got["broadcast"] = t
    t = x.clone(); dist.reduce(t, dst=0); got["reduce"] = t if rank == 0 else None
    parts = [torch.empty(6, dtype=torch.float64) for _ in range(n)]
    dist.all_gather(parts, x); got["all_gather"] = torch.cat(parts)
    out = torch.empty(6 * n, dtype=torch.float64)
    dist.all_gather_into_tensor(out, x); got["all_gather_into_tensor"] = out
    piece = torch.empty(6 // n, dtype=torch.float64)
    dist.reduce_scatter_tensor(piece, x); got["reduce_scatter_tensor"] = piece
    gathered = [torch.empty(6, dtype=torch.float64) for _ in range(n)] if rank == 0 else None
    dist.gather(x, gathered, dst=0); got["gather"] = torch.cat(gathered) if rank == 0 else None
    mine = torch.empty(6, dtype=torch.float64)
    dist.scatter(mine, [x + j for j in range(n)] if rank == 0 else None, src=0)
    got["scatter"] = mine
    a2a = torch.empty(6, dtype=torch.float64)
    dist.all_to_all_single(a2a, x); got["all_to_all_single"] = a2a
    inbox, peer = torch.zeros(6, dtype=torch.float64), (rank + 1) % n
    works = [dist.isend(x, peer), dist.irecv(inbox, (rank - 1) % n)]
    for w in works:
        w.wait()
    got["ring_exchange"] = inbox
    got["input_untouched"] = torch.equal(x, torch.arange(6, dtype=torch.float64) + 10 * rank)
    return got


def test_gpu_tensors_go_through_host_copies_with_the_same_results():
    n = 2
    res = launch.run(every_op_through_host_copies, n, backend="gloo", pool=True)
    xs = [torch.arange(6, dtype=torch.float64) + 10 * r for r in range(n)]
    total = sum(xs)
    for rank, got in enumerate(res):
        assert got["input_untouched"], f"rank {rank}: an input was overwritten"
        assert got["staged"] >= 12, f"rank {rank}: only {got['staged']} tensors went through the host"
        expect = {"all_reduce": total, "all_reduce_async": total, "broadcast": xs[1],
                  "reduce": total if rank == 0 else None, "all_gather": torch.cat(xs),
                  "all_gather_into_tensor": torch.cat(xs),
                  "reduce_scatter_tensor": total.view(n, -1)[rank],
                  "gather": torch.cat(xs) if rank == 0 else None, "scatter": xs[0] + rank,
                  "all_to_all_single": torch.cat([x.view(n, -1)[rank] for x in xs]),
                  "ring_exchange": xs[(rank - 1) % n]}
        for op, want in expect.items():
            if want is None:
                assert got[op] is None
            else:
                assert torch.equal(got[op], want), f"rank {rank}: {op}: {got[op]} != {want}"


def traced_ops_measured(trace_dir):
    """No simulated link, ops logged as they really ran (``link.measure_real_ops``, as on GPU
    ranks over gloo): the trace's collectives, named and sized."""
    from workbook import trace
    from workbook.trace.capture import rank_trace
    rank, n = dist.get_rank(), dist.get_world_size()
    link.set_link(None)
    link.measure_real_ops(True)
    try:
        x, out = torch.ones(6), torch.empty(6 * n)
        dist.barrier()
        with rank_trace(trace_dir, lab="link"):
            dist.all_gather_into_tensor(out, x)
            dist.reduce_scatter_tensor(x, out)
            dist.all_reduce(x, async_op=True).wait()
            works = [dist.isend(x, (rank + 1) % n), dist.irecv(torch.empty(6), (rank - 1) % n)]
            for w in works:
                w.wait()
    finally:
        link.measure_real_ops(False)
    t = trace.load_trace(f"{trace_dir}/rank{rank}.trace.json")
    held = [r.link_ns for r in link.op_log() if r.op != "barrier"]
    return trace.collectives(t), held


def test_ops_without_a_link_are_traced_as_they_ran(tmp_path):
    """On GPU ranks over gloo no link is simulated, yet the trace must still say which ops ran
    with how many bytes: a reduce-scatter is not the all-reduce gloo runs it on (first GPU run)."""
    for rank, (got, held) in enumerate(launch.run(traced_ops_measured, 2, str(tmp_path),
                                                  backend="gloo", pool=True)):
        assert len(held) == 5 and all(ns > 0 for ns in held), f"rank {rank}: {held}"
        assert got == {"all_gather": {"count": 1, "bytes": 48},
                       "reduce_scatter": {"count": 1, "bytes": 48},
                       "all_reduce": {"count": 1, "bytes": 24},
                       "send": {"count": 1, "bytes": 24}, "recv": {"count": 1, "bytes": 24}}, \
            f"rank {rank}: {got}"
