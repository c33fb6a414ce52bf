"""How often do the timing-graded checks fail a correct answer, and do they catch every wrong one?

    python tests/bench/grading_stability.py                        # every lab, every condition
    python tests/bench/grading_stability.py --quick --labs async_overlap --conditions quiet

Checks graded from measured time (the share of communication hidden behind compute, read from
the traces of a simulated link) follow ``workbook.grading.timing``. For each lab and condition
this script grades the reference (``solutions``) ``--runs`` times, running only the lab's timing
checks, and each deliberately wrong lab of ``tests/grading/wrong/`` (the ``CASES`` of
``tests/package/test_*_wrong_caught.py``) ``--fixture-runs`` times, running all its checks.

Conditions (each lab x condition cell runs in its own worker process, with its own rank pools):

* ``quiet``   nothing added (other work on the machine still counts: see the load average);
* ``busy``    two busy-loop Python processes, started for the cell and killed after it;
* ``onecore`` the worker and the ranks it starts pinned to CPU 0 (``sched_setaffinity``).

Reading the table: *false failures* are runs of the reference in which a timing check did not
pass (their messages are in the JSON, so you can see why); *caught* counts runs of a wrong lab
in which every test its CASES says must fail failed. *closest margin* is the smallest number of
points by which the reference's best measurement cleared a threshold, and *re-measured* how
many checks needed a second measurement (both from ``measure_until_clear``; overlap % labs
only). Exit status 1 when any false failure or any missed wrong lab was seen.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMING_CHECKS = {
    "async_overlap": ["overlapped_all_reduce_hides_communication",
                      "pipelined_all_reduce_hides_communication"],
    "domino": ["forward_communication_hidden", "backward_communication_hidden"],
    "overlap_math": ["predictions_match_the_measured_trace"],
    "tp_overlap": ["forward_communication_hidden", "backward_communication_hidden"],
    "dp_overlap": ["bucketed_all_reduce_hidden", "zero2_traffic_hidden", "zero3_gathers_hidden"],
    "pp_overlap": ["steady_state_p2p_hidden"],
    "pp_schedules": ["steady_state_p2p_hidden"],
    "ep_overlap": ["shared_expert_hides_dispatch", "deferred_wgrad_hides_backward",
                   "two_batch_hides"],
    "cp_ring": ["forward_exchange_hidden", "backward_exchange_hidden"],
    "capstone": ["overlap_tp", "overlap_dp", "overlap_pp"],
}
PCT_LABS = {"async_overlap", "domino", "tp_overlap", "dp_overlap", "pp_overlap", "cp_ring",
            "ep_overlap", "capstone"}          # whose shortfall is in points of overlap %
CONDITIONS = ["quiet", "busy", "onecore"]
MARK = "GRADING_STABILITY_RESULT "
# tests/package/test_overlap_math_wrong_caught.py asserts this set inline (it has no CASES)
OVERLAP_MATH_CASES = {"overlap_math_no_bus_factor": {
    "test_collective_time_uses_bus_factors", "test_tp_dp_zero3_pp_predictions",
    "test_predictions_match_the_measured_trace"}}


def wrong_cases(lab: str) -> dict[str, set[str]]:
    """{wrong folder: the tests that must fail} for ``lab``, read from the package tests."""
    sys.path.insert(0, str(ROOT / "tests" / "package"))
    cases = dict(OVERLAP_MATH_CASES if lab == "overlap_math" else {})
    for name in ("test_wrong_impls_caught", "test_domino_wrong_caught",
                 "test_tp_overlap_wrong_caught", "test_dp_overlap_wrong_caught",
                 "test_pp_overlap_wrong_caught", "test_cp_ring_wrong_caught",
                 "test_pp_schedules_wrong_caught", "test_ep_overlap_grader",
                 "test_capstone_wrong_caught"):
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests/package" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for folder, case in module.CASES.items():
            in_process = ("dp_overlap", "pp_overlap", "cp_ring", "pp_schedules",  # (checks run,
                          "ep_overlap", "capstone")
            # {check: words}), no test_
            if folder.startswith(in_process):
                if folder.startswith(lab):
                    cases[folder] = {f"test_{name}" for name in case[1]}
                continue
            test_file, expected = case if isinstance(case, tuple) else \
                (f"test_{name.split('_wrong')[0][5:]}.py", case)
            if test_file == f"test_{lab}.py":
                cases[folder] = set(expected)
    return cases


# --------------------------------------------------------------------------- the worker
def record_measurements(log: list) -> None:
    """Wrap ``measure_until_clear`` (the checks import it afresh on each run_checks) so that
    every timing check's list of shortfalls is appended to ``log``."""
    from workbook.grading import timing
    original = timing.measure_until_clear

    def wrapped(run, shortfall, **kw):
        shorts = []
        best = original(run, lambda r: shorts.append(shortfall(r)) or shorts[-1], **kw)
        log.append(shorts)
        return best
    timing.measure_until_clear = wrapped


def worker(lab: str, runs: int, fixture_runs: int) -> dict:
    from workbook.grading.engine import ERROR, FAILED, PASSED, run_checks
    from workbook.grading.labs import use_impl
    log: list = []
    record_measurements(log)
    out = {"lab": lab, "cpus": sorted(os.sched_getaffinity(0)), "load_start": os.getloadavg()[0],
           "runs": runs, "false_failures": 0, "failures": [], "run_s": [], "fixtures": {}}
    t_cell = time.perf_counter()
    use_impl("solutions")
    for k in range(runs):
        t0 = time.perf_counter()
        verdicts = run_checks(lab, only=TIMING_CHECKS[lab])
        out["run_s"].append(round(time.perf_counter() - t0, 2))
        bad = [v for v in verdicts if v.status != PASSED]
        out["false_failures"] += bool(bad) or not verdicts
        out["failures"] += [{"run": k, "check": v.name, "status": v.status,
                             "message": v.message[:300]} for v in bad]
        print(f"  {lab} solutions run {k + 1}/{runs}: "
              f"{'FAILED ' + ', '.join(v.name for v in bad) if bad else 'passed'} "
              f"({out['run_s'][-1]:.1f} s)", file=sys.stderr, flush=True)
    finite = [-min(s) for s in log if s and min(s) != float("inf")]
    out["closest_margin"] = round(min(finite), 1) if finite and lab in PCT_LABS else None
    out["remeasured"] = sum(len(s) > 1 for s in log)
    out["measured_checks"] = len(log)
    out["shortfalls"] = [[None if x == float("inf") else round(x, 1) for x in s] for s in log]
    for folder, must_fail in sorted(wrong_cases(lab).items()):
        use_impl(str(ROOT / "tests" / "grading" / "wrong" / folder))
        f = out["fixtures"][folder] = {"runs": fixture_runs, "caught": 0, "missed": [], "run_s": []}
        for k in range(fixture_runs):
            t0 = time.perf_counter()
            status = {}
            for v in run_checks(lab):
                name = "test_" + v.name.split("[")[0]
                if status.get(name) not in (FAILED, ERROR):   # a parametrised test: any instance
                    status[name] = v.status
            f["run_s"].append(round(time.perf_counter() - t0, 2))
            escaped = {t: status.get(t, "not run") for t in must_fail
                       if status.get(t) not in (FAILED, ERROR)}
            f["caught"] += not escaped
            if escaped:
                f["missed"].append({"run": k, "not_failed": escaped})
            print(f"  {lab} {folder} run {k + 1}/{fixture_runs}: "
                  f"{'MISSED ' + str(escaped) if escaped else 'caught'} ({f['run_s'][-1]:.1f} s)",
                  file=sys.stderr, flush=True)
    out["seconds"] = round(time.perf_counter() - t_cell, 1)
    return out


# --------------------------------------------------------------------------- the parent
def run_cell(lab: str, condition: str, args) -> dict:
    """One lab x condition in a worker process; the load and pinning exist only around it."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--labs", lab,
           "--runs", str(args.runs), "--fixture-runs", str(args.fixture_runs)]
    pin = (lambda: os.sched_setaffinity(0, {0})) if condition == "onecore" else None
    busy, proc = [], None
    try:
        if condition == "busy":
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                                preexec_fn=pin, start_new_session=True)
        stdout, _ = proc.communicate()
    finally:
        for p in busy:
            p.kill()
            p.wait()
        if proc is not None and proc.poll() is None:        # interrupted: the worker and its ranks
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    lines = [ln for ln in stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        return {"lab": lab, "condition": condition, "error": f"worker exit {proc.returncode}",
                "stdout_tail": stdout[-2000:]}
    return {**json.loads(lines[-1][len(MARK):]), "condition": condition}


def fixtures_cell(cell: dict) -> str:
    lab = cell["lab"]
    return ", ".join(f"{name.removeprefix(lab + '_')} {f['caught']}/{f['runs']}"
                     for name, f in cell["fixtures"].items()) or "-"


def table(cells: list[dict]) -> str:
    rows = ["| lab | condition | solutions: false failures / runs | wrong fixtures caught / runs "
            "| closest margin (pts) | re-measured | s per run (median) | seconds |",
            "|---|---|---|---|---|---|---|---|"]
    for c in cells:
        if "error" in c:
            rows.append(f"| {c['lab']} | {c['condition']} | {c['error']} | | | | | |")
            continue
        per = statistics.median(c["run_s"]) if c["run_s"] else 0.0
        margin = "-" if c["closest_margin"] is None else f"{c['closest_margin']:+.1f}"
        rows.append(f"| {c['lab']} | {c['condition']} | {c['false_failures']} / {c['runs']} | "
                    f"{fixtures_cell(c)} | {margin} | {c['remeasured']} of "
                    f"{c['measured_checks']} | {per:.1f} | {c['seconds']:.0f} |")
    return "\n".join(rows)


def bad(cell: dict) -> bool:
    return "error" in cell or cell["false_failures"] > 0 or any(
        f["caught"] < f["runs"] for f in cell["fixtures"].values())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--labs", default=",".join(TIMING_CHECKS),
                        help=f"comma-separated, of {', '.join(TIMING_CHECKS)}")
    parser.add_argument("--conditions", default=",".join(CONDITIONS),
                        help=f"comma-separated, of {', '.join(CONDITIONS)}")
    parser.add_argument("--runs", type=int, default=20, help="gradings of the reference per cell")
    parser.add_argument("--fixture-runs", type=int, default=3, help="gradings of each wrong lab")
    parser.add_argument("--json", default=str(ROOT / "runs" / "grading_stability.json"))
    parser.add_argument("--quick", action="store_true", help="--runs 2 --fixture-runs 1")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.fixture_runs = 2, 1
    labs, conditions = args.labs.split(","), args.conditions.split(",")
    unknown = set(labs) - set(TIMING_CHECKS) | set(conditions) - set(CONDITIONS)
    if unknown:
        parser.error(f"unknown lab or condition: {', '.join(sorted(unknown))}")
    if args.worker:
        print(MARK + json.dumps(worker(labs[0], args.runs, args.fixture_runs)), flush=True)
        return 0

    import torch
    machine = {"cores": os.cpu_count(), "load_avg_start": os.getloadavg(),
               "torch": torch.__version__, "python": platform.python_version(),
               "platform": platform.platform(),
               "date": datetime.datetime.now().isoformat(timespec="seconds")}
    cells = []
    for lab in labs:
        for condition in conditions:
            print(f"{lab} / {condition}: {args.runs} runs of solutions, {args.fixture_runs} of "
                  f"each wrong lab", file=sys.stderr, flush=True)
            cells.append(run_cell(lab, condition, args))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "cells": cells}, indent=2))
    load = ", ".join(f"{x:.2f}" for x in machine["load_avg_start"])
    print(f"\nGrading stability, {machine['date']}: {machine['cores']} cores, load average "
          f"{load} at start, torch {machine['torch']}, Python {machine['python']}\n")
    print(table(cells))
    for c in cells:
        for f in c.get("failures", []):
            print(f"\n{c['lab']}/{c['condition']} run {f['run']}: {f['check']} {f['status']}: "
                  f"{f['message']}")
        for name, fx in c.get("fixtures", {}).items():
            for m in fx["missed"]:
                print(f"\n{c['lab']}/{c['condition']} {name} run {m['run']} missed: "
                      f"{m['not_failed']}")
        if "error" in c:
            print(f"\n{c['lab']}/{c['condition']}: {c['error']}\n{c['stdout_tail']}")
    print(f"\nJSON: {out}")
    return 1 if any(bad(c) for c in cells) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:                  # the cell's load and worker are already gone
        sys.exit(130)
