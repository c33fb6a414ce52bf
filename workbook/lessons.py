"""Helpers for the lesson notebooks (``lessons/``): run on ranks, draw rank buffers, grade.

Three small things every lesson needs, kept here so the notebooks stay prose and experiments:

* ``on_ranks(fn, n, ...)``: run a function defined in the notebook on ``n`` warm ranks (a shared
  ``RankPool``: the first call for a given ``n`` starts the processes, later calls take
  milliseconds, so widgets can re-run on every change);
* ``buffers_figure(before, after, ...)``: a plotly picture of which rank holds which values, before
  and after a collective;
* ``self_check(lab)``: the lab's self-check (the grader's checks, its messages) in the notebook;
* ``check_your_work(lab)``: run ``workbook grade --lab LAB`` and show its score table in the
  notebook, whatever the score (an unfinished lab is not an error in a lesson). With the
  environment variable ``WORKBOOK_LESSONS_NO_GRADE=1`` (the notebook tests set it) it only
  prints the command;
* ``show_in(out, ...)`` and ``live_output(draw, controls)`` (from :mod:`workbook.trace.view`):
  what a widget panel shows. A lesson never writes ``with out: display(...)``: under a headless
  runner that capture can stall a cell for its whole timeout (docs/headless-lessons.md);
* ``run_headless(nb, timeout)``: execute a lesson notebook in a fresh kernel with no front end,
  as the notebook tests and ``tests/bench/lesson_stability.py`` do.
"""
from __future__ import annotations

import os
import subprocess
import sys

from workbook.runtime.launch import on_ranks  # noqa: F401 (the notebooks' way to run on ranks)
from workbook.trace.view import live_output, show_in  # noqa: F401 (what a widget panel shows)

ENV_NO_GRADE = "WORKBOOK_LESSONS_NO_GRADE"


def buffers_figure(before: list, after: list, title: str = "", labels=("before", "after")):
    """Two grids side by side: row r is rank r's buffer, one cell per element, value written in.

    ``before``/``after``: one list of numbers per rank (``None`` or ``[]`` for a rank that holds
    nothing, as a non-root after a gather). Cells are coloured by value."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    n = len(before)
    width = max(1, max(len(b or []) for b in list(before) + list(after)))
    fig = make_subplots(rows=1, cols=2, subplot_titles=list(labels), horizontal_spacing=0.08)
    values = [v for b in list(before) + list(after) for v in (b or [])]
    lo, hi = (min(values), max(values)) if values else (0, 1)
    for col, grid in ((1, before), (2, after)):
        z = [[(row[i] if row and i < len(row) else None) for i in range(width)] for row in grid]
        text = [["" if v is None else f"{v:g}" for v in r] for r in z]
        fig.add_trace(go.Heatmap(z=z, text=text, texttemplate="%{text}", zmin=lo, zmax=hi,
                                 colorscale="Blues", showscale=False, xgap=3, ygap=3,
                                 hovertemplate="rank %{y}, element %{x}: %{z}<extra></extra>"),
                      row=1, col=col)
        fig.update_yaxes(tickvals=list(range(n)), ticktext=[f"rank {r}" for r in range(n)],
                         autorange="reversed", row=1, col=col)
        fig.update_xaxes(title_text="element", dtick=1, row=1, col=col)
    fig.update_layout(title=title, height=110 + 45 * n, margin=dict(l=10, r=10, t=70, b=40))
    return fig


def self_check(lab: str, impl: str = "labs", nproc: int | None = None,
               timeout: float = 60.0) -> int:
    """The self-check from a notebook cell: the grader's checks on your lab, their verdicts
    printed here (a hang ends after ``timeout`` seconds in each rank's last collective).

    Returns the exit status ``workbook run`` would give (0 passed, 1 failed, 2 hang)."""
    from workbook.selfcheck import self_check as run
    return run(lab, impl=impl, nproc=nproc, timeout=timeout)


def hint(lab: str, task=None, show_all: bool = False, impl: str = "labs") -> None:
    """The next hint rung of a task, as `workbook hint LAB TASK` prints it (``show_all``: every
    rung); the rungs opened are remembered, as on the command line."""
    from workbook.learner.hints import hint as next_hint
    print(next_hint(lab, task, show_all=show_all, impl=impl))


def check_your_work(lab: str, impl: str = "labs", timeout: float = 600.0) -> int | None:
    """Grade ``lab`` (your ``labs/`` file by default) and print the score table.

    Returns the grader's exit status (None when skipped); never raises on a low score."""
    cmd = [sys.executable, "-m", "workbook.cli", "grade", "--lab", lab, "--impl", impl]
    if os.environ.get(ENV_NO_GRADE):
        print(f"(grading skipped here: {ENV_NO_GRADE} is set) run:  workbook grade --lab {lab}")
        return None
    print("$ workbook grade --lab", lab, *(["--impl", impl] if impl != "labs" else []), flush=True)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"grading did not finish within {timeout:g} s")
        return None
    text = proc.stdout
    start = text.find("score (")
    table = text[text.rfind("\n", 0, start) + 1:] if start >= 0 else text + proc.stderr[-3000:]
    print("\n".join(ln for ln in table.splitlines() if not ln.startswith("FAILED ")))
    return proc.returncode


def run_headless(nb, timeout: float, path=None, **hooks):
    """Execute the notebook ``nb`` (an nbformat node, changed in place) in a fresh ``python3``
    kernel with nbclient, ``timeout`` seconds per cell; ``path``: the kernel's working folder;
    ``hooks``: nbclient's ``on_cell_execute=`` etc. Raises nbclient's CellExecutionError naming
    the failing cell. Returns the client (its ``widget_state`` holds what the widgets showed).

    The client plays no Output widget: an ``ipywidgets.Output`` used as ``with out:`` (as
    ``ipywidgets.interactive`` does) has its outputs filed with the cell's own, where the error
    check sees them, instead of being mirrored into the widget. nbclient's stand-in for the
    widget answers each captured output with a message on the shell channel while it waits
    there for the cell's reply, and sometimes misses the reply: the cell then takes its whole
    timeout (https://github.com/jupyter/nbclient/issues/312; docs/headless-lessons.md).
    """
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path)}} if path else {}, **hooks)
    client.widget_registry = {}       # no stand-in for Output widgets (see above): nbclient#312
    client.execute()
    return client
