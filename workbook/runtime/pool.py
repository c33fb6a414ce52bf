"""A pool of live rank processes: start Python and torch once, then run check after check.

Starting a rank costs seconds (Python, then ``import torch``); a grader runs hundreds of small
distributed checks. ``RankPool(n)`` starts ``n`` rank processes once; each ``pool.run(fn)`` then
sends ``fn`` (by value, with cloudpickle, so notebook functions work) to every rank over a pipe
and collects the results, in milliseconds. What each rank does with them is
``workbook.runtime.rank_loop``; why a dead rank died, ``workbook.runtime.rank_death``.

Failure handling, the part learners meet most:

* a rank that raises sends back its exception and formatted traceback, then tears down its
  process group so that peers blocked on it fail fast; the caller gets the *first real* error
  (a peer's "connection closed" is secondary) with a note naming the rank;
* after a failure the ranks build fresh process groups (a new store prefix) in the same
  processes; a rank that died or never answered closes the pool instead;
* a hang is no progress, not a long run: when no rank has entered or left a collective,
  point-to-point operation or wait for ``timeout`` seconds, and every unfinished rank sits in
  one, the caller gets ``RanksTimedOut`` with the flight recorder's per-rank report, and every
  rank is killed. A run that keeps making progress is never a hang, however slow the machine;
  a separate, generous wall limit (``wall_limit``) ends one that runs for ever with
  ``RanksStillRunning`` ("a slow machine or an endless loop?");
* a rank that dies (a segfault, gloo's abort) is explained: each rank writes its Python stack
  on a fatal signal (``faulthandler``) and its standard error to files of its own, which
  ``workbook.runtime.rank_death`` reads into the message;
* ranks die with the launching process (``PR_SET_PDEATHSIG``), so nothing is left running.

The rendezvous store listens on a port the OS picks (port 0): parallel pools never collide.
"""
from __future__ import annotations

import atexit
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
from datetime import timedelta
from multiprocessing import get_context
from multiprocessing.connection import wait as wait_for_pipes
from multiprocessing.shared_memory import SharedMemory

import cloudpickle

from workbook.runtime.rank_loop import _rank_main
from workbook.runtime.ranks import choose_backend

DEFAULT_TIMEOUT = 60.0         # seconds without progress before a run is a hang (the report, not gloo's)
WALL_LIMIT_S = 600.0           # a run that progresses but never ends: stopped after this (times load)
POLL_S = 0.25                  # how often the launcher reads the ranks' flight-recorder slots
CPU_BUSY_S = 0.05              # CPU seconds that make a rank outside a call "computing" (see _computing)
# Imported once in the fork server, so that every rank shares these pages instead of importing
# its own copy: symbolic_shapes (and sympy, 30+ MB) is what torch imports on the first
# ``backward(gradient)`` of a rank, which most labs' checks make; torch._dynamo (1.2 CPU s a
# rank) what it imports on a rank's first optimizer step or ``record_function`` (a traced step),
# which most ranks of the graders make.
PRELOAD = ["torch", "torch.distributed", "torch.fx.experimental.symbolic_shapes", "torch._dynamo",
           "cloudpickle", "workbook.link", "workbook.runtime.flight", "workbook.runtime.ranks",
           "workbook.runtime.rank_loop"]


def _rank_start_context():
    """How rank processes start: a fork server that imported torch once (Linux), else spawn.

    Importing torch is most of a rank's start-up (seconds). The fork server pays it once and
    forks every later rank from there: no threads have started in it, so forking is safe."""
    import multiprocessing
    if os.environ.get("WORKBOOK_START_METHOD") == "spawn" or \
            "forkserver" not in multiprocessing.get_all_start_methods():
        return get_context("spawn")
    ctx = get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx
ERROR_GRACE_S = 3.0            # after a first error, how long peers get to report theirs


class RanksTimedOut(TimeoutError):
    """The ranks stopped making progress; the message holds the per-rank hang report."""


class RanksStillRunning(TimeoutError):
    """The ranks kept making progress but did not finish within the wall limit."""


def wall_limit(timeout: float) -> float:
    """The default wall limit of one run: ``WALL_LIMIT_S`` (at least ten no-progress timeouts),
    stretched by how overloaded this machine is right now (load average per core, at least 1),
    so that a correct but slow run on a busy machine is never stopped."""
    try:
        busy = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        busy = 1.0
    return max(WALL_LIMIT_S, 10 * timeout) * max(1.0, busy)


class RankFailed(RuntimeError):
    """A rank raised an exception that could not be sent back as itself."""


class RemoteTraceback(Exception):
    """Carries a rank's formatted traceback as the ``__cause__`` of the re-raised exception."""

    def __str__(self):
        return "\n" + self.args[0]


# --------------------------------------------------------------------------- the pool
class RankPool:
    """``world_size`` live rank processes that run task after task (see the module docstring)."""

    def __init__(self, world_size: int, backend: str | None = None, *, link: str = "none",
                 master_port: int | None = None, start_timeout: float = 120.0, nnodes: int = 1):
        import torch.distributed as dist
        from workbook.runtime import flight
        check_nodes(world_size, nnodes)
        self.backend = choose_backend(backend, world_size, link)
        self.world_size = world_size
        try:
            self._store = dist.TCPStore("127.0.0.1", master_port or 0, world_size + 1,
                                        is_master=True, timeout=timedelta(seconds=60),
                                        wait_for_workers=False)
        except Exception as exc:                      # noqa: BLE001
            raise ValueError(f"port {master_port} is already in use on 127.0.0.1: pass another "
                             f"master port or leave it unset to pick a free one ({exc})") from None
        self._shm = SharedMemory(create=True, size=world_size * flight.SLOT_BYTES)
        self._shm.buf[:] = b"\0" * len(self._shm.buf)
        self._evidence = tempfile.mkdtemp(prefix="workbook-ranks-")   # removed by close()
        self._stderr_at = [0] * world_size
        self._cpu: dict[int, float | None] = {}      # each rank's CPU seconds at its last mark
        ctx = _rank_start_context()
        self._conns, self._procs = [], []
        env = {k: v for k, v in os.environ.items() if k.startswith(("WORKBOOK_", "CUDA", "NCCL"))}
        for rank in range(world_size):
            parent_end, child_end = ctx.Pipe()
            p = ctx.Process(target=_rank_main, daemon=True, name=f"workbook-rank{rank}",
                            args=(rank, world_size, self.backend, self._store.port, child_end,
                                  self._shm.name, list(sys.path), env, nnodes, self._evidence))
            p.start()
            child_end.close()
            self._conns.append(parent_end)
            self._procs.append(p)
        self._task_id = 0
        self._busy = False           # the ranks are running a task this process waits on
        self._generation = 0
        self.closed = False
        self._await_ready(start_timeout)

    @property
    def port(self) -> int:
        return self._store.port

    def _await_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for rank, conn in enumerate(self._conns):
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                self.close()
                raise RanksTimedOut(f"rank {rank} did not start within {timeout:g} s")
            try:
                kind, _ = conn.recv()
            except EOFError:
                self._procs[rank].join(2)
                said = self._relay_stderr(rank, echo=False).strip()
                self.close()
                raise RankFailed(f"rank {rank} exited while starting (exit code "
                                 f"{self._procs[rank].exitcode})" +
                                 (f". It said:\n{said}" if said else "")) from None
            assert kind == "ready"

    def run(self, fn, *args, link: str = "none", timeout: float = DEFAULT_TIMEOUT,
            wall: float | None = None, **kwargs) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank; return the results indexed by rank.

        ``timeout``: seconds without progress before the run is a hang; ``wall``: seconds before
        a run that still progresses is stopped (default ``wall_limit(timeout)``)."""
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        if self.closed:
            raise RuntimeError("this RankPool is closed")
        choose_backend(self.backend, self.world_size, link)
        self._task_id += 1
        payload = cloudpickle.dumps((fn, args, kwargs))
        try:
            return self._run_task(payload, link, timeout, wall_limit(timeout) if wall is None else wall)
        except BaseException:
            if self._busy:     # interrupted mid-task (a notebook's stop button, a test's time
                self.close(force=True)   # limit): the ranks' late replies must answer no one
            raise

    def _run_task(self, payload: bytes, link: str, timeout: float, wall: float) -> list:
        self._busy = True
        for conn in self._conns:
            conn.send(("run", self._task_id, payload, link, timeout))
        results: dict[int, object] = {}
        errors: dict[int, dict] = {}
        started = last_progress = time.monotonic()
        events = self._events()
        first_error_at = None
        pending = dict(enumerate(self._conns))
        verdict = None                       # "hang" or "wall" when the run is stopped
        while pending:
            ready = wait_for_pipes(list(pending.values()), POLL_S)
            now = time.monotonic()
            for conn in ready:
                rank = self._conns.index(conn)
                try:
                    kind, task_id, value = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    errors[rank] = self._death(rank)
                    pending.pop(rank)
                    first_error_at = first_error_at or now
                    continue
                if task_id != self._task_id:       # a reply to an earlier task: not this one's
                    continue
                pending.pop(rank)
                last_progress = now
                if kind == "ok":
                    results[rank] = value
                else:
                    errors[rank] = value
                    first_error_at = first_error_at or now
            if not pending:
                break
            if first_error_at is not None and now > first_error_at + ERROR_GRACE_S:
                break
            seen = self._events()
            if seen != events or self._computing(pending):
                events, last_progress = seen, now
            if now - last_progress > timeout:
                verdict = "hang"
            elif now - started > wall:        # no progress for half of it: still a hang
                verdict = "hang" if now - last_progress > min(timeout, wall / 2) else "wall"
            if verdict:
                break
        self._busy = False
        self._relay_stderr()
        if errors:
            self._recover(pending)
            raise _reraise(_primary(errors), self.world_size)
        if pending:
            slots = [s if r in pending else {"state": "done"} for r, s in enumerate(self._slots())]
            self.close(force=True)
            from workbook.runtime import flight
            if verdict == "wall":
                raise RanksStillRunning(flight.hang_report(slots, timeout, headline=(
                    f"still running after {wall:.0f} s, though the ranks kept making progress: "
                    f"a slow machine or an endless loop? (--timeout S allows max(600, 10 S) s, "
                    f"more on a loaded machine).")))
            raise RanksTimedOut(flight.hang_report(slots, timeout))
        return [results[r] for r in range(self.world_size)]

    # -- what the ranks' slots and files say
    def _slots(self) -> list[dict]:
        from workbook.runtime import flight
        return [flight.read_slot(self._shm.buf[r * flight.SLOT_BYTES:(r + 1) * flight.SLOT_BYTES])
                for r in range(self.world_size)]

    def _events(self) -> list:
        return [s.get("events", 0) for s in self._slots()]

    def _computing(self, pending: dict) -> bool:
        """Whether an unfinished rank outside any call has used ``CPU_BUSY_S`` of CPU since it
        last counted as computing: it computes (slowly on a busy machine, where it gets a sliver
        of a core, or in an endless loop that the wall limit ends), which is progress. A rank
        that sleeps or blocks outside a call uses next to none. Counted from a mark, not per
        look, so a rank starved to a few milliseconds per look still shows it works."""
        slots, busy = self._slots(), False
        for r in pending:
            used = _cpu_seconds(self._procs[r].pid)
            mark = self._cpu.get(r)
            if used is None or mark is None or used - mark >= CPU_BUSY_S:
                self._cpu[r] = used
                busy |= slots[r].get("state") != "in" and mark is not None
        return busy

    def _relay_stderr(self, rank: int | None = None, echo: bool = True) -> str:
        """What the ranks wrote to standard error since the last relay, passed on to this
        process's (nothing a rank says is lost); returns it."""
        from workbook.runtime.rank_death import read_new, stderr_file
        said = []
        for r in range(self.world_size) if rank is None else (rank,):
            text, self._stderr_at[r] = read_new(stderr_file(self._evidence, r), self._stderr_at[r])
            if text:
                said.append(text)
                if echo:
                    sys.stderr.write(text)
        if said and echo:
            sys.stderr.flush()
        return "".join(said)

    def _death(self, rank: int) -> dict:
        """The error record of a rank whose pipe closed: it died. Why, from its files."""
        from workbook.runtime.rank_death import explain_death, fault_file, read_new, stderr_file
        proc = self._procs[rank]
        proc.join(2)                                   # reaped: its exit code is known
        faults, _ = read_new(fault_file(self._evidence, rank), 0)
        said, self._stderr_at[rank] = read_new(stderr_file(self._evidence, rank),
                                               self._stderr_at[rank])   # told here, not relayed
        message = explain_death(rank, proc.exitcode, faults, said, self._slots())
        return {"rank": rank, "type": "RankFailed", "secondary": False, "message": message,
                "traceback": "", "pickled": pickle.dumps(RankFailed(message))}

    def _recover(self, still_running: dict) -> None:
        """After a failure: fresh process groups in the same processes, or a closed pool."""
        if still_running or not all(p.is_alive() for p in self._procs):
            self.close(force=True)
            return
        self._generation += 1
        try:
            for conn in self._conns:
                conn.send(("reinit", self._generation))
            for conn in self._conns:
                if not conn.poll(30) or conn.recv()[0] != "ready":
                    raise EOFError
        except (EOFError, OSError):
            self.close(force=True)

    def alive(self) -> bool:
        return not self.closed and all(p.is_alive() for p in self._procs)

    def close(self, force: bool = False) -> None:
        """Stop every rank (politely unless ``force``, then by kill) and free the shared memory."""
        if self.closed:
            return
        self.closed = True
        for conn in self._conns:
            try:
                conn.send(("close",))
            except Exception:
                pass
        deadline = time.monotonic() + (0.0 if force else 2.0)
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        for conn in self._conns:
            conn.close()
        self._relay_stderr()
        shutil.rmtree(self._evidence, ignore_errors=True)
        self._shm.close()
        try:
            self._shm.unlink()
        except FileNotFoundError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _cpu_seconds(pid: int) -> float | None:
    """The CPU time process ``pid`` has used (Linux ``/proc``), or None where it cannot be read
    (then a rank outside a call always counts as computing: only the wall limit ends it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _primary(errors: dict[int, dict]) -> dict:
    """The error that caused the others: the first that is not a peer's "connection closed"."""
    real = [e for e in errors.values() if not e["secondary"]]
    return (real or list(errors.values()))[0]


def _reraise(err: dict, world_size: int) -> BaseException:
    exc = pickle.loads(err["pickled"]) if err.get("pickled") else RankFailed(
        err["message"] if err["type"] == "RankFailed" else
        f"rank {err['rank']} raised {err['type']}: {err['message']}")
    exc.__cause__ = RemoteTraceback(err["traceback"]) if err["traceback"] else None
    try:
        exc.add_note(f"(raised on rank {err['rank']} of {world_size})")
        exc.rank = err["rank"]
    except Exception:
        pass
    return exc


_POOLS: dict[tuple, RankPool] = {}


def check_nodes(world_size: int, nnodes: int) -> None:
    """``nnodes`` simulated nodes must split ``world_size`` ranks evenly (torchrun's rule)."""
    if nnodes < 1 or world_size % nnodes:
        raise ValueError(f"{world_size} ranks do not split into {nnodes} nodes of equal size: "
                         f"choose a number of nodes that divides the number of ranks")


def shared_pool(world_size: int, backend: str | None = None, *,
                max_live: int | None = None, nnodes: int = 1) -> RankPool:
    """A pool kept for the life of this process (tests, notebooks); replaced if it broke.

    ``max_live``: the most rank processes this process keeps alive at once; before a new pool
    starts, the pools used longest ago are closed until it fits (a pool starts from the fork
    server in a fraction of a second; a small grading machine has memory for few ranks)."""
    key = (world_size, choose_backend(backend, world_size), nnodes)
    pool = _POOLS.pop(key, None)                     # re-inserted last: the most recently used
    if pool is None or not pool.alive():
        if max_live is not None:
            for old in list(_POOLS):
                if sum(k[0] for k in _POOLS) + world_size <= max_live:
                    break
                _POOLS.pop(old).close()
        pool = RankPool(world_size, key[1], nnodes=nnodes)
    _POOLS[key] = pool
    return pool


@atexit.register           # after close_shared_pools: atexit runs the last registered first
def kill_fork_server(reap: bool = True) -> None:
    """Kill the fork server this process started, if any (at exit, and in ``stop_fork_server``).

    It holds nothing to save, and left to exit on its own when this process's end closes its
    pipe, it would tear torch and sympy down object by object: about a CPU second each, spent
    after this process has gone (every grading process, lesson kernel and ``workbook`` command
    that started ranks has one). ``reap``: wait for it here, so that no zombie waits for init
    (``stop_fork_server`` leaves that to multiprocessing's own stop, which must see it)."""
    from multiprocessing import forkserver
    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
            if reap:
                os.waitpid(pid, 0)
        except OSError:                    # gone already, or reaped (ChildProcessError)
            pass


@atexit.register
def close_shared_pools() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


def stop_fork_server() -> None:
    """Close every pool and stop the fork server and wait for it, so that nothing this process
    started is alive when it returns (``workbook run`` calls it before exiting). A later pool
    starts a new fork server."""
    close_shared_pools()
    from multiprocessing import forkserver, resource_tracker
    # killed (its own exit costs a CPU second and seconds of a loaded machine's wall clock
    # before `workbook run` returns), then _stop closes its pipe, reaps it and removes its
    # socket as after a plain exit
    kill_fork_server(reap=False)
    for server in (forkserver._forkserver, resource_tracker._resource_tracker):
        try:                           # both are stopped by closing their pipe, then waited for
            server._stop()
        except (AttributeError, OSError, ChildProcessError):
            pass
