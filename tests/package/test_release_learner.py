"""A learner in a student release: the learner's loop, run with the release's own package.

One standard-level release is made (``workbook release``) and every command runs in it the way a
student runs it there: ``python -m workbook.cli ...`` from the release's folder, its package first
on the path, no ``WORKBOOK_ROOT``. In it:

* ``workbook run LAB ...`` on the stubs exits 1, and every lab says "not implemented yet" on a
  TODO line and scores 0 (all eleven labs in one ``workbook run``, one process, so its rank pools
  are started once: a process per lab would start them eleven times);
* ``workbook progress`` shows what that self-check recorded, and ``workbook hint`` gives one rung
  at a time of the release's own level, which is the only level its hints hold;
* the public grading tests (``pytest`` on the release's ``tests/``) give the stubs 0 of the
  points they mark;
* no file imports ``solutions``.

A second, challenge-level release shows that a lab header edited to another level gets no other
level's hints (that one test calls ``workbook.cli.main`` in this process, ``WORKBOOK_ROOT`` set).

The self-check and the grading run at the same time (independent processes, both started by one
fixture; the stubs' checks judge no measured time). Cost: about 40 s of CPU, nearly all of it
those two runs.
"""
from __future__ import annotations

import ast
import compileall
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbook.grading.labs import LABS, RELEASE_MANIFEST, repo_root
from workbook.grading.points import graded_tests
from workbook.instructor import release

ROOT = repo_root()
LEVEL = "standard"


def learner_env(folder: Path) -> dict:
    """A learner's environment in the release: its own package first, no course root set."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORKBOOK_ROOT", "WORKBOOK_IMPL") and not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(folder)
    return env


def workbook(folder: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbook.cli", *argv], cwd=folder,
                          env=learner_env(folder), capture_output=True, text=True, timeout=timeout)


def public_points(folder: Path, lab: str) -> float:
    path = folder / "tests" / "grading" / f"test_{lab}.py"
    return sum(g.points for g in graded_tests(path.read_text(), str(path)).values())


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The release a learner is handed (no recorded lessons: test_release_lessons has those),
    its package and labs byte-compiled once, as a learner's first run leaves them (Python writes
    ``__pycache__`` unless ``PYTHONDONTWRITEBYTECODE`` is set, as here and on some CI machines:
    then each of this module's processes, the fork servers too, compiled the release's package
    again; ``bootstrap.compile_sources`` does the same for the course)."""
    folder = tmp_path_factory.mktemp("learner") / "release"
    release.make_release(ROOT, folder, LEVEL, record=False)
    for sources in ("workbook", "labs"):
        assert compileall.compile_dir(folder / sources, quiet=1), sources
    return folder


class _Started:
    """``cmd`` started in the release as its learner would; ``finished()`` waits for its end:
    (exit status, output). Started in a fixture, so that the two long runs below (the stubs'
    self-check, the public grading tests) run at the same time: neither judges measured time."""

    def __init__(self, cmd: list, folder: Path):
        self.proc = subprocess.Popen(cmd, cwd=folder, env=learner_env(folder),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.result = None

    def finished(self, timeout: float = 400) -> tuple[int, str]:
        if self.result is None:
            try:
                out, _ = self.proc.communicate(timeout=timeout)
            finally:
                self.stop()
            self.result = (self.proc.returncode, out)
        return self.result

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


#: the labs whose public tests run here: the release's pytest, as its learner runs it, on three
#: labs (every stub of every lab scoring 0 under these same tests, less the hidden ones, is the
#: test command's stub stage; running them all again here cost 39 s of the suite)
PUBLIC_GRADED = ("collectives", "overlap_math", "pp_schedules")


@pytest.fixture(scope="module")
def started(folder):
    """Both long runs, started at once: ``workbook run`` of every lab on the release's stubs,
    and the release's public tests by pytest, as its test command runs them (``-p no:nbmake``:
    the dev extra's notebook plugin is 2-3 s of CPU to import and grades nothing here)."""
    results = folder.parent / "results.json"
    runs = {"self_check": _Started([sys.executable, "-m", "workbook.cli", "run", *LABS], folder),
            "graded": _Started([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                "-p", "no:nbmake", "--gradescope", str(results),
                                *(f"tests/grading/test_{lab}.py" for lab in PUBLIC_GRADED)],
                               folder)}
    try:
        yield runs, results
    finally:
        for run in runs.values():
            run.stop()


@pytest.fixture(scope="module")
def self_checked(started):
    """``workbook run`` of every lab on the release's stubs: (exit status, output). (Its own
    test: each long run is one test's set-up, so no single test carries both.)"""
    return started[0]["self_check"].finished()


@pytest.fixture(scope="module")
def graded(started):
    """The release's public tests by pytest: (exit status, output, results.json)."""
    code, out = started[0]["graded"].finished()
    return code, out, started[1]


# --------------------------------------------------------------------------- workbook run
def test_the_stubs_self_check_to_todo_for_every_lab(folder, self_checked):
    """Every lab's stub (the course's ``labs/``, at the release's level) self-checks to TODO
    lines, 0 points and exit 1, none failing or hanging: the only self-check of every stub in
    the suite (``test_learner_loop.py`` and ``test_release.py`` ran their own)."""
    code, out = self_checked
    assert code == 1, out
    assert "Traceback" not in out, out
    parts = re.split(r"(?m)^(?=\w+ self-check: )", out)
    by_lab = {part.split(" ", 1)[0]: part for part in parts if " self-check: " in part}
    assert list(by_lab) == LABS, out
    for lab, text in by_lab.items():
        assert f"{lab} self-check: labs/{lab}.py on the grader's world sizes" in text
        todo = [line for line in text.splitlines() if line.startswith("  TODO ")]
        assert todo, f"{lab}: no TODO line\n{text}"
        assert f"not implemented yet: {lab}." in text, text
        assert not re.search(r"(?m)^  (FAIL|HANG) ", text), text
        points = public_points(folder, lab)
        assert re.search(rf"(?m)^{lab}: 0 of \d+ checks passed, 0 / {points:g} points; exit 1 "
                         r"\(a check failed or is not implemented yet\)", text), text
    assert f"{len(LABS)} labs: " + ", ".join(f"{lab} exit 1" for lab in LABS) in out


@pytest.mark.parametrize("argv, message", [
    (["run", "collectives", "telepathy"], "unknown lab 'telepathy'; the labs are collectives, "),
    (["run", "tp", "sp", "--nnodes", "2", "--nproc-per-node", "1"],
     "--nnodes runs one lab as a torchrun job: name one LAB"),
])
def test_several_labs_bad_input_is_one_line_before_any_check(argv, message, capsys):
    from workbook import cli
    assert cli.main(argv) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and message in out.err, out


def test_progress_shows_what_the_self_check_recorded(folder, self_checked):
    out = workbook(folder, "progress")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"progress of {folder / 'labs'}/")
    tasks = json.loads((folder / "labs" / "hints.json").read_text())
    for lab in LABS:
        line = next(line for line in lines if line.split()[:1] == [lab])
        assert f" 0 / {public_points(folder, lab):g} points (" in line, line
        first = tasks[lab][LEVEL][0]["title"]                # every task is still to do
        assert f"next: task 1, {first}" in line, line


# --------------------------------------------------------------------------- workbook hint
def test_hints_come_one_rung_at_a_time_from_the_releases_level_only(folder):
    table = json.loads((folder / "labs" / "hints.json").read_text())
    assert sorted(table) == sorted(LABS) and all(list(t) == [LEVEL] for t in table.values())
    lab = "ring_allreduce"
    rungs = table[lab][LEVEL][0]["rungs"]
    first = workbook(folder, "hint", lab, "1")
    assert first.returncode == 0, first.stderr
    assert "hint 1 of 3, the idea:" in first.stdout and "hint 2 of 3" not in first.stdout
    assert all(line in first.stdout for line in rungs[0])
    assert not any(line in first.stdout for line in rungs[1] + rungs[2] if line.strip())
    second = workbook(folder, "hint", lab, "1")
    assert "hint 2 of 3, the steps:" in second.stdout and "hint 1 of 3" not in second.stdout
    # the task list is the release's level's: one past its end is a one-line error
    past = len(table[lab][LEVEL]) + 1
    wrong = workbook(folder, "hint", lab, str(past))
    assert wrong.returncode == 2 and f"{lab} has no task '{past}'" in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1


def test_a_lab_header_edited_to_another_level_gets_no_other_levels_hints(tmp_path, monkeypatch,
                                                                         capsys):
    """A challenge release's hints hold its coarse tasks only: a learner who edits a lab's
    header to say ``standard`` gets no standard task from ``workbook hint``."""
    from workbook import cli
    folder = tmp_path / "challenge"
    release.make_release(ROOT, folder, "challenge", record=False)
    table = json.loads((folder / "labs" / "hints.json").read_text())
    lab = "collectives"
    coarse = table[lab]["challenge"]
    course = json.loads((ROOT / "labs" / "hints.json").read_text())[lab]["standard"]
    assert len(coarse) < len(course)
    path = folder / "labs" / f"{lab}.py"
    path.write_text(path.read_text().replace("(level: challenge)", "(level: standard)", 1))
    monkeypatch.setenv("WORKBOOK_ROOT", str(folder))
    assert cli.main(["hint", lab, str(len(coarse) + 1)]) == 2
    assert f"{lab} has no task '{len(coarse) + 1}'" in capsys.readouterr().err
    assert cli.main(["hint", lab, "2", "--all"]) == 0
    shown = capsys.readouterr().out
    assert f"{lab}, task 2: {coarse[1]['title']}" in shown
    assert course[1]["title"] != coarse[1]["title"]


# --------------------------------------------------------------------------- grading
def test_the_public_grading_tests_give_the_stubs_zero(folder, graded):
    code, out, results = graded
    assert code == 1, out[-3000:]
    res = json.loads(results.read_text())
    assert res["score"] == 0 and res["tests"], out[-3000:]
    assert all(t["score"] == 0 and t["max_score"] > 0 for t in res["tests"])
    total = sum(public_points(folder, lab) for lab in PUBLIC_GRADED)
    assert sum(t["max_score"] for t in res["tests"]) == pytest.approx(total)
    assert {t["name"].split("::")[0] for t in res["tests"]} == set(PUBLIC_GRADED)
    assert re.search(rf"(?m)^TOTAL\s+0 / {total:g}\b", out), out[-3000:]


# --------------------------------------------------------------------------- no answer key
def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, module)`` for every import statement, and every ``import_module("...")`` or
    ``__import__("...")`` call with a literal name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and getattr(
                    node.func, "attr", getattr(node.func, "id", "")) in ("import_module",
                                                                         "__import__"):
            found.append((node.lineno, node.args[0].value))
    return found


def test_nothing_in_the_release_imports_solutions(folder):
    sources = {p.relative_to(folder).as_posix(): p.read_text() for p in folder.rglob("*.py")}
    for nb in folder.rglob("*.ipynb"):
        cells = json.loads(nb.read_text())["cells"]
        code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        magic = ("%", "!")                                  # IPython lines: not Python
        sources[nb.relative_to(folder).as_posix()] = "\n".join(
            "\n".join(line for line in cell.splitlines() if not line.lstrip().startswith(magic))
            for cell in code)
    assert any(rel.startswith("workbook/") for rel in sources) and len(sources) > 100
    imports = []
    for rel, text in sources.items():
        imports += [(f"{rel}:{line}", name) for line, name in _imported_modules(ast.parse(text))]
    assert any(name == "workbook.grading.labs" for _, name in imports)        # the scan sees them
    bad = [(where, name) for where, name in imports if name.split(".")[0] == "solutions"]
    assert not bad, bad
    assert not (folder / "solutions").exists()
    assert json.loads((folder / RELEASE_MANIFEST).read_text())["level"] == LEVEL
