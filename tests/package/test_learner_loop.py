"""The learner's loop, tried the way a new user meets it: a wrong answer, a hang, a stub.

* a wrong answer gives a verdict (rank, build, expected vs got), exit 1, never a hang report
  (on 2 ranks, in this process, on the rank pool the exception test below warmed);
* a hang ends in the per-rank report, exit 2, under ``workbook run`` (4 ranks: the report says
  which ranks wait for which and that they disagree) and under ``torchrun`` (2 ranks, each a
  process importing torch: one report, not a traceback per rank), and leaves no process behind;
  default options arm it with the default timeout (read from what the self-check is handed), the
  real hang runs with a short one;
* every generated stub's self-check exits 1 (``test_release_learner.py``: the release's stubs,
  which are the course's ``labs/`` at the standard level, every lab in one ``workbook run``);
* the grader lists each failure once, with its full message and without its own source.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbook.grading import engine
from workbook.grading.timing import STRUCTURAL, hidden_pct, measure_until_clear

from processes import gone_within

ROOT = Path(__file__).resolve().parents[2]
SOLUTION = (ROOT / "solutions" / "collectives.py").read_text()


def _lab_copy(tmp_path: Path, name: str, *edits: tuple[str, str]) -> Path:
    """A copy of the collectives solution with ``edits`` (old, new) applied: a learner's file."""
    text = SOLUTION
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "collectives.py").write_text(text)
    return folder


REDUCE_NEVER_COMBINES = ("                dist.recv(incoming, src=peer)\n"
                         "                combine(tensor, incoming, op)",
                         "                dist.recv(incoming, src=peer)")
BROADCAST_INTO_SCRATCH = ("        dist.recv(tensor, src=src)\n    ### END SOLUTION\n    return tensor\n\n\n"
                          "def tree_broadcast",
                          "        dist.recv(torch.empty_like(tensor), src=src)\n    ### END SOLUTION\n"
                          "    return tensor\n\n\ndef tree_broadcast")
# the last rank skips its receive of the barrier's last round: on 4 ranks rank 3 skips step 2
# (rank 1's send to it never completes), on 2 ranks rank 1 skips step 1 (rank 0's send)
BARRIER_SKIPS_A_RECV = ("        dist.recv(heard, src=(rank - step) % n)\n",
                        "        if not (rank == n - 1 and 2 * step >= n):\n"
                        "            dist.recv(heard, src=(rank - step) % n)\n")


def _workbook(*args, timeout=240) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "workbook.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0


def test_a_learners_exception_names_their_line(tmp_path, monkeypatch):
    """An exception in the learner's code names their file and line. (First in this module: the
    2-rank pool and fork server it starts in this process serve the wrong answers' run below.)"""
    lab = _lab_copy(tmp_path, "raises", ("    mask = 1\n    while mask < n:\n        if v < mask",
                                         "    mask = 1\n    [][rank]\n    while mask < n:\n        if v < mask"))
    monkeypatch.setenv("WORKBOOK_IMPL", "labs")              # restored after the test
    from workbook.selfcheck import self_check
    verdicts = []
    code = self_check("collectives", impl=str(lab), nproc=2, write=verdicts.append)
    text = "\n".join(verdicts)
    assert code == 1, text
    assert "your code raised IndexError" in text and "collectives.py:" in text, text
    assert "in tree_broadcast" in text, text


def test_wrong_answers_give_verdicts_not_hangs(tmp_path, capsys, monkeypatch):
    """A reduce that never combines and a broadcast that receives into a scratch buffer, on 2
    ranks: each build's verdict names the rank and says expected vs got; exit 1; no hang.
    (``workbook run`` in this process, on the ranks the test above warmed, which it stops as it
    returns: the command's own process is started by the hang test below and by the grader's
    test. 2 ranks, as the collectives wrong labs are graded in
    ``test_ring_collectives_wrong_caught``: on 4 the same verdicts took twice the CPU.)"""
    from workbook import cli
    lab = _lab_copy(tmp_path, "wrong", REDUCE_NEVER_COMBINES, BROADCAST_INTO_SCRATCH)
    monkeypatch.setenv("WORKBOOK_IMPL", "labs")              # the run sets it; restored after
    t0 = time.monotonic()
    code = cli.main(["run", "collectives", "--impl", str(lab), "--nproc", "2"])
    seconds = time.monotonic() - t0
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert code == 1, out
    assert seconds < 60, f"took {seconds:.0f} s"
    assert "FAIL  reduce_matches_builtin" in out and "FAIL  broadcast_matches_builtin" in out, out
    assert "reduce(dst=" in out and "broadcast(src=" in out, out
    assert "expected" in out and "got" in out and "rank " in out, out
    assert "not graded until the numbers are right" in out      # no pattern points for it
    assert "made progress" not in out and "HANG" not in out, out
    assert "ok    use_builtins" in out                           # the rest still ran


HANG_TIMEOUT_S = 4        # the real hang below: seconds without progress before the report


def test_default_options_arm_the_hang_report_with_the_default_timeout(tmp_path, monkeypatch):
    """With no options, ``workbook run LAB`` and ``python labs/LAB.py`` (what ``torchrun`` runs)
    both hand the self-check the default no-progress timeout: what the real hang below, run with
    a short one, shows happens then (proving it by waiting out the default would take a minute)."""
    from workbook import cli, selfcheck
    seen = []
    monkeypatch.setattr(selfcheck, "self_check", lambda lab, **kw: seen.append(kw["timeout"]) or 0)
    lab = _lab_copy(tmp_path, "default")
    assert cli.main(["run", "collectives", "--impl", str(lab)]) == 0
    with pytest.raises(SystemExit) as done:
        selfcheck.main(str(lab / "collectives.py"), [])
    assert done.value.code == 0
    assert seen == [selfcheck.DEFAULT_TIMEOUT_S] * 2 and selfcheck.DEFAULT_TIMEOUT_S == 60.0


def test_a_hang_ends_in_the_report(tmp_path):
    """A barrier that skips one receive: ``workbook run`` (4 ranks) and ``torchrun`` (2 ranks;
    run side by side) both end with the per-rank report, exit status 2, in few lines, and leave
    no process behind. The no-progress timeout is short here; the test above shows the default
    one is armed. (torchrun on 2 ranks: each of its ranks is a process of its own importing
    torch, and one report instead of a traceback per rank needs only a second rank; on 4 it
    cost twice the CPU.)"""
    lab = _lab_copy(tmp_path, "hang", BARRIER_SKIPS_A_RECV)
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    timeout = ["--timeout", str(HANG_TIMEOUT_S)]
    jobs = {"workbook run": subprocess.Popen(
        [sys.executable, "-m", "workbook.cli", "run", "collectives", "--impl", str(lab),
         "--nproc", "4", *timeout], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT)}
    if torchrun:
        jobs["torchrun"] = subprocess.Popen(
            [torchrun, "--standalone", "--nproc_per_node=2", str(lab / "collectives.py"),
             *timeout], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT)
    outs = {name: p.communicate(timeout=300)[0] for name, p in jobs.items()}
    seconds = time.monotonic() - t0
    out = outs["workbook run"]
    assert jobs["workbook run"].returncode == 2, out
    assert "HANG  barrier_waits_for_everyone" in out, out
    assert f"no rank made progress for {HANG_TIMEOUT_S} s" in out, out
    assert "rank 1: in your wait() on isend" in out and "dst=3)" in out, out   # rank 3 skipped it
    assert "ranks disagree" in out, out
    assert len(out.splitlines()) <= 40, out
    assert "Traceback" not in out and "Timed out waiting" not in out, out
    if torchrun:
        out = outs["torchrun"]
        assert jobs["torchrun"].returncode != 0, out           # torchrun turns any failure into 1
        assert "HANG  barrier_waits_for_everyone" in out, out
        assert "rank 0: in your wait() on isend" in out and "dst=1)" in out, out  # rank 1 skipped
        assert "exitcode  : 2" in out, out                      # rank 0 carried status 2
        assert out.count("HANG  ") == 1, out                    # one report, not one per rank
        assert "Timed out waiting" not in out, out
        assert len(out.splitlines()) <= 60, out
    assert seconds < 150, f"took {seconds:.0f} s"
    left = gone_within(10, str(lab))          # ranks may take a moment to be reaped: poll, bounded
    assert not left, left


def test_grader_lists_each_failure_once_in_full(tmp_path):
    """``workbook grade`` on a reduce that never combines: its failure once, in full, in the
    grader's own words (no pytest dump). (Grading the reduce checks only, ``-- -k reduce``, took
    the same CPU time: the grader's cost here is its start, pytest, torch and the ranks; on at
    most 2 ranks, ``--max-ranks 2``, no 3- and 4-rank pools start: 17.9 -> 13.8 s quiet.)"""
    lab = _lab_copy(tmp_path, "wrong", REDUCE_NEVER_COMBINES)
    code, out, _ = _workbook("grade", "--lab", "collectives", "--impl", str(lab), "--max-ranks", "2")
    assert code == 1, out
    message = next(ln.strip() for ln in out.splitlines() if "reduce(dst=" in ln)
    assert message.startswith("rank ") and "expected" in message and message.endswith(")")
    assert out.count(message) == 1, out                         # once, never cut
    assert "collectives::reduce_matches_builtin" in out and "TOTAL" in out
    assert "short test summary" not in out and "def _check" not in out, out
    assert "\nE " not in out, out                               # no pytest assertion dump


# --------------------------------------------------------------------------- the timing policy
def test_measure_until_clear_stops_at_a_pass():
    seen = []
    assert measure_until_clear(lambda k: seen.append(k) or 95.0, lambda r: 90.0 - r) == 95.0
    assert seen == [0]


def test_a_near_miss_is_measured_again_and_the_best_counts():
    figures = iter([80.0, 85.0, 91.0])
    assert measure_until_clear(lambda k: next(figures), lambda r: 90.0 - r) == 91.0


def test_a_clear_miss_or_a_wrong_structure_is_not_measured_again():
    seen = []
    measure_until_clear(lambda k: seen.append(k) or 1.0, lambda r: 90.0 - r)
    assert seen == [0]
    seen.clear()
    measure_until_clear(lambda k: seen.append(k) or 99.0, lambda r: STRUCTURAL)
    assert seen == [0]


def test_hidden_pct_excuses_a_late_peer():
    assert hidden_pct(100.0, 40.0) == pytest.approx(60.0)
    assert hidden_pct(100.0, 40.0, skew_us=30.0) == pytest.approx(90.0)
    assert hidden_pct(100.0, 10.0, skew_us=30.0) == pytest.approx(100.0)
    assert hidden_pct(0.0, 0.0) == 0.0


def test_exit_codes():
    v = lambda status: engine.Verdict("x", "y", 1.0, status)     # noqa: E731
    assert engine.exit_code([v(engine.PASSED), v(engine.SKIPPED)]) == 0
    assert engine.exit_code([v(engine.PASSED), v(engine.NOT_IMPLEMENTED)]) == 1
    assert engine.exit_code([v(engine.FAILED), v(engine.HANG)]) == 2
