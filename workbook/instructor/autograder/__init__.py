"""A Gradescope autograder: ``workbook autograder build`` makes the zip; ``run`` grades one.

    workbook autograder build --lab ring_allreduce [--lab tp ...] [--extra-tests DIR] -o ag.zip

Three modules: this one (the command line), ``bundle`` (building the zip) and ``run`` (grading
one submission). What the zip holds (Gradescope unpacks it into ``/autograder/source``):

    setup.sh           run once on Gradescope's Ubuntu image: a venv with the CPU build of the torch
                       version that built the zip, and this package from its own wheel
    run_autograder     run per submission (Gradescope copies it to /autograder/run_autograder):
                       ``workbook autograder run``
    autograder.json    the labs, the time limits and the versions (may be edited before uploading)
    dist/*.whl         this package, built from this checkout with the zip
    tests/grading/     the course's grading tests of those labs
    tests/extra/       the instructor's own tests (``--extra-tests DIR``), hidden ones included

``run``, per submission: finds the lab files in ``/autograder/submission`` (at any folder depth;
a missing, misnamed or extra file gets a line the student reads, never a crash), copies them to
a fresh folder, grades them with the points plugin under per-test time limits and a budget for
the whole run (``workbook.grading.limits``) and writes ``/autograder/results/results.json`` in
Gradescope's format. ``$AUTOGRADER_ROOT`` moves ``/autograder`` (for tests);
``$WORKBOOK_AUTOGRADER_PYTHON`` is the Python ``run_autograder`` grades with (default: the venv
that ``setup.sh`` made), so the zip can be tried without running ``setup.sh``.
"""
from __future__ import annotations

import os
from pathlib import Path

from workbook.instructor.autograder.bundle import DEFAULT_TEST_TIMEOUT_S, DEFAULT_TIME_BUDGET_S, ENV_ROOT, \
    RESERVE_S, build
from workbook.instructor.autograder.run import inspect_submission, run
from workbook.grading.labs import LABS

__all__ = ["build", "run", "inspect_submission", "register", "RESERVE_S"]


# --------------------------------------------------------------------------- the command line
def register(subparsers) -> None:
    """Add ``autograder`` (``build``, ``run``) to the ``workbook`` command's subparsers."""
    p = subparsers.add_parser(
        "autograder", help="make a Gradescope autograder zip (build); grade a submission (run)",
        description=__doc__.split("\n\n")[0])
    actions = p.add_subparsers(dest="action", required=True)
    b = actions.add_parser("build", help="make autograder.zip for Gradescope",
                           description="Make a zip to upload as a Gradescope programming "
                                       "assignment's autograder: setup.sh, run_autograder, this "
                                       "package as a wheel and the grading tests of each LAB.")
    b.add_argument("--lab", action="append", required=True, metavar="LAB",
                   help=f"a lab to grade (repeat for more): {', '.join(LABS)}")
    b.add_argument("--extra-tests", default=None, metavar="DIR",
                   help="a folder of your own pytest files (test_*.py) to run as well: "
                        "hidden tests, for instance (@pytest.mark.points(n, visibility='hidden'))")
    b.add_argument("-o", "--output", default="autograder.zip", help="the zip (autograder.zip)")
    b.add_argument("--test-timeout", type=float, default=DEFAULT_TEST_TIMEOUT_S, metavar="S",
                   help=f"seconds one test may take before it scores 0 as a hang "
                        f"(default {DEFAULT_TEST_TIMEOUT_S:g})")
    b.add_argument("--time-budget", type=float, default=DEFAULT_TIME_BUDGET_S, metavar="S",
                   help=f"seconds for grading one submission, below Gradescope's limit for the "
                        f"assignment (default {DEFAULT_TIME_BUDGET_S:g}: Gradescope's is 600); "
                        "tests left when it is spent score 0")
    b.add_argument("--max-ranks", default="auto", metavar="N|auto",
                   help="the most ranks grading uses (WORKBOOK_MAX_RANKS); auto (the default) "
                        "picks it on the grading machine from its memory: 1 below 2 GiB, 2 "
                        "below 4 GiB, else no cap. Verdicts do not depend on it, only the "
                        "memory and time grading takes")
    b.add_argument("--level", default="standard", choices=("guided", "standard", "challenge"),
                   help="the level the labs were handed out at (workbook assign --level): the "
                        "same tests grade every level; the results say which it was")
    b.set_defaults(func=_cmd_build)
    r = actions.add_parser("run", help="grade one submission (what run_autograder calls)")
    r.add_argument("--root", default=None,
                   help=f"the autograder folder (default ${ENV_ROOT}, else /autograder)")
    r.set_defaults(func=_cmd_run)


def _cmd_build(args) -> int:
    zip_path = build(args.lab, args.output, extra_tests=args.extra_tests,
                     test_timeout=args.test_timeout, time_budget=args.time_budget,
                     max_ranks=args.max_ranks, level=args.level)
    print(f"wrote {zip_path}: upload it as the autograder of a Gradescope programming assignment")
    return 0


def _cmd_run(args) -> int:
    root = Path(args.root or os.environ.get(ENV_ROOT) or "/autograder")
    run(root)
    return 0
