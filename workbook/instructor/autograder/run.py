"""Grading one submission the way Gradescope runs it: find the lab files, grade them under time
limits, write ``results.json`` (always, even when the grader itself fails)."""
from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from workbook.instructor.autograder.bundle import DEFAULT_TEST_TIMEOUT_S, DEFAULT_TIME_BUDGET_S, \
    GRADER_FAILED, KILL_GRACE_S, LIST_GRACE_S, RESERVE_S, SKIP_PARTS


# --------------------------------------------------------------------------- the submission
@dataclass
class Submission:
    """What a student handed in, matched against the lab files the autograder expects."""
    found: dict = field(default_factory=dict)        # lab -> the submitted file
    missing: dict = field(default_factory=dict)      # lab -> the message its tests score 0 with
    notes: list = field(default_factory=list)        # lines the student reads


def _key(name: str) -> str:
    """``ringallreduce`` for ``Ring-AllReduce (1).py`` or ``ring_allreduce.ipynb``."""
    stem = name.lower().split(".")[0]
    stem = re.sub(r"\s*\(\d+\)$|[-_ ]copy(\s*\d+)?$|[-_ ]\d+$", "", stem.strip())
    return re.sub(r"[^a-z0-9]", "", stem)


def _names(paths, limit: int = 6) -> str:
    shown = ", ".join(str(p) for p in paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def inspect_submission(folder: Path, labs: list[str]) -> Submission:
    """Which of ``labs`` were submitted (``<lab>.py`` at any depth, the top level or a ``labs``
    folder first), which are missing or misnamed, and what is ignored."""
    sub = Submission()
    files = sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file() and not any(
        part.startswith(".") or part in SKIP_PARTS for part in p.relative_to(folder).parts)) \
        if folder.is_dir() else []
    used = set()
    for lab in labs:
        copies = sorted((p for p in files if p.name == f"{lab}.py"),
                        key=lambda p: (len(p.parts) > 1, p.parent.name != "labs", len(p.parts),
                                       str(p)))
        if copies:
            sub.found[lab] = folder / copies[0]
            used.update(copies)
            if len(copies) > 1:
                sub.notes.append(f"graded {copies[0]}; ignored the other copies: "
                                 f"{_names(copies[1:])}")
    others = [p for p in files if p not in used]
    misnamed = {}
    for lab in (lab for lab in labs if lab not in sub.found):
        want = _key(f"{lab}.py")
        close = [p for p in others if p not in misnamed and (_key(p.name) == want or (
            difflib.SequenceMatcher(None, _key(p.name), want).ratio() >= 0.85))]
        message = f"file {lab}.py was not submitted"
        if close:
            misnamed.update(dict.fromkeys(close, lab))
            message += (f"; found {_names(close)}: name it {lab}.py (the lab file from labs/, "
                        "unchanged name) and submit again")
        sub.missing[lab] = message
        sub.notes.append(f"missing: {message}. Its tests score 0.")
    ignored = [p for p in others if p not in misnamed]
    if sub.found:
        sub.notes.insert(0, "graded: " + ", ".join(str(p.relative_to(folder))
                                                   for p in sub.found.values()))
    if ignored:
        sub.notes.append(f"ignored (not lab files of this assignment, which grades "
                         f"{', '.join(f'{lab}.py' for lab in labs)}): {_names(ignored)}")
    if not files:
        sub.notes.append("the submission is empty: submit your lab files "
                         f"({', '.join(f'{lab}.py' for lab in labs)})")
    return sub


# --------------------------------------------------------------------------- run
def run(root: Path) -> dict:
    """Grade ``root/submission`` and write ``root/results/results.json`` (always, whatever
    happens); return what was written."""
    t0 = time.monotonic()
    results_path = root / "results" / "results.json"
    try:
        results = _grade(root, t0)
    except Exception:                               # noqa: BLE001 - the student still gets a result
        traceback.print_exc()                      # stdout: the instructor's view on Gradescope
        results = {"score": 0.0, "tests": [], "output": GRADER_FAILED}
    results["execution_time"] = int(round(time.monotonic() - t0))
    results_path.parent.mkdir(parents=True, exist_ok=True)
    partial = results_path.with_name("results.json.partial")
    partial.write_text(json.dumps(results, indent=2) + "\n")
    partial.replace(results_path)
    print(f"wrote {results_path}: {results['score']:g} points in {results['execution_time']} s")
    return results


def _grade(root: Path, t0: float) -> dict:
    source = root / "source"
    config = json.loads((source / "autograder.json").read_text())
    labs = config["labs"]
    print(f"autograder: labs {', '.join(labs)} (level {config.get('level', 'standard')}: the "
          f"same tests grade every level); overlap-workbook {config.get('workbook_version')} "
          f"(running {_installed_version()}), torch {config.get('torch_version')}")
    sub = inspect_submission(root / "submission", labs)
    work = root / "work"
    if work.exists():
        shutil.rmtree(work)
    (work / "labs").mkdir(parents=True)
    for lab, path in sub.found.items():
        shutil.copyfile(path, work / "labs" / f"{lab}.py")
    (work / "pytest.ini").write_text("[pytest]\nfilterwarnings =\n    ignore::DeprecationWarning\n"
                                     "    ignore:.*is deprecated. Please use:FutureWarning\n")
    progress = work / "progress.jsonl"
    budget = float(config.get("time_budget_s", DEFAULT_TIME_BUDGET_S))
    pytest_budget = max(0.0, budget - RESERVE_S - (time.monotonic() - t0))
    tests = [str(source / "tests" / "grading" / f"test_{lab}.py") for lab in labs]
    if (source / "tests" / "extra").is_dir():
        tests.append(str(source / "tests" / "extra"))
    # -p no:nbmake: where the dev extra is installed (an instructor's try of the zip), its
    # notebook plugin would cost 2-3 s of CPU per run to import (jsonschema compiles a URI
    # grammar) and grades nothing here; on Gradescope it is not installed and this is a no-op
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:nbmake",
           "--continue-on-collection-errors",             # a broken extra file spoils only itself
           "-p", "workbook.grading.limits", "-c", str(work / "pytest.ini"), "--rootdir", str(root),
           "--impl", str(work / "labs"), "--progress", str(progress),
           "--test-timeout", str(float(config.get("test_timeout_s", DEFAULT_TEST_TIMEOUT_S))),
           "--time-budget", f"{pytest_budget:.1f}"]
    for lab, message in sub.missing.items():
        cmd += ["--lab-missing", f"{lab}={message}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["WORKBOOK_ROOT"] = str(work)
    cap = rank_cap(config.get("max_ranks", "auto"))
    if cap is not None and "WORKBOOK_MAX_RANKS" not in os.environ:
        env["WORKBOOK_MAX_RANKS"] = str(cap)
        print(f"grading on at most {cap} rank(s) ({config.get('max_ranks', 'auto')}, "
              f"{_memory_bytes() / 2**30:.1f} GiB of memory)", flush=True)
    print("$ " + " ".join(cmd + tests), flush=True)
    proc = subprocess.Popen(cmd + tests, cwd=work, env=env, start_new_session=True)
    killed = False
    try:
        proc.wait(timeout=pytest_budget + KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        # past its budget; but a student is owed the list of tests not run, so a pytest that has
        # not listed them yet (a machine too busy to start it in the grace) gets LIST_GRACE_S more
        listed_by = time.monotonic() + LIST_GRACE_S
        while proc.poll() is None and not _listed(progress) and time.monotonic() < listed_by:
            time.sleep(0.2)
        killed = proc.poll() is None
        if killed:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            print(f"the grading process ran past its budget ({pytest_budget:.0f} s) and was killed")
    return _results(progress, sub, killed or time.monotonic() - t0 >= budget - RESERVE_S,
                    proc.returncode)


def _listed(progress: Path) -> bool:
    """Has the grading process written the list of tests it collected?"""
    try:
        return '"collected"' in progress.read_text()
    except OSError:
        return False


def _installed_version() -> str:
    try:
        return metadata.version("overlap-workbook")
    except metadata.PackageNotFoundError:
        return "unknown"


def _results(progress: Path, sub: Submission, out_of_time: bool, returncode: int) -> dict:
    collected, done = None, {}
    if progress.is_file():
        for line in progress.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:            # a line cut short by a kill
                continue
            if "collected" in record:
                collected = record["collected"]
            elif "result" in record:
                done[record["result"]["nodeid"]] = record["result"]
    notes = list(sub.notes)
    if collected is None:
        notes.append("The grader stopped before it could start the tests (exit status "
                     f"{returncode}). Your instructor can see why: please tell them.")
        return {"score": 0.0, "output": "\n".join(notes), "tests": []}
    tests = []
    for c in collected:
        r = done.get(c["nodeid"])
        if r is None:
            why = "the time budget was spent" if out_of_time else \
                "the grader stopped before this test (your instructor can see why)"
            r = dict(c, score=0.0, status="failed", output=f"not run: {why}", seconds=0.0)
        tests.append({"name": r["name"], "score": float(r["score"]),
                      "max_score": float(r["max_score"]), "status": r["status"],
                      "output": r["output"], "visibility": r.get("visibility", "visible"),
                      "extra_data": {"seconds": r.get("seconds", 0.0)}})
    not_run = sum(t["output"].startswith("not run:") for t in tests)
    if not_run:
        notes.append(f"{not_run} test(s) were not run: "
                     + ("the time budget was spent." if out_of_time else "the grader stopped."))
    return {"score": round(sum(t["score"] for t in tests), 6), "output": "\n".join(notes),
            "tests": tests}


def _memory_bytes() -> float:
    """The memory this grading may use: the container's limit (cgroup v2 or v1), else the
    machine's total."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            value = Path(path).read_text().strip()
            if value.isdigit() and int(value) < 1 << 60:
                return float(value)
        except OSError:
            pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def rank_cap(setting, memory_bytes: float | None = None) -> int | None:
    """The rank cap to grade with: a configured number, or for ``"auto"`` what the machine
    offers (each rank is a process holding torch): 1 below 2 GiB, 2 below 4 GiB, else none.
    The verdicts are the same under any cap (``workbook.grading.engine.world_sizes``)."""
    if setting != "auto":
        return int(setting)
    memory = _memory_bytes() if memory_bytes is None else memory_bytes
    return 1 if memory < 2 * 2**30 else 2 if memory < 4 * 2**30 else None
