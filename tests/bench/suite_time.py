"""Where the test command's time goes: by module, by kind, by lab against its budget.

    python tests/bench/suite_time.py                 # run the suite clocked, serially, then report
    python tests/bench/suite_time.py --table FILE    # report a recorded clock file, run nothing
    python tests/bench/suite_time.py -- -k domino    # pass pytest arguments after ``--``
    python tests/bench/suite_time.py --table FILE --lab domino   # and domino's share by module
    python tests/bench/suite_time.py --table FILE --module-seconds tests/package/module_seconds.json

With no ``--table``, it runs the package tests serially (one pytest process: each test's time
alone, the figure each lab's budget is stated in), then the two grading stages, all clocked.
The test command (``python3 -m workbook.bootstrap test``) records the clock of every run into
``runs/test-times/`` (one JSON line per test, written by ``tests/bench/suite_clock.py``: wall,
CPU of the whole process tree, time spent starting rank pools, processes started); the stages it
runs besides pytest (grading the solutions, grading the stubs) record their times per lab in the
same folder. This script prints, from those lines:

* the **kinds** of time: *starting ranks* (``RankPool`` start-ups), *compute* (CPU seconds of the
  test and everything it started, at most the wall time left), *waiting* (no core busy for the
  test: sleeps, timeouts, one process waiting for another);
* the **modules**, slowest first, with their tests' wall time split into those kinds;
* the **slowest tests** (none may exceed 60 s: ``docs/test-suite.md``);
* each **lab's share** of the suite against its budget of ``LAB_BUDGET_S`` (90 s): its package
  tests (wrong fixtures, prediction, bench and lesson tests), its notebook and browser runs, and
  its grader on the solutions and on the stubs; with ``--lab LAB``, that share by stage and
  module, wall and CPU seconds (CPU time is the steadier figure on a shared machine).

It is a benchmark, not a test: it prints figures and exits 0 whatever they are, unless
``--check-budget`` is given (then 1 when a lab is over budget or a test over 60 s).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from workbook.grading.labs import LABS as COURSE_LABS

ROOT = Path(__file__).resolve().parents[2]
LAB_BUDGET_S = 90.0
TEST_LIMIT_S = 60.0
#: every registered lab, in course order (the table's rows)
LABS = tuple(COURSE_LABS)
#: the same, longest name first, for matching a module to its lab (tp_overlap_* is not tp's)
MATCH_ORDER = tuple(sorted(COURSE_LABS, key=len, reverse=True))
# lesson number -> the lab it ends with (README's table)
LESSON_LAB = {"01": "collectives", "02": "ring_allreduce", "03": "async_overlap", "04": "tp",
              "05": "sp", "06": "domino", "07": "overlap_math", "08": "tp_overlap",
              "09": "dp_overlap", "10": "pp_overlap", "11": "cp_ring",
              "12": "pp_schedules", "13": "ep_overlap", "14": "capstone"}


def lab_of(test: str) -> str | None:
    """The lab a test belongs to, from its module name or its lesson parameter (None: shared)."""
    module, _, name = test.partition("::")
    stem = Path(module).stem.removeprefix("test_")
    lesson = re.search(r"\[(\d\d)(?:_|\])", name)
    if lesson and lesson.group(1) in LESSON_LAB:
        return LESSON_LAB[lesson.group(1)]
    if module.startswith("tests/grading/"):                 # the grader's own tests
        return stem
    for lab in MATCH_ORDER:                                 # longest names first where it matters
        if stem == lab or stem.startswith(lab + "_") or stem.startswith("bench_" + lab):
            return lab
    if stem in ("ring_collectives_wrong_caught",):
        return "ring_allreduce"
    if stem == "tp_sp_wrong_caught":
        return "tp"
    return None


def kinds(r: dict) -> tuple[float, float, float]:
    """(starting ranks, compute, waiting) seconds of one test record."""
    wall = r["wall"]
    start = min(r.get("rank_start", 0.0), wall)
    compute = min(max(r.get("cpu", 0.0) - start, 0.0), wall - start)
    return start, compute, wall - start - compute


def load(paths: list[Path]) -> list[dict]:
    rows = []
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


def write_module_seconds(rows: list[dict], path: Path) -> None:
    """Each package test module's summed wall seconds, and each test's of at least 5 s, as JSON,
    for the test command's scheduler (``tests/package/conftest.py`` hands the longest out first)."""
    modules: dict[str, float] = defaultdict(float)
    tests: dict[str, float] = {}
    for r in rows:
        if r.get("stage", "package") == "package":
            modules[Path(r["test"].split("::")[0]).stem] += r["wall"]
            if r["wall"] >= 5.0:
                tests[r["test"]] = round(r["wall"], 1)
    path.write_text(json.dumps({"modules": {m: round(s, 1) for m, s in sorted(modules.items())},
                                "tests": dict(sorted(tests.items()))}, indent=1) + "\n")
    print(f"wrote the seconds of {len(modules)} modules and {len(tests)} tests to {path}")


def timeline(rows: list[dict], p) -> None:
    """Each worker's span on the run's clock: when it began and ended, and how long it sat idle.

    Idle is the span less its tests' time: collection at the start, waiting for the last test of
    the other worker at the end, fixtures torn down between modules. Needs the ``start`` field
    (clock files from 2026-11-27 on).
    """
    timed = [r for r in rows if "start" in r]
    if not timed:
        return
    t0 = min(r["start"] for r in timed)
    lanes: dict[str, list[dict]] = defaultdict(list)
    for r in timed:
        lanes[f"{r.get('stage', 'package')}/{r.get('worker', 'main')}"].append(r)
    p(f"\ntimeline (s from the first test's start): each worker's span, its tests' time, idle")
    p(f"{'worker':22} {'from':>6} {'to':>6} {'tests':>7} {'idle':>6}")
    for lane, rs in sorted(lanes.items(), key=lambda kv: min(r["start"] for r in kv[1])):
        begin = min(r["start"] for r in rs) - t0
        end = max(r["start"] + r["wall"] for r in rs) - t0
        busy = sum(r["wall"] for r in rs)
        p(f"{lane:22} {begin:6.0f} {end:6.0f} {busy:7.0f} {max(end - begin - busy, 0):6.0f}")


def report(rows: list[dict], top: int = 25, out=sys.stdout, labs=()) -> dict:
    tests = [r for r in rows if r.get("stage", "package") == "package"]
    stage_rows = [r for r in rows if r.get("stage", "package") != "package"]
    p = lambda *a: print(*a, file=out)                      # noqa: E731
    total = sum(r["wall"] for r in tests)
    s, c, w = (sum(k[i] for k in map(kinds, tests)) for i in range(3))
    p(f"package tests: {len(tests)} tests, {total:.0f} s of test time "
      f"(serial sum; under xdist the wall clock is less)")
    if total:
        p(f"  starting ranks {s:7.0f} s  {100 * s / total:4.0f} %")
        p(f"  compute        {c:7.0f} s  {100 * c / total:4.0f} %")
        p(f"  waiting        {w:7.0f} s  {100 * w / total:4.0f} %")
        p(f"  processes started: {sum(r.get('procs', 0) for r in tests)} (each imports torch)")

    by_module: dict[str, list[dict]] = defaultdict(list)
    for r in tests:
        by_module[r["test"].split("::")[0]].append(r)
    p(f"\n{'module':52} {'tests':>5} {'wall s':>7} {'ranks':>6} {'cpu':>6} {'wait':>6}")
    for module, rs in sorted(by_module.items(), key=lambda kv: -sum(r["wall"] for r in kv[1])):
        ks = [kinds(r) for r in rs]
        p(f"{module.removeprefix('tests/'):52} {len(rs):5} {sum(r['wall'] for r in rs):7.1f} "
          f"{sum(k[0] for k in ks):6.1f} {sum(k[1] for k in ks):6.1f} {sum(k[2] for k in ks):6.1f}")

    p(f"\nslowest {top} tests (limit {TEST_LIMIT_S:.0f} s each)")
    for r in sorted(tests, key=lambda r: -r["wall"])[:top]:
        flag = "  OVER" if r["wall"] > TEST_LIMIT_S else ""
        p(f"{r['wall']:7.1f} s  cpu {r.get('cpu', 0):5.1f}  {r['test'][:110]}{flag}")

    shares: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in tests:
        lab = lab_of(r["test"])
        if lab:
            kind = "lesson" if re.search(r"notebook|browser|lesson", r["test"]) else "tests"
            shares[lab][kind] += r["wall"]
    for r in stage_rows:                                    # the grader on solutions / stubs
        lab = lab_of(r["test"])
        if lab:
            shares[lab]["stubs" if r["stage"].startswith("stubs") else "solutions"] += r["wall"]
    p(f"\neach lab's share (budget {LAB_BUDGET_S:.0f} s): package tests, lessons, "
      f"grader on solutions, on stubs")
    if any(r.get("worker", "main") != "main" for r in tests):
        p("  (a run on pytest-xdist workers, beside the grading stages: each test took longer than "
          "it does alone; the budget is for a serial run, `suite_time.py` with no --table)")
    p(f"{'lab':16} {'tests':>7} {'lesson':>7} {'solns':>7} {'stubs':>7} {'total':>7}")
    over = []
    for lab in LABS:
        sh = shares.get(lab, {})
        t = sum(sh.values())
        flag = "  OVER" if t > LAB_BUDGET_S else ""
        if flag:
            over.append(lab)
        p(f"{lab:16} {sh.get('tests', 0):7.1f} {sh.get('lesson', 0):7.1f} "
          f"{sh.get('solutions', 0):7.1f} {sh.get('stubs', 0):7.1f} {t:7.1f}{flag}")
    shared = sum(r["wall"] for r in tests if lab_of(r["test"]) is None)
    p(f"{'(shared)':16} {shared:7.1f}   tests of the package itself, no lab's")
    for lab in labs or ():                                  # --lab: where a lab's share goes
        p(f"\n{lab}'s share by stage and module (wall s, cpu s)")
        parts: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for r in rows:
            if lab_of(r["test"]) == lab:
                part = parts[(r.get("stage", "package"), r["test"].split("::")[0])]
                part[0] += r["wall"]
                part[1] += r.get("cpu", 0.0)
        for (stage, module), (wall, cpu) in sorted(parts.items(), key=lambda kv: -kv[1][0]):
            p(f"  {wall:7.1f} {cpu:7.1f}  {stage:9} {module}")
    timeline(rows, p)
    return {"over_budget": over,
            "over_limit": [r["test"] for r in tests if r["wall"] > TEST_LIMIT_S]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", nargs="+", type=Path, help="report these clock files, run nothing")
    ap.add_argument("--record", type=Path, help="clock file to write (default: runs/test-times/)")
    ap.add_argument("--top", type=int, default=25, help="how many slowest tests to list")
    ap.add_argument("--lab", action="append", choices=LABS, metavar="LAB",
                    help="also list this lab's share by stage and module (repeat for several)")
    ap.add_argument("--check-budget", action="store_true",
                    help="exit 1 when a lab is over its budget or a test over the limit")
    ap.add_argument("--no-grading", action="store_true",
                    help="leave out the grading stages (solutions, stubs): package tests only")
    ap.add_argument("--module-seconds", type=Path, metavar="JSON",
                    help="write each package test module's seconds (the order in which the test "
                         "command hands modules to its workers: tests/package/conftest.py)")
    ap.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = ap.parse_args(argv)
    if args.table:
        missing = [str(p) for p in args.table if not p.exists()]
        if missing:
            ap.error(f"no such clock file: {', '.join(missing)}")
        paths = args.table
    else:
        record = args.record or ROOT / "runs" / "test-times" / time.strftime("suite-%Y%m%d-%H%M%S.jsonl")
        record.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, WORKBOOK_SUITE_CLOCK=str(record),
                   PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "bench"),
                                               *filter(None, [os.environ.get("PYTHONPATH")])]))
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "suite_clock", "-p", "no:cacheprovider",
               *(args.pytest_args or ["tests/package", "tests/gpu"])]
        t0 = time.monotonic()
        subprocess.call(cmd, cwd=ROOT, env=env)
        took = {"package tests": time.monotonic() - t0}
        if not args.no_grading and not args.pytest_args:   # the test command's grading stages
            env["PYTEST_ADDOPTS"] = "-p suite_clock"
            for stage, stage_cmd in (
                    ("solutions", ["-m", "workbook.cli", "grade", "--impl", "solutions", "--strict"]),
                    ("stubs", ["-m", "workbook.instructor.selftest", "stubs", "--level", "standard",
                               "--level", "challenge"])):
                t1 = time.monotonic()
                subprocess.call([sys.executable, *stage_cmd], cwd=ROOT,
                                env=dict(env, WORKBOOK_SUITE_CLOCK_STAGE=stage),
                                stdout=subprocess.DEVNULL)
                took[stage] = time.monotonic() - t1
        print("\n" + "; ".join(f"{k} {v:.0f} s" for k, v in took.items())
              + f" (run one after the other); clock file: {record}")
        paths = [record]
    rows = load(paths)
    if args.module_seconds:
        write_module_seconds(rows, args.module_seconds)
    result = report(rows, top=args.top, labs=args.lab or ())
    if args.check_budget and (result["over_budget"] or result["over_limit"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
