"""The launcher's promises: results back, the real error back, no hang, nothing left running."""
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from workbook.runtime import launch
from workbook.runtime.launch import RankFailed, RankPool, RanksTimedOut


def rank_and_sum():
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return dist.get_rank(), t.item(), launch.context().world_size


def fail_on_rank_one():
    if dist.get_rank() == 1:
        raise KeyError("rank one cannot find its key")
    t = torch.ones(4)
    dist.all_reduce(t)            # peers block here; they see the connection close, not the bug
    dist.all_reduce(t)
    return "unreachable"


def never_returns_on_rank_one():
    if dist.get_rank() == 1:
        time.sleep(3600)
    dist.barrier()


def mismatched():
    t = torch.ones(8)
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)


def dies_on_rank_one():
    if dist.get_rank() == 1:
        os._exit(3)
    dist.barrier()


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, "gloo") as p:
        yield p


def test_results_from_every_rank(pool):
    assert pool.run(rank_and_sum) == [(0, 1.0, 2), (1, 1.0, 2)]


def test_functions_defined_in_a_notebook_travel_by_value(pool):
    offset = 10
    assert pool.run(lambda: dist.get_rank() + offset) == [10, 11]


def test_the_failing_ranks_own_exception_comes_back(pool):
    t0 = time.monotonic()
    with pytest.raises(KeyError, match="rank one cannot find its key") as info:
        pool.run(fail_on_rank_one, timeout=60)
    assert time.monotonic() - t0 < 10
    assert any("rank 1 of 2" in n for n in info.value.__notes__)
    assert "fail_on_rank_one" in str(info.value.__cause__)        # the rank's own traceback
    assert pool.run(rank_and_sum)[1] == (1, 1.0, 2)               # the pool recovered


def test_a_hang_ends_with_a_report_and_no_survivors():
    p = RankPool(2, "gloo")
    t0 = time.monotonic()
    with pytest.raises(RanksTimedOut) as info:
        p.run(never_returns_on_rank_one, timeout=3)
    assert time.monotonic() - t0 < 10
    report = str(info.value)
    assert "rank 0: in your barrier #1" in report
    assert "rank 1: outside any collective, with no call" in report
    assert not any(proc.is_alive() for proc in p._procs)


def test_mismatched_collectives_are_named_per_rank():
    p = RankPool(2, "gloo")
    with pytest.raises(RanksTimedOut) as info:
        p.run(mismatched, timeout=3)
    report = str(info.value)
    assert "rank 0: in your all_reduce #1 (float32[8])" in report
    assert "rank 1: in your broadcast #1 (float32[8], src=0)" in report
    assert "disagree" in report
    assert not any(proc.is_alive() for proc in p._procs)


def test_a_rank_that_dies_is_reported():
    p = RankPool(2, "gloo")
    with pytest.raises(RankFailed, match="rank 1 exited with status 3"):
        p.run(dies_on_rank_one, timeout=20)
    p.close()
    assert not any(proc.is_alive() for proc in p._procs)


def sleeps_then_answers(answer):
    time.sleep(1.0)
    return answer


class TimeLimit(Exception):
    """What a test's time limit raises in the waiting thread (pytest-timeout's signal method)."""


def test_a_run_interrupted_mid_task_answers_no_later_run():
    """A test's time limit (or a notebook's stop button) interrupts the wait while the ranks still
    work: their late replies must never be taken for the next run's answers."""
    import signal
    shared = launch.shared_pool(2, "gloo")

    def limit(*_):
        raise TimeLimit("time limit")
    old = signal.signal(signal.SIGALRM, limit)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(TimeLimit):
            shared.run(sleeps_then_answers, "stale", timeout=20)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert shared.closed and not any(p.is_alive() for p in shared._procs)
    fresh = launch.shared_pool(2, "gloo")                # replaced: it broke
    assert fresh is not shared
    assert fresh.run(sleeps_then_answers, "fresh", timeout=20) == ["fresh", "fresh"]


@pytest.mark.parametrize("kwargs, message", [
    (dict(world_size=0), "--nproc must be at least 1"),
    (dict(world_size=2, backend="nccl"), "backend nccl needs one GPU per rank"),
    (dict(world_size=2, backend="mpi"), "unknown backend"),
    (dict(world_size=2, link="warp-drive"), "unknown link preset 'warp-drive'"),
])
def test_bad_input_is_one_clear_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        launch.run(rank_and_sum, **kwargs)


def test_a_taken_port_is_named():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ValueError, match=f"port {port} is already in use"):
            launch.run(rank_and_sum, 2, master_port=port)


def test_parallel_pools_pick_different_ports(pool):
    with RankPool(2, "gloo") as other:
        assert other.port != pool.port
        assert other.run(rank_and_sum) == pool.run(rank_and_sum)


def test_lab_code_runs_unchanged_under_torchrun(tmp_path, monkeypatch, capsys):
    """One lab script, ``launch.main`` its ``__main__``: under torchrun it joins torchrun's job,
    run plainly (``python lab.py --nproc 2``: the script as ``__main__``, here in this process,
    whose fork server and shared pool of 2 ranks the tests above started) it runs on a pool."""
    import runpy
    script = tmp_path / "lab.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist
        from workbook.runtime import launch

        def check():
            t = torch.tensor([dist.get_rank() + 1.0])
            dist.all_reduce(t)
            return int(t.item())

        if __name__ == "__main__":
            launch.main(check, describe=lambda r: f"sums: {r}")
    """))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node=2", str(script)]
    out = subprocess.run(torchrun, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "sums: [3, 3]" in out.stdout
    monkeypatch.setattr(sys, "argv", [str(script), "--nproc", "2"])
    capsys.readouterr()
    runpy.run_path(str(script), run_name="__main__")
    assert capsys.readouterr().out == "sums: [3, 3]\n"          # 2 ranks, not the default 4
