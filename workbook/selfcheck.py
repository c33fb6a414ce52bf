"""The self-check: the grader's checks, run on your lab, with the grader's messages.

    workbook run LAB [--nproc N]          from the command line (labs/ by default)
    python labs/LAB.py [--nproc N]        the lab file itself
    torchrun --nproc_per_node=N labs/LAB.py
    workbook.lessons.self_check(LAB)      a notebook cell

Every way runs ``workbook.grading.engine.run_checks``: the tests of ``tests/grading/test_LAB.py``
(without ``--nproc``, on every world size the grader uses; with it, on N ranks where a check
allows), then the lab's figures (its family's ``<lab>_report``) when the checks passed. It prints one
line per check: passed checks together, each other check with its full message.

Exit status: 0 every check passed; 1 a check failed or is not implemented yet; 2 a hang (the
per-rank report is printed) or a usage error. A hang is declared after ``--timeout`` seconds
of one run (60 by default); the process groups' own timeouts sit above it.
"""
from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path

from workbook.runtime.gpu import add_backend_argument
from workbook.grading.engine import (HANG, NOT_IMPLEMENTED, PASSED, SKIPPED, Verdict, exit_code,
                                     run_checks)

DEFAULT_TIMEOUT_S = 60.0
EXIT_MEANING = {0: "every check passed", 1: "a check failed or is not implemented yet",
                2: "a hang"}


class VerdictPrinter:
    """Prints verdicts as they come: passed checks on one wrapped ``ok`` line, every other check
    with its full message (a message already shown is referred to, not repeated)."""

    def __init__(self, write=print):
        self.write, self.passed, self.shown = write, [], {}

    def __call__(self, v: Verdict) -> None:
        if v.status == PASSED:
            self.passed.append(v.name)
            return
        self.flush()
        tag = {HANG: "HANG", NOT_IMPLEMENTED: "TODO", SKIPPED: "skip"}.get(v.status, "FAIL")
        pts = f" ({v.points:g} point{'s' * (v.points != 1)})" if v.status != SKIPPED else ""
        self.write(f"  {tag:<5} {v.name}{pts}")
        if v.message in self.shown:
            self.write(f"        (same as {self.shown[v.message]})")
            return
        self.shown[v.message] = v.name
        for line in v.message.splitlines():
            self.write(f"        {line}")

    def flush(self) -> None:
        if self.passed:
            text = textwrap.fill(", ".join(self.passed), width=96, initial_indent="  ok    ",
                                 subsequent_indent="        ")
            self.write(text)
            self.passed = []


def summary(lab: str, verdicts: list[Verdict]) -> str:
    code = exit_code(verdicts)
    counted = [v for v in verdicts if v.status != SKIPPED]
    score = sum(v.score for v in verdicts)
    total = sum(v.points for v in counted)
    return (f"{lab}: {sum(v.status == PASSED for v in counted)} of {len(counted)} checks passed, "
            f"{score:g} / {total:g} points; exit {code} ({EXIT_MEANING[code]})")


def self_check(lab: str, *, impl: str = "labs", nproc: int | None = None,
               timeout: float = DEFAULT_TIMEOUT_S, link: str = "none",
               trace_dir: str | None = None, job=None, write=print) -> int:
    """Run ``lab``'s checks (and figures) and print the verdicts; return the exit status."""
    from workbook.grading.labs import LABS, use_impl
    if lab not in LABS:
        raise ValueError(f"unknown lab {lab!r}; the labs are {', '.join(LABS)}")
    if nproc is not None and nproc < 1:
        raise ValueError(f"--nproc must be at least 1 (got {nproc})")
    folder = use_impl(impl)
    quiet = job is not None and job.rank != 0
    out = (lambda *_: None) if quiet else write
    where = f"on {nproc} ranks" if nproc else "on the grader's world sizes (1-4 ranks)"
    out(f"{lab} self-check: {folder.name}/{lab}.py {where}, the grader's checks")
    printer = VerdictPrinter(out)
    verdicts = run_checks(lab, nproc=nproc, timeout=timeout, job=job, on_verdict=printer)
    printer.flush()
    if not any(v.status == HANG for v in verdicts):
        _figures(lab, nproc, link, trace_dir, timeout, job, out)
    out(summary(lab, verdicts))
    if not quiet and nproc is None and folder.name != "solutions":   # the learner's progress
        from workbook.learner.progress import record_self_check
        record_self_check(folder, lab, verdicts)
    return exit_code(verdicts)


def _figures(lab, nproc, link, trace_dir, timeout, job, out) -> None:
    """The lab's own figures (``workbook.<family>.<lab>_report``, see ``workbook.measure``), when
    it has them; never a verdict."""
    import importlib

    from workbook.grading.labs import lab_module
    name = lab_module(lab, "report")
    try:
        report = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        return
    from workbook.grading import engine
    n = nproc or getattr(report, "WORLD_SIZE", 2)
    link = link if link != "none" else getattr(report, "LINK", "none")
    if trace_dir:
        trace_dir = str(Path(trace_dir).resolve())
    engine.STATE.job = job
    try:
        results = engine.on_ranks(n, report.run, trace_dir, link=link, timeout=timeout)
    except Exception as exc:                               # noqa: BLE001 - figures are extra
        first = engine.not_implemented_message(exc) or f"{type(exc).__name__}: {exc}"
        out(f"  figures skipped: {first.splitlines()[0] if first else ''}")
        return
    finally:
        engine.STATE.job = None
    out(report.describe(results))
    if link != "none":
        out(f"  (times on the simulated {link} link, not measured hardware)")
    if trace_dir and (job is None or job.rank == 0):
        from workbook.trace.report import write_report
        for folder in trace_folders(trace_dir):
            out(f"  traces: {folder}\n  trace report: "
                f"{write_report(str(folder), folder / 'report.html')}")


def trace_folders(trace_dir) -> list:
    """The folders of ``trace_dir`` that hold one run's rank traces: ``trace_dir`` itself, and
    (for a report that traces each variant apart, as dp_overlap's) each subfolder that does."""
    root = Path(trace_dir)
    candidates = [root, *sorted(p for p in root.iterdir() if p.is_dir())] if root.is_dir() else []
    return [d for d in candidates if any(d.glob("rank*.trace.json*"))]


# --------------------------------------------------------------------------- a lab's __main__
def main(lab_file: str, argv=None) -> None:
    """``python labs/LAB.py`` and ``torchrun ... labs/LAB.py``: the self-check of that file."""
    from workbook.runtime.launch import under_torchrun
    path = Path(lab_file).resolve()
    parser = argparse.ArgumentParser(
        prog=f"python {path.parent.name}/{path.name}",
        description=f"Self-check of the {path.stem} lab: the grader's checks on this file. "
                    "Exit status 0 all passed, 1 a check failed or is not implemented, 2 a hang.")
    parser.add_argument("--nproc", type=int, default=None,
                        help="ranks (default: the grader's world sizes; ignored under torchrun)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help="seconds one run may take before it counts as a hang (default 60)")
    parser.add_argument("--link", default="none", help="simulated link preset for the figures")
    parser.add_argument("--trace-dir", default=None, help="write the figures' traces here")
    add_backend_argument(parser)
    args = parser.parse_args(argv)
    if args.backend:
        os.environ["WORKBOOK_BACKEND"] = args.backend          # the ranks this self-check starts
    try:
        if args.backend:
            from workbook.runtime.ranks import choose_backend
            choose_backend(args.backend, 1)                    # no GPU for a GPU backend: say so now
        if under_torchrun():
            from workbook.grading.torchrun_ranks import JobRanks
            job = JobRanks(args.timeout, args.backend)
            code = self_check(path.stem, impl=str(path.parent), nproc=job.world,
                              timeout=args.timeout, link=args.link, trace_dir=args.trace_dir,
                              job=job)
            job.finish(code)
        code = self_check(path.stem, impl=str(path.parent), nproc=args.nproc,
                          timeout=args.timeout, link=args.link, trace_dir=args.trace_dir)
    except (ValueError, FileNotFoundError) as exc:
        print(f"{path.name}: {exc}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
