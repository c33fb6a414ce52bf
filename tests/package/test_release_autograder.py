"""A class with a student release is graded by the Gradescope zip of the instructor's repository.

The release (``workbook release``) holds the stubs and the public tests; the zip, built from the
course repository, holds every grading test and the instructor's hidden ones. A student who works
in the release and hands in its ``labs/`` folder is graded by that zip exactly as one who works in
the course repository: a finished lab (here ``collectives``, its reference copied over the
release's stub) scores full marks, the hidden test included; a lab still a stub (``overlap_math``)
scores 0, every test saying "not implemented yet". Built inside a release, the zip is refused: a
release has neither the solutions nor the hidden tests.

The zip is built once and graded once (one submission holds both labs, graded on at most 2 ranks
as on Gradescope's smallest machine), the way ``test_autograder.py`` runs it: unpacked into a
temporary ``/autograder``, ``run_autograder`` run with this venv's Python.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from test_autograder import by_name, run_autograder

from workbook.grading.labs import RELEASE_MANIFEST, repo_root
from workbook.grading.points import graded_tests
from workbook.instructor import release

ROOT = repo_root()
LABS = ("collectives", "overlap_math")          # one finished in the release, one left a stub
HIDDEN_POINTS = 2
HIDDEN_TEST = textwrap.dedent(f'''
    import pytest
    from workbook.grading.engine import on_ranks


    @pytest.mark.points({HIDDEN_POINTS}, visibility="hidden")
    def test_broadcast_from_the_second_rank():
        def rank_side():                            # nested: travels to the ranks by value
            import torch
            import torch.distributed as dist
            from workbook.grading.labs import load_lab
            x = torch.arange(5.0) + 10 * dist.get_rank()
            return load_lab("collectives").broadcast(x, src=1).tolist()
        assert on_ranks(2, rank_side) == [[10.0, 11.0, 12.0, 13.0, 14.0]] * 2
''')


def _instructor_env() -> dict:
    """The instructor's checkout first on the path; no course root or implementation set."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORKBOOK_ROOT", "WORKBOOK_IMPL")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A standard release with ``collectives`` finished, its ``labs/`` graded by the zip built
    from the course repository (with a hidden test): ``(release folder, zip, results.json)``."""
    tmp = tmp_path_factory.mktemp("release_autograder")
    folder = tmp / "class-release"
    (tmp / "extra").mkdir()
    (tmp / "extra" / "test_collectives_hidden.py").write_text(HIDDEN_TEST)
    zip_path = tmp / "autograder.zip"
    # the zip is built (a subprocess, mostly pip making the wheel) while the release is made
    build = subprocess.Popen([sys.executable, "-m", "workbook.cli", "autograder", "build",
                              *(a for lab in LABS for a in ("--lab", lab)), "--level", "standard",
                              "--extra-tests", str(tmp / "extra"), "-o", str(zip_path)],
                             cwd=ROOT, env=_instructor_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        release.make_release(ROOT, folder, "standard", record=False)  # lessons: test_release_lessons
        shutil.copy2(ROOT / "solutions" / "collectives.py", folder / "labs" / "collectives.py")
        out, _ = build.communicate(timeout=180)
    finally:
        if build.poll() is None:
            build.kill()
            build.wait()
    assert build.returncode == 0, out
    submission = {f"labs/{p.name}": p.read_text() for p in sorted((folder / "labs").iterdir())
                  if p.is_file()}                  # the student hands in their labs/ folder
    # at most 2 ranks, as on Gradescope's default machine (768 MB): the same verdicts, and
    # half the rank processes to start (1 + 2 in place of 1 + 2 + 3 + 4)
    res = run_autograder(zip_path, tmp / "autograder", submission, max_ranks=2)
    return folder, zip_path, res


def _public_points(folder: Path, lab: str) -> float:
    """The points of ``lab``'s tests as the release's public test file marks them."""
    path = folder / "tests" / "grading" / f"test_{lab}.py"
    return sum(g.points for g in graded_tests(path.read_text(), str(path)).values())


def test_a_finished_lab_from_a_release_scores_full_marks(graded):
    folder, _, res = graded
    tests = [t for t in res["tests"] if t["name"].startswith("collectives")]
    lost = [(t["name"], t["output"][:400]) for t in tests if t["score"] < t["max_score"]]
    assert not lost, lost
    public = _public_points(folder, "collectives")
    assert public > 0
    assert sum(t["score"] for t in tests) == sum(t["max_score"] for t in tests) \
        == public + HIDDEN_POINTS
    hidden = by_name(res)["collectives_hidden::broadcast_from_the_second_rank"]
    assert hidden["visibility"] == "hidden" and hidden["score"] == HIDDEN_POINTS
    assert "graded: labs/collectives.py, labs/overlap_math.py" in res["output"]
    # every other file of the release's labs/ (the other labs, hints.json) is named as ignored,
    # the list cut short after a few names ("and N more"): counted, not graded
    graded_line = next(line for line in res["output"].splitlines() if line.startswith("graded:"))
    assert "hints.json" not in graded_line
    ignored = next(line for line in res["output"].splitlines()
                   if line.startswith("ignored (not lab files of this assignment"))
    named = ignored.split("): ", 1)[1]
    more = re.search(r" and (\d+) more$", named)
    shown = (named[:more.start()] if more else named).split(", ")
    submitted = [p for p in (folder / "labs").iterdir() if p.is_file()]
    assert len(shown) + (int(more.group(1)) if more else 0) == len(submitted) - 2, ignored


def test_a_stub_from_a_release_scores_zero(graded):
    folder, _, res = graded
    tests = [t for t in res["tests"] if t["name"].startswith("overlap_math::")]
    assert tests and sum(t["max_score"] for t in tests) == _public_points(folder, "overlap_math")
    for t in tests:
        assert t["score"] == 0 and "not implemented yet" in t["output"], t
    assert res["score"] == _public_points(folder, "collectives") + HIDDEN_POINTS


def test_the_zip_carries_what_the_release_leaves_out(graded):
    folder, zip_path, _ = graded
    with zipfile.ZipFile(zip_path) as zf:
        names = set(zf.namelist())
    assert "tests/extra/test_collectives_hidden.py" in names
    assert not any(n.startswith(("solutions", "labs/")) for n in names)
    assert not (folder / "solutions").exists() and not (folder / "tests" / "extra").exists()
    manifest = json.loads((folder / RELEASE_MANIFEST).read_text())
    assert "solutions/" in manifest["left_out"]


def test_building_the_zip_inside_a_release_is_refused_in_one_line(graded, tmp_path):
    """With the release's own package, run from the release: exit 2, one line, no zip."""
    folder = graded[0]
    env = {k: v for k, v in os.environ.items() if k not in ("WORKBOOK_ROOT", "WORKBOOK_IMPL")}
    env["PYTHONPATH"] = str(folder)
    out = subprocess.run([sys.executable, "-m", "workbook.cli", "autograder", "build",
                          "--lab", "collectives", "-o", str(tmp_path / "ag.zip")],
                         cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().splitlines() == [
        "workbook autograder: this course is a student release, which has neither the reference "
        "solutions nor the hidden tests: build the Gradescope zip in the course repository"]
    assert not (tmp_path / "ag.zip").exists() and not list(tmp_path.iterdir())
