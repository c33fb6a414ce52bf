"""Grade a whole class on this machine: one folder per student, one CSV of scores.

    workbook grade --class-dir submissions/ --lab tp --csv scores.csv

``submissions/`` holds one folder per student (the folder's name is the student's name in the
CSV) with their lab files, ``tp.py`` and so on, at its top level or in one folder below it (a
``labs/`` folder, an unpacked zip). Each student is graded in a subprocess of their own
(``workbook grade --impl FOLDER --gradescope results.json``) with a time limit, so a submission
that crashes, hangs or exits never stops the run: the student gets 0 for what did not finish
and a note says why. Only the graded labs' files are copied into a fresh folder for each
student, so extra files are ignored and nothing in the submission is changed.

The CSV has a row per student: ``student``, one column per lab (its score), ``total``, ``max``
and ``notes`` (missing files, failed tests, a time limit reached); a one-line summary per student
is printed as it goes. Beside the CSV, ``<name>-results/`` keeps each student's ``results.json``
(every test's message, to hand back) and grading log.

``--jobs N`` grades N students at once (default 1): on a machine with cores to spare, for a
class of labs whose checks read no measured time (a timed check is robust to load, but a
crowded machine makes it measure again, and a student's time limit counts that).

The students' code runs with your permissions: grade submissions you do not trust inside a
container or a throw-away account.
"""
from __future__ import annotations

import contextlib
import csv
import json
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from workbook.grading.labs import LABS, repo_root
from workbook.runtime.child_process import course_env, stop_group
from workbook.runtime.messages import first_line

DEFAULT_STUDENT_TIMEOUT_S = 600.0   # Gradescope's default limit for a whole submission


@dataclass
class StudentResult:
    student: str
    scores: dict[str, float] = field(default_factory=dict)     # lab -> score
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


def lab_max_points(lab: str) -> float:
    """The points ``lab`` is graded out of, read from its grading tests without running them."""
    from workbook.instructor import assign
    path = repo_root() / "tests" / "grading" / f"test_{lab}.py"
    return sum(g.points for g in assign.graded_tests(path.read_text(), str(path)).values())


def students(class_dir: Path) -> list[Path]:
    """Every student folder in ``class_dir`` (hidden folders and loose files left out), by name."""
    if not class_dir.is_dir():
        raise ValueError(f"--class-dir {class_dir} is not a folder (one folder per student)")
    found = sorted((p for p in class_dir.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))),
                   key=lambda p: p.name)
    if not found:
        raise ValueError(f"--class-dir {class_dir} holds no student folders")
    return found


def find_lab_files(folder: Path, labs: list[str]) -> tuple[dict[str, Path], str]:
    """``{lab: file}`` for the labs a student's folder holds, and where they were found: the
    folder itself, else the one folder below it that holds any (``labs/``, an unpacked zip)."""
    def at(d: Path) -> dict[str, Path]:
        return {lab: d / f"{lab}.py" for lab in labs if (d / f"{lab}.py").is_file()}
    files = at(folder)
    if files:
        return files, ""
    below = [d for d in sorted(folder.rglob("*")) if d.is_dir() and "__pycache__" not in d.parts
             and at(d)]
    if len(below) == 1:
        return at(below[0]), str(below[0].relative_to(folder))
    if len(below) > 1:
        return {}, "lab files in several folders: " + ", ".join(
            str(d.relative_to(folder)) for d in below[:3])
    return {}, ""


def labs_to_grade(class_dir: Path, labs: list[str] | None) -> list[str]:
    """``labs`` if given, else every lab at least one student handed in a file for."""
    if labs:
        unknown = [lab for lab in labs if lab not in LABS]
        if unknown:
            raise ValueError(f"unknown lab {unknown[0]!r}; the labs are {', '.join(LABS)}")
        return list(dict.fromkeys(labs))
    seen = set()
    for folder in students(class_dir):
        seen |= set(find_lab_files(folder, LABS)[0])
    if not seen:
        raise ValueError(f"no student folder in {class_dir} holds a lab file "
                         f"({', '.join(f'{lab}.py' for lab in LABS)}); name the lab with --lab")
    return [lab for lab in LABS if lab in seen]


def failure_note(tests: list[dict], limit: int = 3) -> str:
    """``2 of 5 tests failed (1 not implemented yet): tp_mlp, tp_block; first: rank 1: ...``:
    what a student lost points on, in a line (their results.json has every message)."""
    bad = [t for t in tests if t.get("score", 0) < t.get("max_score", 0)]
    if not bad:
        return ""
    first_lines = [first_line(t.get("output") or "") for t in bad]
    stubs = sum(line.startswith("not implemented yet") for line in first_lines)
    names = [str(t.get("name", "?")).split("::", 1)[-1] for t in bad]
    note = f"{len(bad)} of {len(tests)} tests failed"
    if stubs:
        note += " (all not implemented yet)" if stubs == len(bad) else \
            f" ({stubs} not implemented yet)"
    note += ": " + ", ".join(names[:limit]) + (f", +{len(names) - limit} more"
                                               if len(names) > limit else "")
    other = next((line for line in first_lines if line and
                  not line.startswith("not implemented yet")), "")
    if other:
        note += f"; first: {other[:140]}"
    return note


def grade_student(folder: Path, labs: list[str], *, timeout: float, max_ranks: int | None,
                  workdir: Path, keep: Path | None = None,
                  running: set | None = None) -> StudentResult:
    """Grade one student's ``labs`` in a subprocess; never raises for a broken submission.
    ``keep``: a folder to copy the student's ``results.json`` and grading log into;
    ``running``: a set that holds the grading process while it runs (to stop it from another
    thread)."""
    result = StudentResult(folder.name, {lab: 0.0 for lab in labs})
    files, where = find_lab_files(folder, labs)
    missing = [lab for lab in labs if lab not in files]
    if where and files:
        result.notes.append(f"files found in {where}/")
    elif where:
        result.notes.append(where)
    if missing:
        result.notes.append("missing " + ", ".join(f"{lab}.py" for lab in missing))
    if not files:
        return result
    impl = workdir / folder.name / "impl"              # never named "solutions" (labs.use_impl)
    impl.mkdir(parents=True)
    for lab, path in files.items():
        shutil.copyfile(path, impl / f"{lab}.py")
    out = workdir / folder.name / "results.json"
    cmd = [sys.executable, "-m", "workbook.cli", "grade", "--impl", str(impl),
           "--gradescope", str(out)]
    for lab in files:
        cmd += ["--lab", lab]
    if max_ranks is not None:
        cmd += ["--max-ranks", str(max_ranks)]
    env = course_env(repo_root())
    env.pop("WORKBOOK_IMPL", None)
    log = workdir / folder.name / "grade.log"
    t0 = time.monotonic()
    with open(log, "w") as log_file:
        proc = subprocess.Popen(cmd, cwd=repo_root(), env=env, stdout=log_file,
                                stderr=subprocess.STDOUT, start_new_session=True)
        if running is not None:
            running.add(proc)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            result.notes.append(f"time limit of {timeout:g} s reached: graded 0 for "
                                f"{', '.join(files)}")
        finally:
            stop_group(proc)           # the grader and every rank it started, also on Ctrl-C
            if running is not None:
                running.discard(proc)
    result.seconds = time.monotonic() - t0
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, keep / f"{folder.name}.log")
        if out.is_file():
            shutil.copyfile(out, keep / f"{folder.name}.json")
    if not out.is_file():
        if proc.returncode is not None:
            tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1:]
            result.notes.append(f"grader exited {proc.returncode} without results"
                                + (f": {tail[0][:160]}" if tail else ""))
        return result
    try:
        data = json.loads(out.read_text())
    except (OSError, ValueError) as exc:
        result.notes.append(f"unreadable results ({exc})")
        return result
    tests = data.get("tests", [])
    for lab in files:
        mine = [t for t in tests if str(t.get("name", "")).split("::")[0] == lab]
        result.scores[lab] = float(sum(t.get("score", 0.0) for t in mine))
    failed = failure_note(tests)
    if failed:
        result.notes.append(failed)
    return result


def write_csv(path: Path, labs: list[str], results: list[StudentResult],
              maxima: dict[str, float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    total_max = sum(maxima.values())
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", *labs, "total", "max", "notes"])
        for r in results:
            w.writerow([r.student, *(f"{r.scores[lab]:g}" for lab in labs),
                        f"{sum(r.scores.values()):g}", f"{total_max:g}", "; ".join(r.notes)])


@contextlib.contextmanager
def _graded_in_order(folders: list[Path], jobs: int, labs: list[str], **how):
    """The students' results, in the order of ``folders``, each as soon as it and those before it
    are graded: one at a time in this thread (``jobs`` 1), else ``jobs`` at a time in threads,
    every grading process stopped if the caller is interrupted (Ctrl-C)."""
    if jobs == 1:
        yield (grade_student(folder, labs, **how) for folder in folders)
        return
    running: set = set()
    pool = ThreadPoolExecutor(jobs)
    futures = [pool.submit(grade_student, folder, labs, running=running, **how)
               for folder in folders]
    try:
        yield (future.result() for future in futures)
    finally:
        for future in futures:
            future.cancel()                       # those not started yet
        for proc in list(running):                # those running (after Ctrl-C: none is done)
            stop_group(proc)
        pool.shutdown(wait=True)


def grade_class(class_dir, csv_path, labs: list[str] | None = None, *,
                timeout: float = DEFAULT_STUDENT_TIMEOUT_S, max_ranks: int | None = None,
                jobs: int = 1, print_fn=print) -> list[StudentResult]:
    """Grade every student folder in ``class_dir`` and write ``csv_path``; see the module doc.
    ``jobs``: how many students are graded at once (each in its own subprocess); the rows and
    lines still come in the students' order."""
    class_dir, csv_path = Path(class_dir), Path(csv_path)
    if jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {jobs}")
    labs = labs_to_grade(class_dir, labs)
    maxima = {lab: lab_max_points(lab) for lab in labs}
    folders = students(class_dir)
    print_fn(f"grading {len(folders)} students on {', '.join(labs)} "
             f"(out of {sum(maxima.values()):g}; at most {timeout:g} s each"
             + (f", at most {max_ranks} ranks" if max_ranks else "")
             + (f", {jobs} at a time" if jobs > 1 else "") + ")")
    results = []
    width = max(len(f.name) for f in folders)
    keep = csv_path.with_name(csv_path.stem + "-results")
    with tempfile.TemporaryDirectory(prefix="workbook-class-") as tmp, \
            _graded_in_order(folders, jobs, labs, timeout=timeout, max_ranks=max_ranks,
                             workdir=Path(tmp), keep=keep) as graded:
        for r in graded:
            results.append(r)
            write_csv(csv_path, labs, results, maxima)         # a partial CSV survives Ctrl-C
            scores = "  ".join(f"{lab} {r.scores[lab]:g}/{maxima[lab]:g}" for lab in labs)
            note = f"  ({'; '.join(r.notes)})" if r.notes else ""
            print_fn(f"{r.student:<{width}}  {scores}  total {sum(r.scores.values()):g}/"
                     f"{sum(maxima.values()):g}  {r.seconds:.0f} s{note}")
    print_fn(f"scores written to {csv_path}; each student's results.json (every message, "
             f"Gradescope's format) and grading log in {keep}/")
    return results
