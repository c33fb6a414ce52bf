"""The self-check: the grader's checks, run on your lab, with the grader's messages.

    workbook run LAB [--nproc N]          from the command line (labs/ by default)
    python labs/LAB.py [--nproc N]        the lab file itself
    torchrun --nproc_per_node=N labs/LAB.py
    workbook.lessons.self_check(LAB)      a notebook cell

Every way runs ``workbook.grading.engine.run_checks``: the tests of ``tests/grading/test_LAB.py``
(without ``--nproc``, on every world size the grader uses; with it, on N ranks where a check
allows), then the lab's figures (its family's ``<lab>_report``) unless no check could run the
lab (it does not import, a run hung, or every check is still "not implemented yet"). It prints one
line per check: passed checks together, each other check with its full message.

Exit status: 0 every check passed; 1 a check failed or is not implemented yet; 2 a hang (the
per-rank report is printed) or a usage error. A hang is declared after ``--timeout`` seconds
of one run (60 by default); the process groups' own timeouts sit above it. A numeric option
out of range is a usage error said in one line (``positive_seconds``, ``positive_count``).

The figures' traces go to ``runs/LAB/selfcheck-<date>-<time>/`` in the course folder (a
folder per variant where the report traces each apart), unless ``--trace-dir`` names a folder;
the newest ``KEEP_TRACES`` self-checks of a lab are kept, older ones removed. Nothing is left in
the temp dir.
"""
from __future__ import annotations

import os
import shutil
import sys
import textwrap
import time
from pathlib import Path

from workbook.runtime.gpu import add_backend_argument
from workbook.runtime.messages import first_line
from workbook.runtime.options import OneLineErrors, positive_count, positive_seconds
from workbook.grading.engine import (HANG, NOT_IMPLEMENTED, PASSED, SKIPPED, Verdict, exit_code,
                                     lab_import_problem, run_checks)

DEFAULT_TIMEOUT_S = 60.0
KEEP_TRACES = 3                      # self-checks of one lab whose traces stay in runs/LAB
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


def not_started(verdicts: list[Verdict]) -> bool:
    """Is every check that ran "not implemented yet" (a fresh stub)? Its figures would stop at
    the first TODO, after the lab's given variants had run for nothing (seconds, for some)."""
    ran = [v for v in verdicts if v.status != SKIPPED]
    return bool(ran) and all(v.status == NOT_IMPLEMENTED for v in ran)


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
    problem = lab_import_problem(lab)
    if problem:                                  # once, at the top: every check says "not run"
        detail = problem.split("(", 1)[1].rsplit(")", 1)[0]          # "labs/tp.py, line 3: ..."
        out(f"  {detail.replace(', ', ' does not import: ', 1)}. No check can run until it does.")
    printer = VerdictPrinter(out)
    verdicts = run_checks(lab, nproc=nproc, timeout=timeout, job=job, on_verdict=printer)
    printer.flush()
    if not_started(verdicts):                    # the figures run the learner's code: none yet
        out("  figures: once a task is done (they run your code, and none of it is written yet)")
    elif not problem and not any(v.status == HANG for v in verdicts):
        _figures(lab, nproc, link, trace_dir, timeout, job, out)
    out(summary(lab, verdicts))
    if not quiet and nproc is None and folder.name != "solutions":   # the learner's progress
        from workbook.learner.progress import record_self_check
        record_self_check(folder, lab, verdicts)
    return exit_code(verdicts)


def _figures(lab, nproc, link, trace_dir, timeout, job, out) -> None:
    """The lab's own figures (``workbook.<family>.<lab>_report``, see ``workbook.measure``), when
    it has them; never a verdict. Their traces go to ``trace_dir``, else to a fresh folder of
    ``runs/LAB`` (``new_trace_dir``), named before the ranks start so that every rank writes to
    the same one; rank 0 says where."""
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
    try:
        folder = Path(trace_dir).resolve() if trace_dir else new_trace_dir(lab, job)
    except OSError as exc:                                 # a read-only course folder: no traces
        out(f"  (figures without traces: {exc}; --trace-dir DIR writes them to DIR)")
        folder = None
    engine.STATE.job = job
    try:
        results = engine.on_ranks(n, report.run, folder and str(folder), link=link,
                                  timeout=timeout)
    except Exception as exc:                               # noqa: BLE001 - figures are extra
        if folder and not trace_dir and (job is None or job.local_rank == 0):
            shutil.rmtree(folder, ignore_errors=True)      # no half-written run in runs/LAB
        first = engine.not_implemented_message(exc) or f"{type(exc).__name__}: {exc}"
        out(f"  figures skipped: {first_line(first)}")
        return
    finally:
        engine.STATE.job = None
    out(report.describe(results))
    if link != "none":
        out(f"  (times on the simulated {link} link, not measured hardware)")
    folders = trace_folders(folder) if folder else []
    if folder and not folders and not trace_dir and (job is None or job.local_rank == 0):
        shutil.rmtree(folder, ignore_errors=True)          # a report that traces nothing
    if folders and (job is None or job.rank == 0):
        from workbook.trace.report import write_report
        for traces in folders:
            out(f"  traces: {traces}\n  trace report: "
                f"{write_report(str(traces), traces / 'report.html')}")
        if not trace_dir:
            out(f"  (runs/{lab} keeps the traces of the newest {KEEP_TRACES} self-checks; "
                f"--trace-dir DIR writes them to DIR instead)")


def trace_folders(trace_dir) -> list:
    """The folders of ``trace_dir`` that hold one run's rank traces: ``trace_dir`` itself, and
    (for a report that traces each variant apart, as dp_overlap's) each subfolder that does."""
    root = Path(trace_dir)
    candidates = [root, *sorted(p for p in root.iterdir() if p.is_dir())] if root.is_dir() else []
    return [d for d in candidates if any(d.glob("rank*.trace.json*"))]


# --------------------------------------------------------------------------- where traces go
SELFCHECK_PREFIX = "selfcheck-"


def runs_folder(lab: str) -> Path:
    """``runs/LAB`` in the course folder (``workbook.grading.labs.repo_root``: where ``labs/``
    is found, and where ``workbook demo`` writes ``runs/demo``); git ignores ``runs/``."""
    from workbook.grading.labs import repo_root
    return repo_root() / "runs" / lab


def new_trace_dir(lab: str, job=None, keep: int = KEEP_TRACES) -> Path:
    """A fresh ``runs/LAB/selfcheck-<date>-<time>`` for one self-check's traces, made now; the
    older self-checks' folders beyond the newest ``keep`` are removed.

    Under torchrun (``job``: the ``JobRanks`` of this process) every rank calls this: rank 0
    picks the name and posts it to the job's store, every rank reads it there (the ranks' clocks
    need not agree on a second), and each node's local rank 0 makes the folder and prunes."""
    runs = runs_folder(lab)
    if job is None:
        name = _fresh_name(runs)
    else:
        key = f"workbook/selfcheck-traces/{lab}"
        if job.rank == 0:
            job.store.set(key, _fresh_name(runs))
        name = job.store.get(key).decode()
    folder = runs / name
    if job is None or job.local_rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        prune_trace_dirs(runs, keep)
    return folder


def _fresh_name(runs: Path) -> str:
    """``selfcheck-YYYYmmdd-HHMMSS``, with ``-02``, ``-03``... when that second is taken: names
    sort in time order."""
    stamp = SELFCHECK_PREFIX + time.strftime("%Y%m%d-%H%M%S")
    name, k = stamp, 1
    while (runs / name).exists():
        k += 1
        name = f"{stamp}-{k:02d}"
    return name


def prune_trace_dirs(runs: Path, keep: int = KEEP_TRACES) -> list[Path]:
    """Remove the ``selfcheck-*`` folders of ``runs`` but the newest ``keep`` (by name: the time
    they were made); a folder of another name (a ``--trace-dir`` inside ``runs/``) stays.
    Returns the folders removed."""
    made = sorted(p for p in runs.glob(SELFCHECK_PREFIX + "*") if p.is_dir())
    old = made[:-keep] if keep > 0 else made
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    return old


# --------------------------------------------------------------------------- usage errors
# --------------------------------------------------------------------------- a lab's __main__
def main(lab_file: str, argv=None) -> None:
    """``python labs/LAB.py`` and ``torchrun ... labs/LAB.py``: the self-check of that file."""
    from workbook.runtime.launch import under_torchrun
    path = Path(lab_file).resolve()
    parser = OneLineErrors(
        prog=f"python {path.parent.name}/{path.name}",
        description=f"Self-check of the {path.stem} lab: the grader's checks on this file. "
                    "Exit status 0 all passed, 1 a check failed or is not implemented, 2 a hang.")
    parser.add_argument("--nproc", type=positive_count, default=None,
                        help="ranks (default: the grader's world sizes; ignored under torchrun)")
    parser.add_argument("--timeout", type=positive_seconds, default=DEFAULT_TIMEOUT_S,
                        help="seconds with no progress on any rank before a run counts as a hang "
                             "(default 60)")
    parser.add_argument("--link", default="none", help="simulated link preset for the figures")
    parser.add_argument("--trace-dir", default=None,
                        help=f"write the figures' traces here (default: a new folder of runs/LAB, "
                             f"which keeps the newest {KEEP_TRACES})")
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
