"""Time limits for a grading run, as a pytest plugin (``-p workbook.grading.limits``).

Gradescope stops a whole run at its time limit (10 minutes by default) and then shows the
student nothing. Under this plugin one hung test cannot take the run with it:

* ``--test-timeout S``: each test has S seconds. Every run on ranks inside it gets at most what
  is left (``engine.STATE.deadline``), so a hang ends in the pool's per-rank report and that
  pool is killed (the next test starts a fresh one). Starting rank processes does not count
  (a slow machine is not the learner's fault). Code that never returns in this process (a loop
  in a function graded without ranks) is stopped by an alarm a few seconds later;
* ``--time-budget S``: seconds for the whole session. A test starts only while some are left
  and never runs past the end; the tests after it score 0 with "not run: the time budget was
  spent";
* ``--lab-missing LAB=MESSAGE``: the tests of a lab whose file was not submitted score 0 with
  MESSAGE, without running;
* ``--progress PATH``: the graded tests, then each result as it is made, one JSON object per
  line, so that whoever started the run can still write results if it is killed.
"""
from __future__ import annotations

import contextlib
import json
import signal
import time
from pathlib import Path

import pytest

from workbook.grading import engine
from workbook.grading.labs import LABS, impl_dir
from workbook.grading.plugin import _label, graded_results, grading_mark
from workbook.runtime.pool import RanksTimedOut, close_shared_pools

NOT_RUN = "not run: the time budget was spent"
ALARM_GRACE_S = 5.0         # the alarm fires this long after a test's deadline: a run on ranks
                            # ends at the deadline with its own (better) report first


class TimeLimitExceeded(RanksTimedOut):
    """A test ran past its time limit in this process (not inside a run on ranks)."""


def lab_of(path) -> str | None:
    """The lab a test file grades: ``test_<lab>.py`` or ``test_<lab>_<anything>.py``."""
    stem = Path(str(path)).stem.removeprefix("test_")
    named = [lab for lab in LABS if stem == lab or stem.startswith(lab + "_")]
    return max(named, key=len) if named else None


def pytest_addoption(parser):
    group = parser.getgroup("workbook time limits")
    group.addoption("--test-timeout", type=float, default=None, metavar="S",
                    help="seconds each test may take; a hang in it scores 0 with its report")
    group.addoption("--time-budget", type=float, default=None, metavar="S",
                    help="seconds for the whole run; tests after it score 0 (not run)")
    group.addoption("--lab-missing", action="append", default=[], metavar="LAB=MESSAGE",
                    help="the lab file was not submitted: its tests score 0 with MESSAGE")
    group.addoption("--progress", default=None, metavar="PATH",
                    help="append the graded tests and each result to PATH (JSON lines)")


def pytest_configure(config):
    config.pluginmanager.register(Limits(config), "workbook-time-limits")


class Limits:
    def __init__(self, config):
        self.config = config
        self.per_test = config.getoption("--test-timeout")
        budget = config.getoption("--time-budget")
        self.end = None if budget is None else time.monotonic() + max(0.0, budget)
        self.missing = {}
        for spec in config.getoption("--lab-missing"):
            lab, _, message = (s.strip() for s in spec.partition("="))
            self.missing[lab] = message or f"file {lab}.py was not submitted"
        path = config.getoption("--progress")
        self.progress = Path(path) if path else None
        self.started = self.deadline = None
        self.in_call = self.alarmed = False
        self.alarm, self._old_handler = False, None
        if hasattr(signal, "SIGALRM") and (self.per_test or self.end is not None):
            with contextlib.suppress(ValueError):           # not the main thread: runs only
                self._old_handler = signal.signal(signal.SIGALRM, self._on_alarm)
                self.alarm = True

    def _write(self, record: dict) -> None:
        if self.progress is not None:
            with self.progress.open("a") as f:
                f.write(json.dumps(record) + "\n")

    def pytest_collection_finish(self, session):
        graded = [(item, grading_mark(item)) for item in session.items]
        self._write({"collected": [{"nodeid": item.nodeid, "name": _label(item),
                                    "max_score": mark[0], "visibility": mark[1]}
                                   for item, mark in graded if mark]})

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        now = self.started = time.monotonic()
        self.alarmed = False
        message = self.missing.get(lab_of(getattr(item, "path", "")))
        if message:
            pytest.fail(message, pytrace=False)
        if self.end is not None and now >= self.end:
            pytest.fail(NOT_RUN, pytrace=False)
        ends = [t for t in (now + self.per_test if self.per_test else None, self.end) if t]
        self.deadline = engine.STATE.deadline = min(ends) if ends else None
        if self.deadline is not None and self.alarm:
            signal.setitimer(signal.ITIMER_REAL, self.deadline + ALARM_GRACE_S - now)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        self.in_call = True
        try:
            yield
        finally:
            self.in_call = False

    def _on_alarm(self, signum, frame):
        if engine.STATE.deadline is None:       # no test is running
            return
        now = time.monotonic()
        due = min(t for t in (engine.STATE.deadline, self.end) if t is not None)
        if now < due + ALARM_GRACE_S - 0.05:    # the deadline moved: ranks were started
            signal.setitimer(signal.ITIMER_REAL, due + ALARM_GRACE_S - now)
            return
        if not self.in_call:                    # between pytest's own steps: a moment later
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            return
        self.alarmed = True
        raise TimeLimitExceeded(f"this test did not finish within {self._limit_words()} and "
                                f"was stopped{_where(frame)}")

    def _limit_words(self) -> str:
        if self.end is not None and time.monotonic() >= self.end - 0.5:
            return "the time budget of the whole run"
        return f"the autograder's time limit of {self.per_test:g} s per test"

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item):
        if self.alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
        self.deadline, engine.STATE.deadline = engine.STATE.deadline, None
        if self.alarmed:                        # ranks may still be busy with the stopped run
            close_shared_pools()

    def pytest_runtest_logfinish(self, nodeid, location):
        entry = graded_results(self.config).get(nodeid)
        if entry is None:
            return
        if (entry["status"] != "passed" and not self.alarmed and self.deadline is not None
                and time.monotonic() >= self.deadline - 0.5
                and not entry["output"].startswith(NOT_RUN)):
            entry["output"] += f"\n(stopped at {self._limit_words()})"
        seconds = time.monotonic() - self.started if self.started else 0.0
        self._write({"result": dict(entry, nodeid=nodeid, seconds=round(seconds, 2))})
        self.deadline = None

    def pytest_unconfigure(self, config):
        if self.alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old_handler)


def _where(frame) -> str:
    """`` while running labs/tp.py:42, in forward``: the innermost frame in a lab file."""
    folder = impl_dir()
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.stem in LABS and path.parent == folder:
            return (f" while running {path.parent.name}/{path.name}:{frame.f_lineno}, "
                    f"in {frame.f_code.co_name}")
        frame = frame.f_back
    return ""
