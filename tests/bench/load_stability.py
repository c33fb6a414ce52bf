"""Do correct answers keep every point on a machine at load 8+, and does a real hang still end?

    python tests/bench/load_stability.py                     # 6 busy loops, 5 gradings, every lab
    python tests/bench/load_stability.py --busy 6 --runs 5 --labs domino,tp_overlap

Beside ``--busy`` busy-loop processes (each keeps one core's worth of work waiting: six on two
cores make a load average of 8 or more), this grades the reference (``solutions``) ``--runs``
times with the grader learners and instructors use, default options (``workbook grade --impl
solutions``, the Gradescope results written to a file), and after each grading self-checks
Domino the way the issue that asked for this saw a correct answer called a hang (``workbook
run domino --impl solutions``). Then, under the same load, a real hang (a barrier in which rank
3 skips one receive, ``workbook run collectives --nproc 4``) must end in the per-rank report
within ``--timeout`` + 15 s.

It prints a table per lab: gradings, HANG verdicts, "still running" verdicts, points lost,
slowest grading; the load average seen; exit status 1 if a point was lost, a hang was called
on the reference, or the real hang took too long. The busy loops are stopped however it ends.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HANG_WORDS = "no rank made progress"
SLOW_WORDS = "still running after"
SKIPS_A_RECV = ("        dist.recv(heard, src=(rank - step) % n)\n",
                "        if not (rank == 3 and step == 2):\n"
                "            dist.recv(heard, src=(rank - step) % n)\n")


def start_busy(n: int) -> list[subprocess.Popen]:
    """``n`` processes that spin for ever, in a process group of their own."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(n)]


def stop_busy(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def workbook(*args: str, timeout: float = 3600) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "workbook.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0


def grade(labs: list[str], results: Path) -> dict:
    """One grading of the reference: {lab: {"lost": points, "hang": n, "slow": n, "bad": [..]}}."""
    code, out, seconds = workbook("grade", "--impl", "solutions", "--gradescope", str(results),
                                  *[a for lab in labs for a in ("--lab", lab)])
    tests = json.loads(results.read_text())["tests"] if results.is_file() else []
    per_lab: dict = defaultdict(lambda: {"lost": 0.0, "hang": 0, "slow": 0, "bad": []})
    for t in tests:
        lab = str(t.get("name", "?")).split("::", 1)[0]
        entry = per_lab[lab]
        lost = float(t.get("max_score", 0)) - float(t.get("score", 0))
        text = t.get("output") or ""
        entry["lost"] += lost
        entry["hang"] += HANG_WORDS in text
        entry["slow"] += SLOW_WORDS in text
        if lost:
            entry["bad"].append(f"{t.get('name')}: {text.strip().splitlines()[:1]}")
    if not tests:
        per_lab["(no results)"]["bad"].append(out[-2000:])
    return {"code": code, "seconds": round(seconds, 1), "labs": dict(per_lab)}


def real_hang(timeout: float) -> tuple[bool, float, str]:
    """A barrier whose rank 3 skips a receive, under the same load: whether ``workbook run``
    ended in the report (exit 2), and the seconds from the hang's start to its return: the
    longest wait the report gives ("for 60.8 s": the hang began when that rank got stuck) plus
    the time from the report's line to the process's end."""
    text = (ROOT / "solutions" / "collectives.py").read_text()
    old, new = SKIPS_A_RECV
    assert old in text, "the collectives solution changed: update SKIPS_A_RECV"
    with tempfile.TemporaryDirectory(prefix="load-stability-") as tmp:
        (Path(tmp) / "collectives.py").write_text(text.replace(old, new))
        proc = subprocess.Popen([sys.executable, "-u", "-m", "workbook.cli", "run", "collectives",
                                 "--impl", tmp, "--nproc", "4", "--timeout", f"{timeout:g}"],
                                cwd=ROOT, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        lines, seen_at = [], None
        for line in proc.stdout:
            lines.append(line)
            if seen_at is None and line.lstrip().startswith("HANG"):
                seen_at = time.monotonic()
        code = proc.wait()
        ended = time.monotonic()
    out = "".join(lines)
    waited = [float(w) for w in re.findall(r", for ([0-9.]+) s\.", out)]
    reported = code == 2 and "HANG  barrier_waits_for_everyone" in out and seen_at is not None
    seconds = (max(waited) if waited else math.inf) + (ended - seen_at if seen_at else 0.0)
    return reported, seconds, out


def main(argv=None) -> int:
    from workbook.grading.labs import LABS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, default=6, help="busy-loop processes (default 6)")
    parser.add_argument("--runs", type=int, default=5,
                        help="gradings of the reference (default 5; 0: only the real hang)")
    parser.add_argument("--labs", default=",".join(LABS), help="comma-separated (default: all)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="the real hang's --timeout (default 60, the learner's default)")
    parser.add_argument("--no-domino-run", action="store_true",
                        help="skip the `workbook run domino` self-check after each grading")
    parser.add_argument("--json", default=None, help="write every record here")
    args = parser.parse_args(argv)
    labs = [x for x in args.labs.split(",") if x]
    unknown = sorted(set(labs) - set(LABS))
    if unknown or args.runs < 0 or args.busy < 0 or args.timeout <= 0:
        parser.error(f"unknown labs {unknown}" if unknown else
                     "--runs and --busy must be at least 0, --timeout positive")
    busy = start_busy(args.busy)
    records: dict = {"busy": args.busy, "cpus": os.cpu_count(), "gradings": [], "domino_runs": [],
                     "loads": []}
    try:
        time.sleep(5)                                        # let the load average climb
        with tempfile.TemporaryDirectory(prefix="load-stability-") as tmp:
            for k in range(args.runs):
                records["loads"].append(os.getloadavg()[0])
                g = grade(labs, Path(tmp) / f"results{k}.json")
                records["gradings"].append(g)
                lost = sum(e["lost"] for e in g["labs"].values())
                print(f"grading {k + 1}/{args.runs}: {g['seconds']:.0f} s, {lost:g} points lost, "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
                if "domino" in labs and not args.no_domino_run:
                    code, out, seconds = workbook("run", "domino", "--impl", "solutions")
                    records["domino_runs"].append({"code": code, "seconds": round(seconds, 1),
                                                   "hang": HANG_WORDS in out,
                                                   "tail": out[-600:] if code else ""})
                    print(f"  workbook run domino: exit {code} in {seconds:.0f} s", flush=True)
        records["loads"].append(os.getloadavg()[0])
        reported, seconds, out = real_hang(args.timeout)
        records["real_hang"] = {"reported": reported, "seconds": round(seconds, 1),
                                "limit_s": args.timeout + 15, "tail": out[-800:]}
    finally:
        stop_busy(busy)
    return report(records, labs, args)


def report(records: dict, labs: list[str], args) -> int:
    loads = records["loads"]
    print(f"\n{args.busy} busy loops on {records['cpus']} cores; load average (1 min) "
          f"{min(loads):.1f}-{max(loads):.1f} at the gradings' starts and end")
    print(f"{'lab':<16}{'gradings':>9}{'HANG':>6}{'still running':>15}{'points lost':>13}")
    failed = False
    for lab in labs:
        rows = [g["labs"].get(lab, {"lost": 0.0, "hang": 0, "slow": 0, "bad": ["no results"]})
                for g in records["gradings"]]
        hang, slow = sum(r["hang"] for r in rows), sum(r["slow"] for r in rows)
        lost = sum(r["lost"] for r in rows)
        failed |= bool(hang or slow or lost or any(r["bad"] for r in rows))
        print(f"{lab:<16}{len(rows):>9}{hang:>6}{slow:>15}{lost:>13g}")
        for r in rows:
            for bad in r["bad"]:
                print(f"    {bad[:200]}")
    times = [g["seconds"] for g in records["gradings"]]
    if times:
        print(f"gradings took {min(times):.0f}-{max(times):.0f} s each")
    for d in records["domino_runs"]:
        failed |= d["code"] != 0
    if records["domino_runs"]:
        codes = [d["code"] for d in records["domino_runs"]]
        print(f"workbook run domino --impl solutions: exit {codes}, "
              f"{max(d['seconds'] for d in records['domino_runs']):.0f} s at most")
    h = records.get("real_hang")
    if h:
        ok = h["reported"] and h["seconds"] <= h["limit_s"]
        failed |= not ok
        print(f"real hang (rank 3 skips a receive, --timeout {args.timeout:g}): "
              f"{'reported' if h['reported'] else 'NOT reported'}, workbook run returned "
              f"{h['seconds']:.1f} s after the hang began (limit {h['limit_s']:g} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
