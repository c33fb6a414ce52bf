"""The capstone's given pieces: the mesh (``workbook.capstone.mesh``), its ``as_world`` scope on
4 ranks of the package's runtime (the rank pool, the simulated link's ``gloo_link`` backend, the
profiler trace), the setup's bad input, and which earlier pieces are the learner's own
(``workbook.capstone.pieces``)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_mesh_sizes_and_rank_lists_are_checked_in_one_line():
    from workbook.capstone.mesh import check_mesh_sizes, check_rank_lists
    for args, words in (((4, 3, 2), "must multiply to the world size"),
                        ((4, 0, 4), "inner=0 must be a positive integer"),
                        ((6, 4, 2), "4 x 2 = 8 ranks")):
        with pytest.raises(ValueError) as exc:
            check_mesh_sizes(*args)
        assert words in str(exc.value) and "\n" not in str(exc.value)
    check_rank_lists(4, 2, 2, [[0, 1], [2, 3]], [[0, 2], [1, 3]])
    with pytest.raises(ValueError, match="cover"):
        check_rank_lists(4, 2, 2, [[0, 1], [2, 3]], [[0, 2], [0, 3]])


def test_a_setup_that_does_not_split_is_a_one_line_error():
    from workbook.capstone.capstone_train import TrainSetup
    setup = TrainSetup()
    setup.check("tp", 2, 2).check("pp", 2, 2)
    cases = [(TrainSetup(batch=6), "tp", 2, 4, "do not split into dp=4 equal DP shards"),
             (TrainSetup(batch=6), "pp", 2, 2, "a DP shard of 3 rows does not cut into micro_batches=2"),
             (TrainSetup(cfg=setup.cfg.replace(n_layers=3)), "pp", 2, 2,
              "n_layers=3 layers do not split into pp=2 stages"),
             (TrainSetup(cfg=setup.cfg.replace(seq_len=15)), "tp", 2, 2, "seq_len=15"),
             (setup, "cp", 2, 2, "use 'tp' or 'pp'")]
    for s, kind, inner, dp, words in cases:
        with pytest.raises(ValueError) as exc:
            s.check(kind, inner, dp)
        assert words in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_the_schedule_warms_up_then_decays_to_min_lr():
    from workbook.capstone.capstone_train import TrainSetup, reference_lr
    s = TrainSetup()
    lrs = [reference_lr(k, s) for k in range(s.steps + 2)]
    assert lrs[0] == pytest.approx(s.max_lr / s.warmup) and lrs[s.warmup - 1] == s.max_lr
    assert lrs[s.warmup] == pytest.approx(s.max_lr) and lrs[s.steps] == pytest.approx(s.min_lr)
    assert all(a >= b for a, b in zip(lrs[s.warmup:], lrs[s.warmup + 1:]))


def test_bus_bytes_follow_nccl_tests():
    from workbook.capstone.capstone_traffic import bus_bytes
    assert bus_bytes("all_reduce", 1000, 2) == 1000 and bus_bytes("all_reduce", 1200, 4) == 1800
    assert bus_bytes("all_gather", 1000, 2) == 500 and bus_bytes("reduce_scatter", 900, 3) == 600
    assert bus_bytes("send", 7, 2) == 7 and bus_bytes("recv", 7, 2) == 0


def _as_world_probe(trace_dir):
    """On 4 ranks: TP-group collectives with no group=, an explicit DP all-reduce inside the
    scope, group-local p2p, the default restored after an exception, the trace's link ranks."""
    import torch
    import torch.distributed as dist

    from workbook import link
    from workbook.capstone.mesh import Mesh
    from workbook.trace.capture import rank_trace
    rank = dist.get_rank()
    mesh = Mesh.build("tp", 2, 2, [[0, 1], [2, 3]], [[0, 2], [1, 3]])
    out = {"coords": (mesh.inner_rank, mesh.dp_rank)}
    with rank_trace(trace_dir, lab="mesh"):
        with mesh.as_world(mesh.inner_group):
            out["local"] = (dist.get_rank(), dist.get_world_size())
            t = torch.tensor([float(rank)])
            dist.all_reduce(t)
            rs = torch.empty(1)
            dist.reduce_scatter_tensor(rs, torch.tensor([float(rank), 10.0 * rank]))
            u = torch.tensor([float(rank)])
            work = dist.all_reduce(u, group=mesh.dp_group, async_op=True)
            r, n = dist.get_rank(), dist.get_world_size()
            recv = torch.empty(1)
            for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.tensor([100.0 + rank]),
                                                        (r + 1) % n),
                                             dist.P2POp(dist.irecv, recv, (r - 1) % n)]):
                w.wait()
            work.wait()
            out.update(tp_sum=t.item(), rs=rs.item(), dp_sum=u.item(), ring=recv.item())
        try:
            with mesh.as_world(mesh.dp_group):
                raise KeyError("inside")
        except KeyError:
            pass
        out["after"] = (dist.get_rank(), dist.get_world_size())
    events = json.load(open(os.path.join(trace_dir, f"rank{rank}.trace.json")))
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    out["trace"] = sorted({(e["name"], tuple(sorted(e["args"]["ranks"]))) for e in events
                           if e.get("cat") == "link"})
    out["log"] = sorted({(r.op, tuple(sorted(r.ranks))) for r in link.op_log()
                         if r.op != "barrier"})
    return out


def test_as_world_runs_world_code_in_a_subgroup_on_4_ranks(tmp_path):
    from workbook.runtime.launch import run
    res = run(_as_world_probe, 4, str(tmp_path), link="dgx-h100", timeout=120, pool=True)
    for rank, r in enumerate(res):
        tp = [0, 1] if rank < 2 else [2, 3]
        dp = [rank % 2, rank % 2 + 2]
        assert r["coords"] == (rank % 2, rank // 2) and r["local"] == (rank % 2, 2)
        assert r["tp_sum"] == sum(tp) and r["dp_sum"] == sum(dp)
        assert r["rs"] == (tp[0] + tp[1] if rank % 2 == 0 else 10.0 * (tp[0] + tp[1]))
        assert r["ring"] == 100.0 + tp[1 - rank % 2]
        assert r["after"] == (rank, 4)
        assert ("all_reduce", tuple(tp)) in r["trace"] and ("all_reduce", tuple(dp)) in r["trace"]
        assert ("reduce_scatter", tuple(tp)) in r["trace"] and ("send", tuple(tp)) in r["trace"]
        assert set(r["trace"]) <= set(r["log"])           # the trace's spans: the link's log


def test_a_folder_without_the_earlier_labs_gets_the_stand_ins(monkeypatch):
    from workbook.capstone.pieces import load_pieces
    from workbook.grading.labs import ENV_IMPL
    monkeypatch.setenv(ENV_IMPL, str(ROOT / "tests" / "grading" / "wrong" / "capstone_same_shard"))
    pieces = load_pieces("tp_block", "make_buckets", "schedule", "executor")
    assert not any(p.own for p in pieces.values())
    assert "tp_overlap is unfinished (no tp_overlap.py in the implementation under test): the " \
           "package's reference stands in for tp_block (no points for the TP overlap check)" \
           == pieces["tp_block"].note
    monkeypatch.setenv(ENV_IMPL, "labs")                        # the stubs of the release
    pieces = load_pieces("tp_block", "make_buckets", "schedule", "executor")
    assert not any(p.own for p in pieces.values())
    assert "still a stub" in pieces["tp_block"].note
    assert "make_buckets raises NotImplementedError" in pieces["make_buckets"].note or \
        "make_buckets still a stub" in pieces["make_buckets"].note
    monkeypatch.setenv(ENV_IMPL, "solutions")
    assert all(p.own for p in load_pieces("tp_block", "make_buckets", "schedule",
                                          "executor").values())
