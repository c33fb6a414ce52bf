"""What grading costs: wall time, CPU time and the peak memory of every rank together.

    python tests/bench/grading_resources.py --breakdown                 # every lab, caps 1 2 4
    python tests/bench/grading_resources.py --labs tp,domino --caps 2 --onecore domino \
        --halfcore tp

For each lab and each rank cap this grades the reference (``workbook grade --impl solutions
--lab LAB --max-ranks CAP``) in a fresh process tree and samples, every ``--every`` seconds, the
proportional set size (PSS, ``/proc/PID/smaps_rollup``) of the grading command and all its
descendants (pytest, the fork server, every rank): a page shared by several processes (torch's
libraries, what the fork server imported before forking the ranks) is split between them, so
the sum counts it once: it is what the machine must hold, what a container's memory limit
sees. ``--onecore LAB,...`` grades those labs again pinned to CPU 0 (``taskset -c 0``);
``--halfcore LAB,...`` pins them to CPU 0 beside a busy loop pinned there too, roughly the half
vCPU of Gradescope's default machine.

Columns: *wall s* the grading command from start to exit; *CPU s* the user + system time of
every process of the tree (what one core must give; twice as long on half a core); *peak PSS
MB* the largest sampled sum (MB = 2**20 bytes); *peak RSS MB* the same for resident set size
(shared pages counted in every process: an upper bound); *ranks* the most rank processes alive
at once (``--breakdown`` adds a line per row: which kind of process held what at the peak);
*score* from the command's Gradescope results (the solutions must get full marks under every
cap, else the exit status is 1). Standard library only (no psutil), Linux only.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from workbook.grading.labs import LABS  # noqa: E402  (torch-free)

MB = 2 ** 20


# --------------------------------------------------------------------------- /proc sampling
def _children_map() -> dict[int, list[int]]:
    """{ppid: [pid, ...]} for every process (one pass over /proc/*/stat)."""
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])     # after "(comm)": state, ppid
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def tree(root: int) -> list[int]:
    """``root`` and all its descendants (the fork server's ranks included)."""
    kids, out, todo = _children_map(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def _rollup(pid: int) -> tuple[int, int]:
    """(PSS, RSS) of one process in bytes; (0, 0) if it has gone."""
    pss = rss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                elif line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return pss, rss


class Sampler(threading.Thread):
    """Samples the process tree under ``root`` every ``every`` seconds until ``stop()``."""

    def __init__(self, root: int, every: float = 0.05):
        super().__init__(daemon=True)
        self.root, self.every = root, every
        self.peak_pss = self.peak_rss = self.peak_procs = self.samples = 0
        self.peak_ranks = 0
        self.breakdown: list[tuple[str, int]] = []       # (role, PSS) of each process at the peak
        self.cpu: dict[int, float] = {}                   # pid -> CPU seconds, last seen
        self._done = threading.Event()

    def run(self):
        while not self._done.is_set():
            pids = tree(self.root)
            pss = rss = ranks = 0
            parts = []
            for pid in pids:
                p, r = _rollup(pid)
                pss, rss = pss + p, rss + r
                parts.append((_role(pid), p))
                self.cpu[pid] = max(self.cpu.get(pid, 0.0), _cpu_s(pid))
            ranks = sum(role == "rank" for role, _ in parts)
            if pss > self.peak_pss:
                self.breakdown = parts
            self.peak_pss, self.peak_rss = max(self.peak_pss, pss), max(self.peak_rss, rss)
            self.peak_procs = max(self.peak_procs, len(pids))
            self.peak_ranks = max(self.peak_ranks, ranks)
            self.samples += 1
            self._done.wait(self.every)

    def stop(self):
        self._done.set()
        self.join()


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) ``pid`` has used so far; 0 if it has gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICK          # utime, stime


def _role(pid: int) -> str:
    """What a process of the grading tree is: rank (forked by the fork server), fork server,
    resource tracker, pytest (the grader, where the judges run) or cli (``workbook grade``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
        with open(f"/proc/{ppid}/cmdline", "rb") as f:
            parent = f.read()
    except (OSError, ValueError):
        return "gone"
    if b"multiprocessing.forkserver" in parent:
        return "rank"
    for needle, role in ((b"multiprocessing.forkserver", "fork server"),
                         (b"resource_tracker", "resource tracker"), (b"pytest", "pytest"),
                         (b"workbook", "cli")):
        if needle in cmd:
            return role
    return "other"


def breakdown(parts: list[tuple[str, int]]) -> str:
    """``pytest 240 + fork server 95 + 3 ranks 150 (50 each)``, MB of PSS at the peak."""
    by: dict[str, list[int]] = {}
    for role, pss in parts:
        by.setdefault(role, []).append(pss)
    out = []
    for role in ("cli", "pytest", "fork server", "resource tracker", "rank", "other"):
        if role in by:
            total = sum(by[role]) / MB
            if role == "rank":
                n = len(by[role])
                out.append(f"{n} rank{'s' if n > 1 else ''} {total:.0f}"
                           + (f" ({min(by[role]) / MB:.0f}-{max(by[role]) / MB:.0f} each)" if n > 1 else ""))
            else:
                out.append(f"{role} {total:.0f}")
    return " + ".join(out)


# --------------------------------------------------------------------------- one measurement
CORES = {"all": "all", "one": "1 (taskset -c 0)", "half": "1, shared with a busy loop"}


def measure(lab: str, cap: int | None, *, cores: str = "all", every: float = 0.05,
            timeout: float = 900.0) -> dict:
    """Grade the solutions of ``lab`` under rank cap ``cap`` and sample the process tree.

    ``cores``: ``all``; ``one`` (pinned to CPU 0); ``half`` (pinned to CPU 0 beside a busy
    loop pinned there too: roughly the half vCPU of Gradescope's default machine)."""
    with tempfile.TemporaryDirectory(prefix="grading-resources-") as tmp:
        results = Path(tmp) / "results.json"
        cmd = [sys.executable, "-m", "workbook.cli", "grade", "--impl", "solutions",
               "--gradescope", str(results)] + ([] if lab == "all" else ["--lab", lab])
        if cap is not None:
            cmd += ["--max-ranks", str(cap)]
        if cores != "all":
            cmd = ["taskset", "-c", "0"] + cmd
        env = dict(os.environ)
        env.pop("WORKBOOK_MAX_RANKS", None)
        busy = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"]) \
            if cores == "half" else None
        try:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            sampler = Sampler(proc.pid, every)
            sampler.start()
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            wall = time.perf_counter() - t0
            sampler.stop()
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
        score = max_score = None
        if results.is_file():
            data = json.loads(results.read_text())
            score, max_score = data["score"], data["max_score"]
    return {"lab": lab, "cap": cap, "cores": cores, "wall_s": round(wall, 1),
            "cpu_s": round(sum(sampler.cpu.values()), 1),
            "peak_pss_mb": round(sampler.peak_pss / MB), "peak_rss_mb": round(sampler.peak_rss / MB),
            "procs": sampler.peak_procs, "ranks": sampler.peak_ranks, "samples": sampler.samples,
            "exit": proc.returncode, "score": score, "max_score": max_score,
            "breakdown": breakdown(sampler.breakdown),
            "tail": "" if proc.returncode == 0 else out[-1500:]}


def row(r: dict) -> str:
    score = "-" if r["score"] is None else f"{r['score']:g} / {r['max_score']:g}"
    cpus = str(os.cpu_count()) if r["cores"] == "all" else CORES[r["cores"]]
    return (f"| {r['lab']} | {r['cap'] if r['cap'] is not None else 'none'} | {cpus} | "
            f"{r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['peak_pss_mb']} | {r['peak_rss_mb']} | "
            f"{r['ranks']} | {score} |")


HEADER = ("| lab | rank cap | cores | wall s | CPU s | peak PSS MB | peak RSS MB | ranks | score |\n"
          "|---|---|---|---|---|---|---|---|---|")


def machine() -> str:
    try:
        mem = next(int(line.split()[1]) for line in open("/proc/meminfo")
                   if line.startswith("MemTotal")) / 2 ** 20
    except (OSError, StopIteration):
        mem = float("nan")
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import importlib.metadata as md
    return (f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB; Python {platform.python_version()}, "
            f"torch {md.version('torch')}; load average at start {os.getloadavg()[0]:.2f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--labs", default=",".join(LABS),
                        help="comma-separated lab names; 'all': every lab in one grading run")
    parser.add_argument("--caps", default="1,2,4",
                        help="comma-separated rank caps ('none': no cap)")
    parser.add_argument("--onecore", default="domino",
                        help="comma-separated labs to grade again pinned to CPU 0 ('' for none)")
    parser.add_argument("--halfcore", default="",
                        help="comma-separated labs to grade again on CPU 0 beside a busy loop")
    parser.add_argument("--onecore-caps", default="1,2",
                        help="the caps of the one-core and half-core runs")
    parser.add_argument("--every", type=float, default=0.05, help="sampling period, seconds")
    parser.add_argument("--breakdown", action="store_true",
                        help="after each row, the PSS of each kind of process at the peak")
    parser.add_argument("--json", default=None, help="also write every measurement here")
    args = parser.parse_args(argv)
    labs = [lab for lab in args.labs.split(",") if lab]
    unknown = sorted(set(labs) - set(LABS) - {"all"})
    if unknown:
        parser.error(f"unknown labs {unknown}; the labs are {', '.join(LABS)}")

    def caps(text):
        return [None if c == "none" else int(c) for c in text.split(",") if c]

    print(f"machine: {machine()}", flush=True)
    print(f"command: python tests/bench/grading_resources.py "
          f"{' '.join(argv if argv is not None else sys.argv[1:])}".rstrip(), flush=True)
    print(HEADER, flush=True)
    rows, bad = [], False
    plan = [(lab, cap, "all") for lab in labs for cap in caps(args.caps)]
    for cores, which in (("one", args.onecore), ("half", args.halfcore)):
        plan += [(lab, cap, cores) for lab in which.split(",") if lab
                 for cap in caps(args.onecore_caps)]
    for lab, cap, cores in plan:
        r = measure(lab, cap, cores=cores, every=args.every)
        rows.append(r)
        print(row(r), flush=True)
        if args.breakdown:
            print(f"    at the peak, MB of PSS: {r['breakdown']}", flush=True)
        if r["exit"] != 0 or r["score"] != r["max_score"]:
            bad = True
            print(f"    (exit {r['exit']}; the solutions must get full marks)\n" +
                  "\n".join("    " + line for line in r["tail"].splitlines()[-15:]), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"machine": machine(), "rows": rows}, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
