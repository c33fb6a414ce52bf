"""The checks on a torchrun job's own ranks: ``torchrun --nproc_per_node=N labs/LAB.py``.

Under torchrun the ranks are the job's processes, not a pool the engine can kill and restart,
so this module gives each rank what the pool gives the launcher:

* **one verdict, not N tracebacks**: every rank runs a check's rank side, then posts its
  outcome (result or error) to the job's store; every rank reads all outcomes, so every rank
  judges the same records. A rank that raised tears its process group down (peers blocked on
  it fail at once) and all ranks join a fresh one (a new store prefix) for the next check;
* **a hang ends in the report**: a watchdog thread per rank posts, once a second, its rank's
  flight-recorder state (the count of calls entered and left, and whether it sits in one) to
  the store and reads every rank's. When no rank's count has moved for ``timeout`` seconds
  while every rank sits in a call or has finished the check, it is a hang (as in
  ``workbook.runtime.pool``: no progress, not a long check); each rank posts the last call its
  flight recorder saw, rank 0 prints the per-rank report, and the job ends with exit status 2.
  Rank 0 waits for the ranks' last calls only as long as their watchdogs still post: a rank
  silent for about ``timeout`` is gone (its process, or its node), its last post is its line.
  A check that keeps progressing past its wall limit ends the same way, called "still
  running", not a hang. The process group's own timeout sits far above both, so gloo's "Timed
  out waiting ..." never comes first;
* **quiet exits**: each node's local rank 0 carries the job's exit status; the others leave
  first with 0, so torchrun lists one failed rank per node, not every rank (torchrun itself
  exits 1 on any failure). On several nodes every node's agent so fails by itself: none waits
  for the others in torchrun's exit barrier after node 0's agent (which serves the store) left.
"""
from __future__ import annotations

import json
import os
import pickle
import sys
import threading
import time

from workbook.runtime.messages import first_line

PG_TIMEOUT_S = 3600.0        # the process group's timeout: the watchdog always fires first
BEAT_S = 1.0                 # how often each rank's watchdog posts its progress
ANSWER_S = 5.0               # after a hang, how long rank 0 waits for each rank's last call
CPU_BUSY_S = 0.05            # CPU seconds since the last progress that make a rank "computing"
REBUILD_TRIES = 3            # fresh groups tried after a failed check before the job gives up
from workbook.runtime.multinode import EXIT_WITHIN_S  # noqa: E402


class JobRanks:
    """This process's rank of a torchrun job, running checks (see the module docstring)."""

    def __init__(self, timeout: float, backend: str | None = None):
        import torch
        import torch.distributed as dist
        from workbook.runtime.ranks import choose_backend, init_rank, threads_per_rank
        import faulthandler
        faulthandler.enable(all_threads=True)     # a fatal signal prints this rank's Python stack
        self.store, self.rank, self.world = next(dist.rendezvous("env://"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
        self.backend = choose_backend(backend, self.local_world, "none")
        if self.backend == "gloo":
            torch.set_num_threads(threads_per_rank(self.local_world))
        self.pg_timeout = max(PG_TIMEOUT_S, 10 * timeout)
        self.generation, self.seq, self.links = 0, 0, {}
        self._init = lambda: init_rank(self.rank, self.world, self.local_rank, self.backend,
                                       self.store, self.generation, self.pg_timeout)
        self._init()
        self.watchdog = Watchdog(self)
        self.watchdog.start()

    # -- one check's rank side on every rank
    def run(self, n: int, fn, args, kwargs, *, link: str, timeout: float,
            wall: float | None = None) -> list:
        import torch.distributed as dist
        from workbook.runtime import flight
        from workbook.grading.engine import Skipped
        from workbook.runtime.pool import _primary, _reraise
        from workbook.runtime.rank_loop import _describe_error
        from workbook.runtime.ranks import set_link
        if n != self.world:
            raise Skipped(f"runs on {n} ranks; this job has {self.world}")
        self.seq += 1
        keys = [f"workbook/outcome/{self.generation}/{self.seq}/{r}" for r in range(self.world)]
        from workbook.runtime.pool import wall_limit
        self.watchdog.arm(timeout, wall_limit(timeout) if wall is None else wall)
        try:
            try:
                flight.RECORDER.reset()
                set_link(link, self.links)
                outcome = ("ok", fn(*args, **kwargs))
                payload = pickle.dumps(outcome)
            except Exception as exc:                       # noqa: BLE001 - posted to every rank
                outcome = ("err", _describe_error(self.rank, exc))
                payload = pickle.dumps(outcome)
            flight.RECORDER._write({"state": "done"})    # finished: waits for the others
            self.store.set(keys[self.rank], payload)
            if outcome[0] == "err":
                dist.destroy_process_group()               # peers blocked on this rank fail now
            self.store.wait(keys)
            outcomes = [pickle.loads(self.store.get(k)) for k in keys]
        finally:
            self.watchdog.disarm()
        errors = {r: o[1] for r, o in enumerate(outcomes) if o[0] == "err"}
        if errors:
            self.links.clear()
            primary = _reraise(_primary(errors), self.world)
            try:
                self.rebuild()                 # a fresh group for the next check
            except Exception as exc:           # noqa: BLE001 - never hides the job's own error
                primary.add_note(f"(the job's process group could not be rebuilt after it: "
                                 f"{type(exc).__name__}: {first_line(str(exc), 160)})")
            raise primary
        return [o[1] for o in outcomes]

    def rebuild(self) -> None:
        """A fresh process group after a failed check, agreed by every rank through the store.

        Each rank builds generation g+1 and posts whether it could; where any rank could not
        (gloo's full mesh can fail under load: "Connection closed by peer" while the ranks
        connect, seen once in ~30 runs of the test command), every rank drops what it built and
        tries g+2, up to ``REBUILD_TRIES``. Without the agreement one rank would go on with no
        group while the others had one, and the job's ranks would leave the checks out of step.
        """
        import torch.distributed as dist
        failure = None
        for _ in range(REBUILD_TRIES):
            if dist.is_initialized():
                dist.destroy_process_group()
            self.generation += 1
            try:
                self._init()
                mine = b"ok"
            except Exception as exc:                        # noqa: BLE001 - agreed on below
                failure, mine = exc, first_line(f"{type(exc).__name__}: {exc}", 160).encode()
            keys = [f"workbook/rebuilt/{self.generation}/{r}" for r in range(self.world)]
            self.store.set(keys[self.rank], mine)
            self.store.wait(keys)
            said = [self.store.get(k) for k in keys]
            if all(s == b"ok" for s in said):
                return
            failure = failure or RuntimeError(next(s for s in said if s != b"ok").decode())
        if dist.is_initialized():
            dist.destroy_process_group()
        raise failure

    # -- leaving
    def finish(self, code: int) -> None:
        """End the job: on each node the other ranks leave first (exit 0), then local rank 0
        with ``code``. The store may be gone already (node 0's agent left): no matter."""
        import shutil

        from workbook.grading.engine import STATE
        if STATE.tmpdir:                                   # os._exit skips its clean-up
            shutil.rmtree(STATE.tmpdir, ignore_errors=True)
        if code and self.rank == 0:
            print(f"(exit {code}: torchrun's own ChildFailedError follows; it only names the "
                  f"rank that carried this status, the report above is the one to read)",
                  file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        mine = 0 if self.local_rank else code
        threading.Timer(EXIT_WITHIN_S, os._exit, (mine,)).start()   # whatever the store does
        peers = range(self.rank + 1, self.rank + self.local_world)   # torchrun: a node's ranks
        try:
            store = self.watchdog.store()
            if self.local_rank != 0:
                store.set(f"workbook/left/{self.rank}", "1")
                os._exit(0)
            _wait_keys(store, [f"workbook/left/{r}" for r in peers], 10.0)
        except Exception:                                  # noqa: BLE001 - leaving anyway
            pass
        time.sleep(0.3 * (self.local_rank == 0))
        os._exit(mine)


def _wait_keys(store, keys: list[str], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if not keys or store.check(keys):
                return True
        except Exception:                                  # noqa: BLE001 - the store is gone
            return False
        time.sleep(0.05)
    return False


class Watchdog(threading.Thread):
    """Ends a check that stopped progressing (a hang) or runs past its wall limit: the per-rank
    report, then exit status 2 (see the module docstring)."""

    def __init__(self, job: JobRanks):
        super().__init__(daemon=True, name="workbook-watchdog")
        self.job, self._store = job, None
        self.armed_at = self.timeout = self.wall = None
        self.beat = 0
        self.heard: dict[int, tuple] = {}     # rank -> (its last beat or None, when it changed)

    def store(self):
        """A store client of the watchdog's own: the main thread may be blocked inside the job's
        client (waiting for the other ranks' outcomes) when the watchdog must talk."""
        if self._store is None:
            from datetime import timedelta

            import torch.distributed as dist
            self._store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                        is_master=False, timeout=timedelta(seconds=10))
        return self._store

    def arm(self, timeout: float, wall: float) -> None:
        self.timeout, self.wall = timeout, wall
        self.armed_at = time.monotonic()

    def disarm(self) -> None:
        self.armed_at = None

    def run(self) -> None:
        last_events, last_cpu, last_progress = None, [], time.monotonic()
        while True:
            time.sleep(BEAT_S)
            armed_at = self.armed_at
            if armed_at is None:
                last_events = None
                continue
            try:
                states = self._exchange()
            except Exception:                          # noqa: BLE001 - the store is gone: leaving
                continue
            now = time.monotonic()
            events = [s.get("events") for s in states]
            cpu = [s.get("cpu", 0.0) for s in states]
            computing = last_events is not None and any(     # CPU since the last progress mark
                s.get("state") not in ("in", "done") and c - before >= CPU_BUSY_S
                for s, c, before in zip(states, cpu, last_cpu))
            if events != last_events or computing:
                last_progress, last_cpu = now, cpu
            last_events = events
            if now - max(last_progress, armed_at) > self.timeout:
                self.fire("hang")
            elif now - armed_at > self.wall:
                self.fire("wall")

    def _exchange(self) -> list[dict]:
        """Post this rank's flight-recorder state; read every rank's (a rank not posted yet:
        starting)."""
        from workbook.runtime import flight
        job, store = self.job, self.store()
        self.beat += 1
        store.set(f"workbook/beat/{job.rank}",
                  json.dumps(dict(flight.RECORDER.state, cpu=time.process_time(), beat=self.beat)))
        keys = [f"workbook/beat/{r}" for r in range(job.world)]
        states = [json.loads(store.get(k)) if store.check([k]) else {"state": "starting"}
                  for k in keys]
        now = time.monotonic()
        for r, s in enumerate(states):                 # a rank never heard of: since now
            if r not in self.heard or self.heard[r][0] != s.get("beat"):
                self.heard[r] = (s.get("beat"), now)
        return states

    def gone(self) -> set[int]:
        """The ranks whose watchdog has not posted for the hang's timeout, less the beat it is
        seen at (at least 2 beats): their process, or their node, is gone, and waiting for their
        last call would only delay the report (a killed host: ``test_multinode.py``)."""
        quiet, now = max(self.timeout - BEAT_S, 2 * BEAT_S), time.monotonic()
        return {r for r, (_, seen) in self.heard.items() if now - seen >= quiet}

    def fire(self, why: str) -> None:
        from workbook.runtime import flight
        from workbook.grading.engine import STATE
        job = self.job
        threading.Timer(EXIT_WITHIN_S, os._exit, (0 if job.local_rank else 2,)).start()
        store = self.store()
        store.set(f"workbook/hang/{job.rank}", json.dumps(flight.RECORDER.state))
        if job.rank != 0:
            _wait_keys(store, ["workbook/hang/reported"], 10.0)
            job.finish(2)
        keys = [f"workbook/hang/{r}" for r in range(job.world)]
        gone = self.gone()
        _wait_keys(store, [k for r, k in enumerate(keys) if r not in gone], ANSWER_S)
        slots = [json.loads(store.get(k)) if store.check([k]) else {"state": "no answer"}
                 for k in keys]
        silent = [r for r, s in enumerate(slots) if s["state"] == "no answer"]
        for r in silent:                     # a rank that is gone: what it last said it was doing
            beat = f"workbook/beat/{r}"
            if store.check([beat]):
                slots[r] = dict(json.loads(store.get(beat)), heard=True)
        if STATE.before_report:
            STATE.before_report()
        sys.stdout.flush()
        headline = None if why == "hang" else (
            f"still running after {self.wall:.0f} s, though the ranks kept making progress: a "
            f"slow machine or an endless loop?")
        tag = "HANG " if why == "hang" else "SLOW "
        print(f"  {tag} {STATE.current or 'a check'}\n        "
              + flight.hang_report(slots, self.timeout, headline=headline).replace("\n", "\n        "),
              file=sys.stderr, flush=True)
        if silent:
            heard = any(slots[r].get("heard") for r in silent)
            print(f"        rank{'s' * (len(silent) > 1)} {', '.join(map(str, silent))} did not "
                  f"answer: the process (or its node) is gone"
                  f"{' (above: what it last said it was doing)' if heard else ''}.",
                  file=sys.stderr, flush=True)
        print("The job ends here; no rank is left running.", file=sys.stderr, flush=True)
        store.set("workbook/hang/reported", "1")
        job.finish(2)
