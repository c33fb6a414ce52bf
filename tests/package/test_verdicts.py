"""Verdicts that hold under any load, and every dead rank explained (workbook.runtime.pool,
flight, rank_death; workbook.grading.engine).

* a hang is *no progress*, not a long run: a rank that keeps calling collectives, or computes
  outside them, is never called hung however slow; a rank asleep outside any call is;
* a run that progresses for ever ends at the wall limit as "still running", never "HANG";
* a rank that dies is explained: the signal, the learner's line, the likely cause (a freed
  ZeRO-3 buffer used; gloo's abort on a collective mismatch, with the ranks' last calls);
* the report tells the check's own calls from the learner's;
* a lab that does not import says so on every check, with its file and line;
* no one-line message ends in a colon; ``workbook run`` leaves no process behind.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from workbook.grading import engine
from workbook.grading.labs import use_impl
from workbook.runtime.flight import hang_report
from workbook.runtime.messages import first_line
from workbook.runtime.pool import RankFailed, RankPool, RanksStillRunning, RanksTimedOut

ROOT = Path(__file__).resolve().parents[2]
WRONG = ROOT / "tests" / "grading" / "wrong"


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, "gloo") as p:
        yield p


# --------------------------------------------------------------------------- progress, not time
def slow_but_talking(rounds: int, pause: float):
    t = torch.zeros(2)
    for _ in range(rounds):
        if dist.get_rank() == 0:
            time.sleep(pause)                  # rank 1 waits in each all_reduce meanwhile
        dist.all_reduce(t)
    return rounds


def computes_then_meets(seconds: float):
    if dist.get_rank() == 0:                    # a long compute outside any call, rank 1 waits
        end = time.monotonic() + seconds
        x = 0
        while time.monotonic() < end:
            x += 1
    dist.barrier()
    return "met"


def test_a_slow_run_that_keeps_talking_is_not_a_hang(pool):
    t0 = time.monotonic()
    assert pool.run(slow_but_talking, 6, 0.5, timeout=1.0) == [6, 6]
    assert time.monotonic() - t0 > 2.5                       # far past the 1 s "timeout"


def test_a_rank_computing_outside_any_call_is_not_a_hang(pool):
    assert pool.run(computes_then_meets, 6.0, timeout=2.0) == ["met", "met"]


def sleeps_on_rank_one():
    if dist.get_rank() == 1:
        time.sleep(600)
    dist.barrier()


def test_a_rank_asleep_outside_any_call_is_a_hang_within_the_timeout():
    p = RankPool(2, "gloo")
    t0 = time.monotonic()
    with pytest.raises(RanksTimedOut) as info:
        p.run(sleeps_on_rank_one, timeout=2.0)
    assert time.monotonic() - t0 < 2.0 + 5
    report = str(info.value)
    assert report.startswith("no rank made progress for 2 s"), report
    assert "rank 0: in your barrier #1" in report and "rank 1: outside any collective" in report
    assert not any(proc.is_alive() for proc in p._procs)


def spins_for_ever():
    while True:
        pass


def test_an_endless_loop_is_still_running_not_a_hang():
    p = RankPool(2, "gloo")
    with pytest.raises(RanksStillRunning) as info:
        p.run(spins_for_ever, timeout=3.0, wall=8.0)
    assert "still running after 8 s" in str(info.value)
    assert "slow machine or an endless loop?" in str(info.value)
    verdict = engine.verdict_for("lab", "check", 1, info.value)
    assert verdict.status == engine.ERROR and "HANG" not in verdict.message


# --------------------------------------------------------------------------- whose call it is
CHECK_SOURCE = '''
import torch
import torch.distributed as dist
def check_then_barrier():
    if dist.get_rank() == 0:
        dist.barrier()                      # the check's own barrier, between two phases
    else:
        LEARNER(torch.zeros(1))             # a learner's call the other rank never makes
'''


def _as_check(source: str, name: str):
    """A function compiled as if it lived in tests/grading/ (the grader's own file)."""
    path = str(ROOT / "tests" / "grading" / "test_fake_check.py")
    namespace: dict = {"__file__": path, "__name__": "workbook_checks_fake"}
    exec(compile(source, path, "exec"), namespace)
    return namespace[name]


def test_the_report_names_the_checks_own_call_apart_from_the_learners():
    fn = _as_check(CHECK_SOURCE, "check_then_barrier")
    fn.__globals__["LEARNER"] = learner_all_reduce
    p = RankPool(2, "gloo")
    with pytest.raises(RanksTimedOut) as info:
        p.run(fn, timeout=2.0)
    report = str(info.value)
    assert "rank 0: in the check's own barrier #1" in report, report
    assert "rank 1: in your all_reduce #1 (float32[1])" in report, report
    assert "Rank 0 waits in the check's own calls for the other ranks to reach them: rank 1 is " \
           "in your all_reduce" in report, report


def learner_all_reduce(t):
    dist.all_reduce(t)


# --------------------------------------------------------------------------- dead ranks
def segfaults_on_rank_one():
    if dist.get_rank() == 1:
        ctypes.string_at(0)                     # reads address 0: SIGSEGV
    dist.barrier()


def test_a_segfault_names_the_signal_and_the_stack(pool):
    p = RankPool(2, "gloo")
    with pytest.raises(RankFailed) as info:
        p.run(segfaults_on_rank_one, timeout=20)
    message = str(info.value)
    assert message.startswith("rank 1 was killed by SIGSEGV."), message
    assert "segfaults_on_rank_one" in message                  # its Python stack
    assert "raised RankFailed" not in message
    verdict = engine.verdict_for("lab", "check", 1, info.value)
    assert verdict.message == message.strip()                   # whole, not its first line
    p.close()
    assert not any(proc.is_alive() for proc in p._procs)


def _verdicts(lab: str, fixture: str, only: list[str]):
    old = os.environ.get("WORKBOOK_IMPL")
    use_impl(str(WRONG / fixture))
    try:
        return engine.run_checks(lab, nproc=2, only=only)
    finally:
        os.environ["WORKBOOK_IMPL"] = old or "labs"


def test_zero3_using_a_freed_buffer_is_explained():
    verdict, = _verdicts("dp_overlap", "dp_overlap_freed_not_stale", ["zero3[2]"])
    assert verdict.status == engine.ERROR, verdict
    assert "was killed by SIGSEGV" in verdict.message, verdict.message
    assert "dp_overlap.py:" in verdict.message                 # the learner's last line
    assert "Mark a freed layer stale" in verdict.message


def test_a_skipped_collective_that_makes_gloo_abort_reads_as_a_disagreement():
    verdict, = _verdicts("tp", "tp_loss_max_skipped_on_a_rank", ["conjugate_ops"])
    message = verdict.message
    assert verdict.status == engine.ERROR, verdict
    assert "was killed by SIGABRT" in message and "ranks disagree" in message, message
    assert "It was running your code at " in message and "tp.py:" in message, message
    assert "collective mismatch" in message                    # gloo's own words, quoted once
    assert message.count("terminate called") == 1


# --------------------------------------------------------------------------- a lab that does not import
def test_a_syntax_error_is_reported_on_every_check(tmp_path):
    source = (ROOT / "solutions" / "ring_allreduce.py").read_text().splitlines()
    line = next(i for i, s in enumerate(source) if s.startswith("def ring_all_gather"))
    source[line] = source[line].rstrip(":")                    # def ring_all_gather(chunks) -> None
    (tmp_path / "ring_allreduce.py").write_text("\n".join(source) + "\n")
    old = os.environ.get("WORKBOOK_IMPL")
    use_impl(str(tmp_path))
    try:
        verdicts = engine.run_checks("ring_allreduce", nproc=2)
        printed: list[str] = []
        from workbook.selfcheck import self_check
        assert self_check("ring_allreduce", impl=str(tmp_path), nproc=2, write=printed.append) == 1
    finally:
        os.environ["WORKBOOK_IMPL"] = old or "labs"
    assert printed[1] == (f"  {tmp_path.name}/ring_allreduce.py does not import: line {line + 1}: "
                          f"SyntaxError: expected ':'. No check can run until it does."), printed
    expected = f"not run: the lab does not import ({tmp_path.name}/ring_allreduce.py, line {line + 1}"
    assert verdicts and all(v.message.startswith(expected) for v in verdicts), \
        [v.message for v in verdicts]
    assert all("SyntaxError" in v.message and "has no attribute" not in v.message
               for v in verdicts)


# --------------------------------------------------------------------------- whole sentences
@pytest.mark.parametrize("text", [
    hang_report([{"state": "in", "call": "recv #1", "name": "recv", "seq": 1, "t": time.time()},
                 {"state": "done"}], 60),
    "RanksTimedOut: the ranks did not finish within 60 s. The last collective each rank "
    "entered:\n  rank 0: waiting in recv #1\n  rank 1: done",
    "figures skipped:",
])
def test_no_one_line_message_ends_in_a_colon(text):
    line = first_line(text)
    assert line and not line.endswith(":"), line
    if text.startswith("RanksTimedOut"):
        assert "rank 1: done" in line                            # the list is kept, not cut


def test_workbook_run_leaves_no_process_behind():
    """A stub self-check (every check not implemented) in its own session: when ``workbook run``
    returns, no process of that session is left (ranks, fork server, resource tracker)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "workbook.cli", "run", "collectives",
                             "--nproc", "2"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    assert proc.wait(timeout=300) == 1
    ps = subprocess.run(["ps", "-eo", "pid,sid,stat,args"], capture_output=True, text=True).stdout
    left = [ln for ln in ps.splitlines()[1:] if ln.split()[1] == str(proc.pid)]
    assert not left, left


@pytest.mark.skipif(not shutil.which("ps"), reason="needs ps")
def test_nothing_is_left_in_the_temp_dir_by_a_pool(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with RankPool(2, "gloo") as p:
        assert p.run(lambda: 1) == [1, 1]
    assert not list(tmp_path.iterdir())


def test_a_simulated_link_check_under_an_nccl_torchrun_job_is_skipped_with_the_way_out():
    """A simulated link is gloo's (its ranks are CPU ranks): in a torchrun job on NCCL such a
    check is skipped with a message that says how to run it, never run with CPU tensors."""
    class NcclJob:
        backend = "nccl"

        def run(self, *args, **kwargs):
            raise AssertionError("must not run")
    engine.STATE.job = NcclJob()
    try:
        with pytest.raises(engine.Skipped, match="--backend gloo"):
            engine.on_ranks(2, abs, 1, link="dgx-h100")
    finally:
        engine.STATE.job = None
