"""The grader as a pytest plugin: points, the implementation under test, a score table, Gradescope.

* ``@pytest.mark.points(3)``: a test is worth 3 points, all or nothing;
  ``@pytest.mark.points(3, visibility="hidden")``: when Gradescope shows it to the student
  (``visible``, the default; ``hidden``, ``after_due_date``, ``after_published``);
* ``--impl labs|solutions|FOLDER``: whose lab files are graded (labs by default);
* at the end, a table of every graded test with its points, and the total;
* ``--gradescope results.json``: the same in Gradescope's autograder format (a test that errors
  in setup scores 0 of its points);
* every failure is listed once, in the score table, with its full message (the same message
  the self-check prints, ``workbook.grading.engine.verdict_for``); pytest's traceback of the
  grader's own code shows only with ``-v``;
* a learner's unfinished TODO (``NotImplementedError`` from a generated stub) is reported as one
  line, ``not implemented yet: <lab>.<function>``, not as a stack dump.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from workbook.grading.engine import verdict_for
from workbook.grading.labs import ENV_IMPL, use_impl

_RESULTS_KEY = pytest.StashKey[dict]()
VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")     # Gradescope's


def pytest_addoption(parser):
    group = parser.getgroup("workbook grading")
    group.addoption("--impl", default=None,
                    help="grade labs (default), solutions, or a folder of lab files")
    group.addoption("--gradescope", default=None, metavar="PATH",
                    help="write a Gradescope results.json here")


def pytest_configure(config):
    config.addinivalue_line("markers", "points(n, visibility='visible'): the test is worth n "
                                       "points (all or nothing); visibility: when Gradescope "
                                       f"shows it ({', '.join(VISIBILITIES)})")
    config.addinivalue_line("markers", "tasks(*names): the lab functions/classes the test grades; "
                                       "its points are split among them in the lab's task list "
                                       "(read by `workbook assign`)")
    impl = config.getoption("--impl") or os.environ.get(ENV_IMPL) or "labs"
    use_impl(impl)
    config.stash[_RESULTS_KEY] = {}


def grading_mark(item) -> tuple[float, str] | None:
    """``(points, visibility)`` of a graded test, None for an ungraded one; a visibility that
    Gradescope does not know is a usage error naming the test."""
    marker = item.get_closest_marker("points")
    if marker is None:
        return None
    visibility = marker.kwargs.get("visibility", "visible")
    if visibility not in VISIBILITIES:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.points(..., "
                                f"visibility={visibility!r}): visibility must be one of "
                                f"{', '.join(VISIBILITIES)}")
    return (float(marker.args[0]) if marker.args else 1.0), visibility


def graded_results(config) -> dict:
    """``{nodeid: {name, max_score, score, status, output, visibility}}``: the tests graded so
    far."""
    return config.stash.get(_RESULTS_KEY, {})


def _label(item) -> str:
    """``collectives::reduce_pattern`` for ``tests/grading/test_collectives.py::test_reduce_pattern``."""
    module = item.path.stem.removeprefix("test_") if hasattr(item, "path") else ""
    return f"{module}::{item.name.removeprefix('test_')}"


def pytest_collection_modifyitems(session, config, items):
    """A grading run prints each failure once, as its message: in the score table (pytest's own
    failure section and short summary are turned off unless ``-v`` asks for the details)."""
    marks = [grading_mark(i) for i in items]           # a bad visibility stops the run here
    if config.option.verbose > 0 or not any(marks):
        return
    config.option.tbstyle = "no"
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.reportchars = ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    mark = grading_mark(item)
    if mark is None:
        return
    points, visibility = mark
    results = item.config.stash[_RESULTS_KEY]
    entry = results.setdefault(item.nodeid, {"name": _label(item), "max_score": points,
                                             "score": points, "status": "passed", "output": "",
                                             "visibility": visibility})
    if not (report.failed or (report.skipped and report.when != "teardown")):
        return
    if report.skipped:
        message = f"skipped: {report.longrepr[2] if isinstance(report.longrepr, tuple) else ''}"
    else:
        exc = call.excinfo.value if call.excinfo else None
        message = verdict_for("", entry["name"], points, exc).message if exc is not None \
            else str(report.longrepr)
        if item.config.option.verbose <= 0:
            report.longrepr = message
    if entry["status"] == "passed":                 # the first failing phase says why
        entry.update(score=0.0, status="failed", output=message)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    results = config.stash.get(_RESULTS_KEY, {})
    if not results:
        return
    tr = terminalreporter
    tr.section(f"score ({os.environ.get(ENV_IMPL, 'labs')})")
    width = max(len(r["name"]) for r in results.values())
    shown: dict[str, str] = {}
    for r in results.values():
        mark = ("" if r["status"] == "passed" else "  FAILED") + (
            "" if r["visibility"] == "visible" else f"  ({r['visibility']})")
        tr.write_line(f"{r['name']:<{width}}  {r['score']:>5g} / {r['max_score']:<4g}{mark}")
        if r["status"] == "passed":
            continue
        if r["output"] in shown:
            tr.write_line(f"    (same as {shown[r['output']]})")
            continue
        shown[r["output"]] = r["name"]
        for line in r["output"].splitlines():
            tr.write_line(f"    {line}")
    score = sum(r["score"] for r in results.values())
    total = sum(r["max_score"] for r in results.values())
    tr.write_line(f"{'TOTAL':<{width}}  {score:>5g} / {total:<4g}")
    path = config.getoption("--gradescope")
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps({
            "score": score, "max_score": total,
            "tests": [{k: r[k] for k in ("name", "score", "max_score", "status", "output")}
                      | ({} if r["visibility"] == "visible" else {"visibility": r["visibility"]})
                      for r in results.values()]}, indent=2))
        tr.write_line(f"gradescope results written to {path}")
