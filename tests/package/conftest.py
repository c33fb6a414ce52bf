"""Shared set-up for the package's own tests.

The link calibration is pinned (WORKBOOK_LOCAL_FLOPS) so that modelled times do not depend on how
busy this machine is while the tests run, and each rank keeps the model weights it drew
(WORKBOOK_WEIGHT_CACHE_MB); rank pools inherit both when they start.

The test command runs these tests on two pytest-xdist workers (docs/test-suite.md). Each module
is one unit of work, so that its fixtures (a JupyterLab, a graded wrong lab, a rank pool) are
made once, on one worker; the modules that grade measured time (an overlap figure of a wrong
lab, a solution graded for full marks, a benchmark's figures) form one unit, ``timed``, so that
no two of them ever measure at the same time. Units go out longest first, by the seconds of a
recorded run (``module_seconds.json``), so that both workers end at about the same time.
"""
import os
from pathlib import Path

import pytest

from workbook.lessons import defer_iri_parsers

# jsonschema's IRI parsers (about 2 s of CPU a process, built when nbclient first imports it; no
# test validates an IRI): built on first use only, as in a lesson's kernel. The test command
# loads no nbmake (-p no:nbmake), which would import them before this file.
defer_iri_parsers()

os.environ.setdefault("WORKBOOK_LOCAL_FLOPS", "5e10")
# a warm rank keeps the weights it drew (workbook.model.init.full_weight): the graders build
# the same model many times here, and drawing a large one takes seconds
os.environ.setdefault("WORKBOOK_WEIGHT_CACHE_MB", "512")

TIMED = {"test_wrong_impls_caught", "test_autograder", "test_class_grading", "test_learner",
         "test_trace_steps", "test_selfcheck_traces",
         "test_ep_overlap_grader"}      # grades the ep_overlap grader's overlap figures
# (test_release_autograder is not: it grades collectives, finished, and overlap_math, a stub,
# neither with a figure read from time, so it runs on the other worker)


# the browser runs the heaviest lessons (30-40 s each on a quiet machine): it starts late, once
# the grading stages beside the package tests (docs/test-suite.md) are done, so that it shares
# the two cores with one other test instead of three (a lesson took 70 s in run 17, where it
# started beside them); it is queued where what is left after it takes about as long as it does
# (the other worker's share while the browser runs), so that both workers still end together
LAST = {"test_browser"}
# in the timed group (one worker, module after module), the autograder's gradings go last: each
# starts a grading process and its rank pools, and the hang waits out its 15 s test timeout;
# run first, they shared the cores with the grading stages (run 21: the hang 61 s, with 8 s of
# CPU); last, those stages are done (they take about 320 s)
TIMED_LATE = {"test_class_grading", "test_autograder"}
# long single tests that start several processes (the site's 37 pages in Chromium): handed out
# once the other worker has had about the grading stages' time of work (GRADING_S), not beside
# those stages (run 22: the site's pages 79.8 s there, 37 s after them in run 20)
AFTER_GRADING, GRADING_S = {"test_site"}, 420.0       # solutions about 330 s, then the stubs
# modules whose tests share no module fixture: each test is its own unit of work, so that the
# short ones fill the gaps at the end of the run
SPLIT = {"test_notebooks"}
# each module's seconds in a recorded run (`tests/bench/suite_time.py --table FILE
# --module-seconds tests/package/module_seconds.json`): the longest are handed out first
SECONDS_FILE = Path(__file__).with_name("module_seconds.json")


def is_timed(module: str) -> bool:
    """Does this test module judge measured time (its checks grade an overlap figure)?"""
    return module in TIMED or module.endswith("_wrong_caught") or module.startswith("test_bench_")


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: ``timed``, its module, or itself (``SPLIT``)."""
    module = nodeid.split("::", 1)[0]
    stem = Path(module).stem
    if is_timed(stem):
        return "timed"
    return nodeid if stem in SPLIT else module


def work_order(units: dict[str, int], seconds: dict) -> list[str]:
    """The order in which units are handed out: ``timed`` first (one worker runs it, module after
    module), then the longest first (the classic longest-processing-time rule, which keeps the
    two workers' ends close), the ``AFTER_GRADING`` modules where the units before them (the
    timed unit aside) take ``GRADING_S``, the ``LAST`` modules held back until what is queued
    after them takes about as long as they do. ``units`` maps a unit to its number of tests; ``seconds`` is
    ``SECONDS_FILE``'s content: a unit's expected seconds are its own where recorded (a test of
    a ``SPLIT`` module), else its module's share, else two seconds a test."""
    modules, tests = seconds.get("modules", {}), seconds.get("tests", {})

    def expected(unit: str) -> float:
        if unit == "timed":
            return float("inf")
        if unit in tests:
            return tests[unit]
        stem = Path(unit.split("::", 1)[0]).stem
        siblings = [u for u in units if Path(u.split("::", 1)[0]).stem == stem]
        known = sum(tests.get(u, 0.0) for u in siblings if u != unit and "::" in u)
        rest = sum(units[u] for u in siblings if u not in tests)
        in_module = sum(units[u] for u in siblings)
        return max(modules.get(stem, 2.0 * in_module) - known, 0.0) * units[unit] / rest

    order = sorted(units, key=lambda u: (-expected(u), u))
    held = [u for u in order if Path(u.split("::", 1)[0]).stem in LAST]
    later = [u for u in order if Path(u.split("::", 1)[0]).stem in AFTER_GRADING]
    order = [u for u in order if u not in held and u not in later]
    at, before = 0, 0.0                      # the timed unit goes to one worker: not counted
    while at < len(order) and before < GRADING_S:
        before += 0.0 if order[at] == "timed" else expected(order[at])
        at += 1
    order = order[:at] + later + order[at:]
    at, after, browser = len(order), 0.0, sum(map(expected, held))
    while at > 1 and after + expected(order[at - 1]) <= browser:   # never before the first unit
        at -= 1
        after += expected(order[at])
    return order[:at] + held + order[at:]


def pytest_collection_modifyitems(config, items):
    """``TIMED_LATE`` modules after the rest (a stable sort: every other test keeps its place);
    a unit's tests go to its worker in this order."""
    items.sort(key=lambda item: Path(item.nodeid.split("::", 1)[0]).stem in TIMED_LATE)


@pytest.hookimpl(optionalhook=True)            # only where pytest-xdist is installed
def pytest_xdist_make_scheduler(config, log):
    """Units of work (``unit_of``) handed out in ``work_order`` (the ``xdist_group`` marker did
    not group under pytest 9.2: a scheduler of our own)."""
    import json

    from xdist.scheduler import LoadScopeScheduling

    try:
        seconds = json.loads(SECONDS_FILE.read_text())
    except (OSError, ValueError):
        seconds = {}

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not getattr(self, "_ordered", False):
                units = {scope: len(tests) for scope, tests in self.workqueue.items()}
                for unit in work_order(units, seconds):
                    self.workqueue.move_to_end(unit)
                self._ordered = True
            super()._assign_work_unit(node)

    return ModuleGroups(config, log)
