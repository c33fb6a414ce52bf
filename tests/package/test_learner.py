"""The learner's tools: `workbook hint`, `workbook progress`, `workbook watch`, on a copy of the
labs (stub, partial and full answers of a quick lab, overlap_math)."""
import json
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from workbook import cli
from workbook.grading.labs import LABS, repo_root
from workbook.instructor import assign
from workbook.learner import progress, task_list

from processes import left_running

LAB = "overlap_math"
ROOT = repo_root()


def _solution_text() -> str:
    return (ROOT / "solutions" / f"{LAB}.py").read_text()


def _answer(done: int | None) -> str:
    """overlap_math with its first ``done`` tasks answered (None: all of them)."""
    text = _solution_text()
    if done is None:
        return text
    lab = assign.make_lab(text, LAB, f"{LAB}.py")
    keep = {id(b) for t in lab.tasks[:done] for b in t.blocks}
    lines = text.splitlines()
    drop = set()
    for t in lab.tasks[:done]:
        for b in t.blocks:
            drop |= {b.begin, b.end} | set(range(b.begin + 1, b.begin + 1 + len(
                [r for r in lines[b.begin + 1:b.end] if r.strip().startswith("###")])))
    assert keep
    answered = "\n".join(line for k, line in enumerate(lines) if k not in drop) + "\n"
    return assign.strip_solutions(answered, LAB, f"{LAB}.py")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The labs ``workbook assign`` makes at the standard level, once for the module: the
    course's own ``labs/`` (its lab files and hints), which are that (the test command's first
    stage, ``workbook assign --check``, and ``test_assign.py`` check it), copied instead of made
    again (1-2 s of CPU)."""
    folder = tmp_path_factory.mktemp("generated") / "mylabs"
    folder.mkdir()
    expected = [f"{lab}.py" for lab in LABS] + [assign.HINTS_FILE]
    for name in expected:
        shutil.copy2(ROOT / "labs" / name, folder / name)
    return folder


@pytest.fixture()
def labs(generated, tmp_path):
    """A learner's own copy of the generated labs, for one test."""
    folder = tmp_path / "mylabs"
    shutil.copytree(generated, folder)
    return folder


def _run_cli(*argv, capsys):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_hints_come_one_rung_at_a_time_and_are_remembered(labs, capsys):
    tasks = json.loads((labs / "hints.json").read_text())[LAB]["standard"]
    seen = []
    for expected in (1, 2, 3, 3):
        code, out, _ = _run_cli("hint", LAB, "2", "--impl", str(labs), capsys=capsys)
        assert code == 0
        assert f"task 2: {tasks[1]['title']}" in out
        assert f"hint {expected} of 3" in out and out.count("hint ") >= 1
        assert tasks[1]["rungs"][expected - 1][0] in out
        seen.append(out)
    assert "again for hint 2" in seen[0] and "last hint" in seen[2]
    code, out, _ = _run_cli("hint", LAB, tasks[0]["title"], "--all", "--impl", str(labs),
                            capsys=capsys)
    assert all(f"hint {k} of 3" in out for k in (1, 2, 3))
    saved = json.loads((labs / progress.PROGRESS_FILE).read_text())
    assert saved["hints"][LAB] == {tasks[1]["title"]: 3, tasks[0]["title"]: 3}
    lines = progress.progress_lines(str(labs))
    assert any(line.strip().startswith(LAB) and "task 1 (3 of 3), task 2 (3 of 3)" in line
               for line in lines), lines


def test_every_task_of_every_lab_has_three_rungs_at_every_level(labs):
    table = json.loads((labs / "hints.json").read_text())
    empty = [f"{lab} {level} {t['title']} rung {k + 1}"
             for lab, levels in table.items() for level, tasks in levels.items()
             for t in tasks for k in range(3) if not any(r.strip() for r in t["rungs"][k])]
    assert not empty, empty


@pytest.mark.parametrize("argv, message", [
    (["hint", "nolab"], "unknown lab 'nolab'; the labs are collectives, "),
    (["hint", LAB, "99"], f"{LAB} has no task '99': give a number from 1 to "),
    (["hint", LAB, "no_such_function"], "has no task 'no_such_function'"),
])
def test_hint_bad_input_is_one_line_and_exit_2(labs, capsys, argv, message):
    code, out, err = _run_cli(*argv, "--impl", str(labs), capsys=capsys)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_hints_follow_the_level_the_lab_was_made_at(tmp_path):
    folder = tmp_path / "challenge"
    assign.generate(ROOT / "solutions", folder, "challenge")
    tasks = task_list.lab_tasks(folder, LAB)
    region = [t for t in tasks if t["names"] and len(t["rungs"][0]) >= 1]
    assert task_list.lab_level(folder, LAB) == "challenge"
    assert tasks == json.loads((folder / "hints.json").read_text())[LAB]["challenge"]
    assert region


def _line(labs: Path) -> str:
    return next(line for line in progress.progress_lines(str(labs))
                if line.strip().startswith(LAB + " "))


def test_watch_checks_each_save_progress_shows_each_check_and_nothing_is_left(labs, capsys):
    """``workbook watch`` self-checks the lab at start (task 1 answered), then each save (the
    whole answer, a syntax error); after each check ``workbook progress`` shows its score and the
    next task (and the hint opened between them); Ctrl-C leaves no process behind. (One watcher
    serves the progress checks too: each ``workbook run`` it starts records progress as a
    learner's own does, so no separate self-checks are run for them. Each is a process that
    imports torch and starts a fork server, about 7 s of CPU: what a stub's self-check records,
    0 points and task 1 next, is shown for every lab's stub by
    ``test_release_learner.py::test_progress_shows_what_the_self_check_recorded``, so the
    watcher starts on a partial answer instead of a stub of its own.)"""
    lab_file = labs / f"{LAB}.py"
    titles = [t["title"] for t in task_list.lab_tasks(labs, LAB)]
    assert "not checked yet" in _line(labs) and "start with task 1" in _line(labs)
    lab_file.write_text(_answer(1))                                # task 1 answered, not checked
    # started with SIGINT ignored, as a shell starts `cmd &` in a script (and so CI): the watcher
    # must take Ctrl-C back (runs 11 and 12 of the test command waited 30 and 90 s for it)
    proc = subprocess.Popen([sys.executable, "-m", "workbook.cli", "watch", LAB, "--impl",
                             str(labs)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()

    def until(pattern: str, limit: float = 240.0) -> str:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                continue
            if re.search(pattern, line):
                return line
        raise AssertionError(f"no line matching {pattern!r} within {limit:g} s")

    def save(text: str) -> None:
        """Save the lab file until the watcher says it is checking it again: a save made before
        the watcher has gone back to watching the folder is not seen, so it is made again
        (no fixed pause)."""
        for _ in range(20):
            lab_file.write_text(text)
            try:
                until(rf"workbook watch {LAB}: checking", limit=3.0)
                return
            except AssertionError:
                continue
        raise AssertionError("the watcher never saw a save")

    try:
        until(rf"watch: {LAB} checked, exit 1")                   # task 1 answered, at start
        saved = json.loads((labs / progress.PROGRESS_FILE).read_text())["checks"][LAB]
        assert 0 < saved["score"] < saved["total"], saved                # some points, not all
        assert f" {saved['score']:g} / {saved['total']:g} points" in _line(labs), _line(labs)
        assert f"next: task 2, {titles[1]}" in _line(labs), _line(labs)
        _run_cli("hint", LAB, "--impl", str(labs), capsys=capsys)                # the next task's
        assert "task 2 (1 of 3)" in _line(labs)
        save(_answer(None))                                        # save 1: the whole answer
        until(rf"{LAB}: \d+ of \d+ checks passed")
        code = int(until(rf"watch: {LAB} checked, exit [01]").split("exit ")[1][0])
        saved = json.loads((labs / progress.PROGRESS_FILE).read_text())["checks"][LAB]
        if code == 0:
            assert "every check passes" in _line(labs) and saved["failed"] == []
        else:   # a timing check the load of this machine failed: named, and the task it grades
            assert saved["failed"] and "predictions_match_the_measured_trace" in saved["failed"]
            assert saved["score"] >= saved["total"] - 3
        code, out, _ = _run_cli("progress", "--impl", str(labs), capsys=capsys)
        assert code == 0 and out.count("\n") == len(LABS) + 1 and f"{saved['score']:g} / " in out
        save("def broken(:\n")                                    # save 2: a syntax error
        until(r"not checked: overlap_math.py:1: ")
        until(rf"watch: {LAB} does not compile; waiting for a save")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0          # a bound, not a figure: the watcher's ranks stop too
        until(r"watch: left")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not left_running(str(labs)), "a process of the watched self-check is still running"
