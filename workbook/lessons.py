"""Helpers for the lesson notebooks (``lessons/``): run on ranks, draw rank buffers, grade.

The small things every lesson needs, kept here so the notebooks stay prose and experiments:

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
  as the notebook tests and ``tests/bench/lesson_stability.py`` do;
* ``sized(full, in_tests=...)``: a lesson's size (a batch, a sweep's points, a bench's steps):
  ``full``, what a learner runs, unless the test suite runs the lesson
  (``WORKBOOK_LESSONS_TEST_SIZE=1``, docs/headless-lessons.md);
* ``yours_reference_or_recorded(lab)`` and ``reference_lab(lab)``: for a lesson that stands the
  reference in for an unfinished lab. In a student release (no ``solutions/``) its cells that
  depend on the reference show what it produced when the release was made
  (``workbook.instructor.lesson_recording``), labelled, with the tasks to finish to see yours.

Imported, it defers jsonschema's IRI parsers (``defer_iri_parsers``): 2 s of CPU per kernel.
"""
from __future__ import annotations

import os
import subprocess
import sys

from workbook.runtime.launch import on_ranks  # noqa: F401 (the notebooks' way to run on ranks)
from workbook.trace.view import live_output, show_in  # noqa: F401 (what a widget panel shows)

ENV_NO_GRADE = "WORKBOOK_LESSONS_NO_GRADE"
ENV_TEST_SIZE = "WORKBOOK_LESSONS_TEST_SIZE"


def defer_iri_parsers(name: str = "rfc3987_syntax") -> None:
    """A lesson's first plotly figure imports nbformat, then jsonschema, whose format checkers
    import ``rfc3987_syntax``: that import builds some 35 lark parsers for the ``iri`` format
    (2 s of CPU in every kernel; no notebook schema uses it; python-jsonschema/jsonschema#1428).
    Here it is a stand-in until used: ``is_valid_syntax`` (what jsonschema calls) or any other
    name imports the real module, so ``iri`` is checked as before. Not installed: no change."""
    import importlib
    import importlib.util
    import types
    try:
        spec = None if name in sys.modules else importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return
    if spec is None:
        return
    stand_in = types.ModuleType(name, "stand-in: imports the real module on first use")
    stand_in.__spec__ = spec          # find_spec and reload see the real module's,
    stand_in.__path__ = spec.submodule_search_locations or []   # and its submodules import

    def real():
        if sys.modules.get(name) is stand_in:
            del sys.modules[name]
        return importlib.import_module(name)

    def attribute(attr: str):
        if attr.startswith("__"):         # the import system asks for __path__ etc.: not a use
            raise AttributeError(attr)
        return getattr(real(), attr)

    stand_in.is_valid_syntax = lambda term, value: real().is_valid_syntax(term, value)
    stand_in.__getattr__ = attribute
    sys.modules[name] = stand_in


defer_iri_parsers()      # every lesson imports this module before its first figure


def sized(full, in_tests):
    """``full``: the size a lesson runs at; ``in_tests`` where the test suite runs the lesson
    (the environment variable ``WORKBOOK_LESSONS_TEST_SIZE=1``, which the notebook, browser and
    release tests set and the kernel inherits). The test size runs every cell the same way, with
    fewer rounds, sweep points or rows; a learner never sets it."""
    return in_tests if os.environ.get(ENV_TEST_SIZE) == "1" else full


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


# --------------------------------------------------------------------------- in a student release
_SHOWN: dict = {}          # the recording replayed now: {"cells": {key: cell}, "label": str}


def open_tasks(lab: str, folder=None) -> list[int]:
    """The numbers of the tasks of ``labs/LAB.py`` (or ``folder/LAB.py``) still a stub: a task
    is open while one of its names still raises ``not implemented yet: LAB.NAME``."""
    import re
    from pathlib import Path

    from workbook.grading.labs import impl_dir
    from workbook.learner.task_list import lab_tasks
    folder = Path(folder) if folder else impl_dir("labs")
    text = (folder / f"{lab}.py").read_text()

    def stub(name: str) -> bool:
        return bool(re.search(rf"not implemented yet: {lab}\.{re.escape(name)}\b", text))
    try:
        tasks = lab_tasks(folder, lab)
    except (OSError, ValueError):                  # no task list: the lab is one task
        return [1] if stub("") or "not implemented yet" in text else []
    return [k for k, task in enumerate(tasks, 1) if any(stub(n) for n in task["names"])]


def _tasks_words(numbers: list[int]) -> str:
    """``[1, 2, 3, 5]`` as ``tasks 1-3, 5``."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    words = [f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs]
    return ("task " if len(numbers) == 1 else "tasks ") + ", ".join(words)


def recorded_label(lab: str, recording: dict, numbers: list[int]) -> str:
    """What a recorded output says it is: the reference's, recorded when, on what, and what to
    finish to see the learner's own."""
    made = recording.get("made_from") or {}
    where = recording.get("machine") or {}
    commit = (made.get("commit") or "uncommitted")[:10]
    return (f"recorded from the reference solutions/{lab}.py when this release was made "
            f"(commit {commit}, {where.get('cpu', '?')} with {where.get('cores', '?')} cores, "
            f"torch {where.get('torch', '?')}): finish {_tasks_words(numbers)} of "
            f"labs/{lab}.py to see yours")


def yours_reference_or_recorded(lab: str) -> str:
    """Which implementation the cells below show, for a lesson that stands the reference in
    for an unfinished lab: ``"yours"`` (every task of ``labs/LAB.py`` is written), else
    ``"reference"`` (the instructor's course: the lesson runs ``solutions/LAB.py`` live where
    your lab does not run yet), else ``"recorded"``: a student release, which has no
    solutions. Then every later cell that depends on the reference shows what it printed and
    drew when the release was made (``lessons/recorded/LAB.json.gz``, written by
    ``workbook release``), labelled ``recorded_label``, and the other cells run as usual."""
    from workbook.grading.labs import repo_root
    from workbook.instructor import lesson_recording
    root = repo_root()
    numbers = open_tasks(lab)
    _SHOWN.clear()
    if not numbers:
        return "yours"
    if (root / "solutions").is_dir():
        return "reference"
    path = root / lesson_recording.recording_file(lab)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: this course has no solutions/ and no "
                                f"recording of the reference; finish {_tasks_words(numbers)} of "
                                f"labs/{lab}.py, or ask for a release made by `workbook release`")
    recording = lesson_recording.load(path)
    _SHOWN.update(cells={c["key"]: c for c in recording["cells"]},
                  label=recorded_label(lab, recording, numbers))
    _replay_from_now_on()
    print(f"labs/{lab}.py: {_tasks_words(numbers)} not finished yet, and this copy of the course "
          f"holds no reference solutions. The cells below that show the reference show what it "
          f"produced when the release was made, each labelled 'recorded from the reference'; "
          f"finish the lab, then run the lesson again to see your own.")
    return "recorded"


def reference_lab(lab: str):
    """The reference module of ``lab`` (``solutions/LAB.py``) in the instructor's course; in a
    student release, your ``labs/LAB.py`` once every task is written (it stands in for the
    reference there). A release with tasks open never runs this: the cells that would are
    shown as recorded (``yours_reference_or_recorded``)."""
    from workbook.grading.labs import load_lab, repo_root
    if (repo_root() / "solutions").is_dir():
        return load_lab(lab, "solutions")
    numbers = open_tasks(lab)
    if numbers:
        raise RuntimeError(f"this course has no solutions/: finish {_tasks_words(numbers)} of "
                           f"labs/{lab}.py (or run the lesson's first cell, which shows the "
                           f"reference's recorded outputs)")
    return load_lab(lab, "labs")


def _replay(lines: list[str]) -> list[str]:
    """An IPython input transformer: a cell whose code was recorded becomes ``show_recorded``."""
    from workbook.instructor.lesson_recording import cell_key
    cell = _SHOWN.get("cells", {}).get(cell_key("".join(lines)))
    if cell is None:
        return lines
    return [f"__import__('workbook.lessons').lessons.show_recorded({cell['key']!r})\n"]


def _replay_from_now_on() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and _replay not in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.insert(0, _replay)


def show_recorded(key: str) -> None:
    """The recorded outputs of the cell ``key``, under their label."""
    from IPython.display import display
    cell = _SHOWN["cells"][key]
    print(f">>> {_SHOWN['label']}", flush=True)
    for output in cell["outputs"]:
        if output["output_type"] == "stream":
            stream = sys.stderr if output["name"] == "stderr" else sys.stdout
            stream.write(output["text"])
            stream.flush()
        else:
            display(output["data"], raw=True)
