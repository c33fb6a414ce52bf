"""A pytest plugin that clocks every test: wall time, CPU time of everything it ran, rank starts.

Loaded by ``tests/bench/suite_time.py`` (``-p suite_clock`` with this folder on the path); it
writes one JSON line per test to the file named by ``WORKBOOK_SUITE_CLOCK``:

* ``wall``: set-up + call + tear-down, seconds (pytest's own phases, summed);
* ``cpu``: CPU seconds used meanwhile by the test process and every process below it (ranks,
  fork server, subprocesses, kernels, browsers), read from ``/proc``: for each live process its
  own time plus the time of the children it has reaped, so a process that came and went inside
  the test still counts once its parent reaps it;
* ``rank_start``: seconds spent starting rank pools in this process (``RankPool.__init__``) and
  ``pools`` how many;
* ``procs``: processes that appeared below the test process while it ran (sampled every
  ``SAMPLE_S``, so one that lived less than that can be missed): each new Python process imports
  torch. Each sample reads every process's ``/proc/PID/stat``: 9 ms of CPU with 200 processes on
  the machine, 3 ms with 70. Sampled every 0.1 s, as it once was, each of the test command's three
  clocked processes (two workers, the grading stages) spent up to a tenth of a core on it;
* ``start``: when the test began (seconds since the epoch), for a timeline of the run;
* ``setup``, ``call``, ``teardown``: the phases' own times;
* ``stage``: the test command's stage (``WORKBOOK_SUITE_CLOCK_STAGE``: ``package``, the default,
  ``solutions`` or ``stubs-LEVEL`` for the grader's own tests in ``tests/grading``);
* ``worker``: the pytest-xdist worker that ran it (``gw0``, ...; ``main`` without xdist).

A test's time splits (in ``suite_time.py``) into *starting ranks* (``rank_start``), *compute*
(CPU seconds beyond those, capped by what is left of the wall time) and *waiting* (the rest: no
core busy on the test's behalf: sleeps, timeouts, a process waiting on another).
"""
from __future__ import annotations

import json
import os
import threading
import time

import pytest

_TICK = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 1.0


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids


def _tree(root: int) -> list[int]:
    kids, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


def _cpu(pid: int) -> float:
    """Own + reaped children's CPU seconds of one process (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / _TICK      # utime stime cutime cstime


def tree_cpu(root: int | None = None) -> float:
    return sum(_cpu(pid) for pid in _tree(root or os.getpid()))


class _Sampler(threading.Thread):
    """Records the PIDs seen below this process while a test runs."""

    def __init__(self):
        super().__init__(daemon=True)
        self.seen: set[int] = set()
        self.stop = threading.Event()

    def run(self):
        me = os.getpid()
        while not self.stop.wait(SAMPLE_S):
            self.seen.update(_tree(me))


class SuiteClock:
    def __init__(self, path: str):
        self.path = path
        self.rank_start = 0.0
        self.pools = 0
        self._patch_pool()

    def _patch_pool(self):
        from workbook.runtime import pool as pool_module
        original = pool_module.RankPool.__init__
        clock = self

        def timed_init(self, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                original(self, *args, **kwargs)
            finally:
                clock.rank_start += time.perf_counter() - t0
                clock.pools += 1
        pool_module.RankPool.__init__ = timed_init

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        me = os.getpid()
        before_pids = set(_tree(me))
        sampler = _Sampler()
        sampler.start()
        start_rank, start_pools = self.rank_start, self.pools
        cpu0, t0, start = tree_cpu(me), time.perf_counter(), time.time()
        phases: dict[str, float] = {}
        item._suite_clock_phases = phases
        yield
        wall = time.perf_counter() - t0
        cpu = tree_cpu(me) - cpu0
        sampler.stop.set()
        sampler.join()
        new = len(sampler.seen - before_pids)
        record = {"test": item.nodeid,
                  "stage": os.environ.get("WORKBOOK_SUITE_CLOCK_STAGE", "package"),
                  "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "wall": round(wall, 3), "cpu": round(max(cpu, 0.0), 3),
                  "rank_start": round(self.rank_start - start_rank, 3),
                  "pools": self.pools - start_pools, "procs": new,
                  **{k: round(v, 3) for k, v in phases.items()},
                  "load": round(os.getloadavg()[0], 2), "start": round(start, 2)}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        phases = getattr(item, "_suite_clock_phases", None)
        if phases is not None:
            phases[call.when] = call.duration
            report = outcome.get_result()
            if report.failed:
                phases["failed"] = 1.0


def pytest_configure(config):
    path = os.environ.get("WORKBOOK_SUITE_CLOCK")
    if path:
        config.pluginmanager.register(SuiteClock(path), "workbook-suite-clock")
