"""The lessons run: every notebook in lessons/ executes top to bottom on CPU, with no error.

Each lesson's source is its jupytext percent script ``lessons/NN_name.py``; the committed
``NN_name.ipynb`` is its pair, with outputs stripped. These tests check the pair agrees, then
execute the notebook made from the script in a fresh Jupyter kernel (nbclient, through
``workbook.lessons.run_headless``), the way a learner's "Run All" would; the lessons the browser
test runs in JupyterLab are left to it where Chromium is installed (as in CI), and run here
otherwise, and the lessons ``test_release_lessons.py`` records afresh for a student release
(the recording runs them headless in the course, every cell, an error stopping it) are left to
it. Grading cells are skipped while the notebooks run (``WORKBOOK_LESSONS_NO_GRADE``);
``test_check_your_work`` runs the grading helper once on its own. The lessons run at their test
size (``WORKBOOK_LESSONS_TEST_SIZE=1``, ``workbook.lessons.sized``): every cell, with fewer
rounds, sweep points or rows where a lesson's own runs on ranks are the time.
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]
LESSONS = ROOT / "lessons"
SCRIPTS = sorted(LESSONS.glob("[0-9][0-9]_*.py"))
CELL_TIMEOUT_S = 240
SLOW_S = 60                    # a lesson runs in 10-25 s here; past this, its cells are reported


def _browser_run() -> set[str]:
    """The lessons ``test_browser.py`` runs end to end in JupyterLab + Chromium (every cell, no
    kernel error allowed), where it can run: nbclient need not run them a second time."""
    from test_browser import CHROMEDRIVER, CHROMIUM, LESSONS as IN_BROWSER
    return {Path(name).stem for name in IN_BROWSER} if CHROMIUM and CHROMEDRIVER else set()


BROWSER_RUN = _browser_run()


def _recorded_run() -> set[str]:
    """The lessons ``test_release_lessons.py`` records afresh for its release: the recording runs
    each of them headless in the course, stub labs and the reference beside them, and an error
    in any cell stops it, so nbclient need not run them a second time here."""
    from test_release_lessons import STANDING_IN
    return {Path(s["lesson"]).stem for s in STANDING_IN}


RECORDED_RUN = _recorded_run() - BROWSER_RUN


def _sources(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def test_there_are_lessons():
    assert SCRIPTS, f"no lesson scripts in {LESSONS}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_notebook_pair_in_sync(script):
    ipynb = script.with_suffix(".ipynb")
    assert ipynb.exists(), \
        f"{ipynb.name} is missing: run `jupytext --sync {script.relative_to(ROOT)}`"
    from_py, from_ipynb = jupytext.read(script), jupytext.read(ipynb)
    assert _sources(from_ipynb) == _sources(from_py), (
        f"{ipynb.name} and {script.name} differ: edit the .py, then `jupytext --sync` it")
    with_output = [i for i, c in enumerate(from_ipynb.cells)
                   if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))]
    assert not with_output, f"{ipynb.name}: cells {with_output} keep outputs; strip them"
    kernel = from_ipynb.metadata.get("kernelspec", {}).get("name")
    assert kernel == "python3", (f"{ipynb.name} names no python3 kernel (JupyterLab would ask): "
                                 f"`jupytext --set-kernel python3 {ipynb.relative_to(ROOT)}`")


@pytest.mark.timeout(2 * CELL_TIMEOUT_S)       # nbclient's per-cell timeout fires first, naming the cell
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_notebook_runs(script, monkeypatch):
    if script.stem in BROWSER_RUN:
        pytest.skip("run end to end in JupyterLab + Chromium by test_browser.py")
    if script.stem in RECORDED_RUN:
        pytest.skip("run headless in the course by test_release_lessons.py's recording")
    from workbook.lessons import run_headless
    monkeypatch.setenv("WORKBOOK_LESSONS_NO_GRADE", "1")        # the kernel inherits it
    monkeypatch.setenv("WORKBOOK_LESSONS_TEST_SIZE", "1")       # and the lessons' test size
    nb = jupytext.read(script)
    t0 = time.perf_counter()

    cells: list[str] = []

    def started(cell, cell_index, **_):  # shown if the test fails: which cell took the time
        first = (cell.source.strip().splitlines() or [""])[0][:70]
        cells.append(f"{time.perf_counter() - t0:7.1f} s  cell {cell_index}: {first}")
        print(cells[-1], flush=True)

    # nbclient with no stand-in for Output widgets, whose replies could stall a widget cell
    # for the whole CELL_TIMEOUT_S (nbclient#312, docs/headless-lessons.md); what a widget
    # captured lands in the cell's outputs, where the error check below sees it
    run_headless(nb, CELL_TIMEOUT_S, path=LESSONS, on_cell_execute=started)  # raises naming the cell
    elapsed = time.perf_counter() - t0
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, f"{script.name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    print(f"{script.name}: {elapsed:.1f} s")
    if elapsed > SLOW_S:                 # passed, but slow: say where the time went (CI's log)
        warnings.warn(f"{script.name} took {elapsed:.0f} s (> {SLOW_S} s); cells started at:\n"
                      + "\n".join(cells) + f"\n{elapsed:7.1f} s  done (kernel shut down)")


def test_check_your_work(capsys, monkeypatch):
    """The notebooks' grading cell: it shows the score table of the stubs and does not raise.
    (On ring_allreduce, whose stubs the grader fails in a tenth of a second: the cell's path is
    the same for every lab, and grading every lab's stubs is the test command's stub stage.)"""
    monkeypatch.delenv("WORKBOOK_LESSONS_NO_GRADE", raising=False)
    monkeypatch.delenv("WORKBOOK_IMPL", raising=False)
    from workbook.lessons import check_your_work
    code = check_your_work("ring_allreduce")
    out = capsys.readouterr().out
    assert code is not None and "TOTAL" in out and "ring_allreduce" in out, out[-3000:]
