"""Shared set-up for the package's own tests.

The link calibration is pinned (WORKBOOK_LOCAL_FLOPS) so that modelled times do not depend on how
busy this machine is while the tests run, and each rank keeps the model weights it drew
(WORKBOOK_WEIGHT_CACHE_MB); rank pools inherit both when they start.

The test command runs these tests on two pytest-xdist workers (docs/test-suite.md). Each module is one group, so a module's fixtures (a JupyterLab, a graded
wrong lab, a rank pool) are made once, on one worker; the modules that grade measured time (an
overlap figure of a wrong lab, a solution graded for full marks, a benchmark's figures) form one
group, ``timed``, so that no two of them ever measure at the same time.
"""
import os
from pathlib import Path

import pytest

os.environ.setdefault("WORKBOOK_LOCAL_FLOPS", "5e10")
# a warm rank keeps the weights it drew (workbook.model.init.full_weight): the graders build
# the same model many times here, and drawing a large one takes seconds
os.environ.setdefault("WORKBOOK_WEIGHT_CACHE_MB", "512")

TIMED = {"test_wrong_impls_caught", "test_autograder", "test_class_grading", "test_learner",
         "test_trace_steps", "test_selfcheck_traces",
         "test_ep_overlap_grader"}      # grades the ep_overlap grader's overlap figures
# (test_release_autograder is not: it grades collectives, finished, and overlap_math, a stub,
# neither with a figure read from time, so it runs on the other worker)


# the browser runs the heaviest lessons (30-40 s each on a quiet machine): it goes last on its
# worker, once the grading stages beside the package tests (docs/test-suite.md) are done, so that
# it shares the two cores with one other test instead of three (a lesson there took up to 76 s)
LAST = {"test_browser"}


def is_timed(module: str) -> bool:
    """Does this test module judge measured time (its checks grade an overlap figure)?"""
    return module in TIMED or module.endswith("_wrong_caught") or module.startswith("test_bench_")


@pytest.hookimpl(optionalhook=True)            # only where pytest-xdist is installed
def pytest_xdist_make_scheduler(config, log):
    """Whole modules to a worker, every module of ``is_timed`` to one worker, in turn, and the
    modules of ``LAST`` after all others (the ``xdist_group`` marker did not group under pytest
    9.2: a scheduler of our own)."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "timed" if is_timed(Path(module).stem) else module

        def _assign_work_unit(self, node) -> None:
            for scope in [s for s in self.workqueue if Path(s).stem in LAST]:
                self.workqueue.move_to_end(scope)
            super()._assign_work_unit(node)

    return ModuleGroups(config, log)
