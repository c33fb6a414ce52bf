"""The grader as a pytest plugin: points, the implementation under test, a score table, Gradescope.

* ``@pytest.mark.points(3)``: a test is worth 3 points, all or nothing;
* ``--impl labs|solutions|FOLDER``: whose lab files are graded (labs by default);
* at the end, a table of every graded test with its points, and the total;
* ``--gradescope results.json``: the same in Gradescope's autograder format (a test that errors
  in setup scores 0 of its points);
* a learner's unfinished TODO (``NotImplementedError`` from a generated stub) is reported as one
  line, ``not implemented yet: <lab>.<function>``, not as a stack dump.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from workbook.grading.labs import ENV_IMPL, block_solutions, impl_dir

_RESULTS_KEY = pytest.StashKey[dict]()


def pytest_addoption(parser):
    group = parser.getgroup("workbook grading")
    group.addoption("--impl", default=None,
                    help="grade labs (default), solutions, or a folder of lab files")
    group.addoption("--gradescope", default=None, metavar="PATH",
                    help="write a Gradescope results.json here")


def pytest_configure(config):
    config.addinivalue_line("markers", "points(n): the test is worth n points (all or nothing)")
    impl = config.getoption("--impl") or os.environ.get(ENV_IMPL) or "labs"
    folder = impl_dir(impl)                       # fails early with a clear message
    os.environ[ENV_IMPL] = impl if impl in ("labs", "solutions") else str(folder)
    if folder.name != "solutions":
        block_solutions()
    config.stash[_RESULTS_KEY] = {}


def _not_implemented(excinfo) -> str | None:
    """The 'not implemented yet: lab.function' line, if this failure is an unfinished stub."""
    exc = excinfo.value if excinfo else None
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, NotImplementedError):
            text = str(exc).strip() or "not implemented yet"
            return text if text.startswith("not implemented yet") else f"not implemented yet: {text}"
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("points")
    if marker is None:
        return
    points = float(marker.args[0]) if marker.args else 1.0
    stub = _not_implemented(call.excinfo) if call.excinfo else None
    if stub and report.failed:
        report.longrepr = stub
    results = item.config.stash[_RESULTS_KEY]
    entry = results.setdefault(item.nodeid, {"name": item.nodeid, "max_score": points,
                                             "score": points, "status": "passed", "output": ""})
    if report.failed or (report.skipped and report.when != "teardown"):
        entry.update(score=0.0, status="failed",
                     output=stub or _short(report))


def _short(report) -> str:
    if report.skipped:
        return f"skipped: {report.longrepr[2] if isinstance(report.longrepr, tuple) else ''}"
    text = getattr(report, "longreprtext", "") or str(report.longrepr)
    lines = [ln for ln in text.splitlines() if ln.startswith("E ")]
    return "\n".join(ln[2:].strip() for ln in lines[-12:]) or text[-2000:]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    results = config.stash.get(_RESULTS_KEY, {})
    if not results:
        return
    tr = terminalreporter
    tr.section(f"score ({os.environ.get(ENV_IMPL, 'labs')})")
    width = min(70, max(len(n) for n in results))
    for r in results.values():
        name = r["name"] if len(r["name"]) <= width else "..." + r["name"][-width + 3:]
        line = f"{name:<{width}}  {r['score']:>5g} / {r['max_score']:<4g}"
        if r["status"] != "passed":
            first = (r["output"].splitlines() or [""])[0]
            line += f"  {first[:100]}"
        tr.write_line(line)
    score = sum(r["score"] for r in results.values())
    total = sum(r["max_score"] for r in results.values())
    tr.write_line(f"{'TOTAL':<{width}}  {score:>5g} / {total:<4g}")
    path = config.getoption("--gradescope")
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps({
            "score": score, "max_score": total,
            "tests": [{k: r[k] for k in ("name", "score", "max_score", "status", "output")}
                      for r in results.values()]}, indent=2))
        tr.write_line(f"gradescope results written to {path}")
