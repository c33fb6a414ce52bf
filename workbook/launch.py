"""The rank launcher: run one function on N ranks, from a notebook, a test, the CLI or torchrun.

Three ways in, one code path for the lab:

* ``run(fn, world_size=4)`` spawns 4 rank processes on this machine, runs ``fn()`` on each and
  returns the 4 results (a list indexed by rank);
* ``RankPool(4)`` keeps 4 rank processes alive so that each further ``pool.run(fn)`` costs
  milliseconds instead of the seconds it takes to start Python and import torch (the test suite
  and notebooks use ``shared_pool``);
* ``main(fn)`` at the bottom of a lab file: under ``torchrun`` it joins the job described by
  RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT; run as a plain script it starts the
  ranks itself. Either way ``fn`` sees an initialised default process group.

What the launcher promises (each has a test in tests/package/test_launch.py):

* backend: gloo on CPU (through the simulated link, see ``workbook.link``), NCCL with one GPU
  per rank when asked for or when enough GPUs exist;
* ports: the rendezvous store listens on a port the OS picks, so parallel runs never collide;
* failure: when a rank raises, the caller gets *that* rank's exception and traceback, not the
  "connection closed" its peers see next; surviving ranks are stopped, nothing is left running;
* hangs: after ``timeout`` seconds the caller gets ``RanksTimedOut`` with the flight recorder's
  report of the last collective each rank entered.
"""
from __future__ import annotations

import atexit
import os
import pickle
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import get_context
from multiprocessing.connection import wait as wait_for_pipes
from multiprocessing.shared_memory import SharedMemory

import cloudpickle

DEFAULT_TIMEOUT = 120.0
ERROR_GRACE_S = 3.0            # after a first error, how long peers get to report theirs


class RanksTimedOut(TimeoutError):
    """The ranks did not finish in time; the message holds the per-rank hang report."""


class RankFailed(RuntimeError):
    """A rank raised an exception that could not be sent back as itself."""


class RemoteTraceback(Exception):
    """Carries a rank's formatted traceback as the ``__cause__`` of the re-raised exception."""

    def __str__(self):
        return "\n" + self.args[0]


@dataclass
class RankContext:
    """What a rank function may ask about where it runs (``workbook.launch.context()``)."""
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: str


_CONTEXT: RankContext | None = None


def context() -> RankContext:
    if _CONTEXT is None:
        raise RuntimeError("not inside a rank: call this from a function started by workbook.launch")
    return _CONTEXT


def device():
    """The torch device of this rank: ``cuda:LOCAL_RANK`` on NCCL, else ``cpu``."""
    import torch
    return torch.device(context().device)


# --------------------------------------------------------------------------- choosing
def gpu_count() -> int:
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def choose_backend(backend: str | None, local_world_size: int, link: str | None = "none") -> str:
    """``None`` means NCCL if every local rank can have its own GPU, else gloo."""
    from workbook.link import preset_names
    if link not in (None, *preset_names()):
        raise ValueError(f"unknown link preset {link!r}: choose one of {', '.join(preset_names())}")
    if local_world_size < 1:
        raise ValueError(f"--nproc must be at least 1 (got {local_world_size})")
    gpus = gpu_count()
    if backend is None:
        backend = "nccl" if gpus >= local_world_size and link in (None, "none") else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"unknown backend {backend!r}: use gloo (CPU) or nccl (one GPU per rank)")
    if backend == "nccl":
        if gpus < local_world_size:
            raise ValueError(f"backend nccl needs one GPU per rank: {local_world_size} ranks but "
                             f"{gpus} GPU(s) visible; use --backend gloo or fewer ranks")
        if link not in (None, "none"):
            raise ValueError("the simulated link runs on gloo (CPU); on GPUs the real interconnect "
                             "is measured: drop --link or use --backend gloo")
    return backend


def _threads_per_rank(local_world_size: int) -> int:
    return max(1, (os.cpu_count() or 1) // local_world_size)


# --------------------------------------------------------------------------- inside a rank
def _init_rank(rank, world_size, local_rank, backend, store, generation, timeout_s):
    """Initialise torch.distributed in this process (the part spawned ranks and torchrun share)."""
    global _CONTEXT
    import warnings
    import torch
    import torch.distributed as dist
    from workbook import flight, link

    warnings.filterwarnings("ignore", message=r".*is deprecated. Please use `torch.distributed")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        dev, pg_backend = f"cuda:{local_rank}", "nccl"
    else:
        dev, pg_backend = "cpu", link.BACKEND_NAME
        link.register()
    kwargs = dict(backend=pg_backend, rank=rank, world_size=world_size,
                  timeout=timedelta(seconds=timeout_s))
    if store is not None:
        kwargs["store"] = dist.PrefixStore(f"gen{generation}", store)
    if backend == "nccl":
        kwargs["device_id"] = torch.device(dev)
    dist.init_process_group(**kwargs)
    flight.RECORDER.install()
    _CONTEXT = RankContext(rank, world_size, local_rank, backend, dev)


def _set_link(preset: str, cache: dict) -> None:
    """All ranks agree on one calibration: rank 0 measures, the others read it from the store."""
    import torch.distributed as dist
    from workbook import link
    if preset in (None, "none") or context().backend == "nccl":
        link.set_link(None)
        return
    if preset not in cache:
        store = dist.distributed_c10d._get_default_store()
        key = f"workbook/flops/{preset}/{len(cache)}"
        if dist.get_rank() == 0:
            flops = float(os.environ.get(link.ENV_LOCAL_FLOPS, 0)) or link.measure_local_flops()
            store.set(key, repr(flops))
        cache[preset] = link.make_link(preset, float(store.get(key).decode()))
    link.set_link(cache[preset])


def _describe_error(rank: int, exc: BaseException) -> dict:
    import torch.distributed as dist
    text = "".join(traceback.format_exception(exc))
    secondary = isinstance(exc, getattr(dist, "DistBackendError", ())) or any(
        s in str(exc) for s in ("Connection closed by peer", "Connection reset", "Broken pipe",
                                "Socket Timeout", "Timed out waiting", "NCCL communicator was aborted"))
    try:
        payload = pickle.dumps(exc)
        pickle.loads(payload)
    except Exception:
        payload = None
    return {"rank": rank, "type": type(exc).__name__, "message": str(exc), "traceback": text,
            "secondary": secondary, "pickled": payload}


def _die_with_parent() -> None:
    """Linux: deliver SIGKILL to this rank when the launching process goes away."""
    try:
        import ctypes
        import signal
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except Exception:
        pass


def _rank_main(rank, world_size, backend, store_port, conn, shm_name, parent_path, env):
    """The loop of a spawned rank: initialise once, then run tasks until told to stop."""
    _die_with_parent()
    os.environ.update(env)
    sys.path[:] = parent_path
    import torch
    import torch.distributed as dist
    from workbook import flight, link

    torch.set_num_threads(_threads_per_rank(world_size))
    shm = SharedMemory(name=shm_name)
    flight.RECORDER.slot = shm.buf[rank * flight.SLOT_BYTES:(rank + 1) * flight.SLOT_BYTES]
    store = dist.TCPStore("127.0.0.1", store_port, world_size + 1, is_master=False,
                          timeout=timedelta(seconds=60))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size))
    links: dict = {}
    generation = 0
    try:
        _init_rank(rank, world_size, rank, backend, store, generation, DEFAULT_TIMEOUT)
        conn.send(("ready", None))
        while True:
            msg = conn.recv()
            if msg[0] == "close":
                break
            if msg[0] == "reinit":                    # after a failed task: a fresh group
                generation = msg[1]
                links.clear()
                if dist.is_initialized():
                    dist.destroy_process_group()
                _init_rank(rank, world_size, rank, backend, store, generation, DEFAULT_TIMEOUT)
                conn.send(("ready", None))
                continue
            _, task_id, payload, preset, timeout_s = msg
            flight.RECORDER.reset()
            try:
                fn, args, kwargs = cloudpickle.loads(payload)
                _set_link(preset, links)
                result = fn(*args, **kwargs)
                conn.send_bytes(pickle.dumps(("ok", task_id, result)))
            except BaseException as exc:              # noqa: BLE001 - every failure goes back
                report = _describe_error(rank, exc)
                try:                                  # unblock peers waiting on this rank
                    dist.destroy_process_group()
                except Exception:
                    pass
                link.set_link(None)
                conn.send_bytes(pickle.dumps(("err", task_id, report)))
    finally:
        flight.RECORDER.slot = None
        shm.close()


# --------------------------------------------------------------------------- the pool
class RankPool:
    """``world_size`` live rank processes that run task after task (see the module docstring)."""

    def __init__(self, world_size: int, backend: str | None = None, *, link: str = "none",
                 master_port: int | None = None, start_timeout: float = 120.0):
        import torch.distributed as dist
        from workbook import flight
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
        ctx = get_context("spawn")
        self._conns, self._procs = [], []
        env = {k: v for k, v in os.environ.items() if k.startswith(("WORKBOOK_", "CUDA", "NCCL"))}
        for rank in range(world_size):
            parent_end, child_end = ctx.Pipe()
            p = ctx.Process(target=_rank_main, daemon=True, name=f"workbook-rank{rank}",
                            args=(rank, world_size, self.backend, self._store.port, child_end,
                                  self._shm.name, list(sys.path), env))
            p.start()
            child_end.close()
            self._conns.append(parent_end)
            self._procs.append(p)
        self._task_id = 0
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
                self.close()
                raise RankFailed(f"rank {rank} exited while starting (exit code "
                                 f"{self._procs[rank].exitcode})") from None
            assert kind == "ready"

    def run(self, fn, *args, link: str = "none", timeout: float = DEFAULT_TIMEOUT, **kwargs) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank; return the results indexed by rank."""
        if self.closed:
            raise RuntimeError("this RankPool is closed")
        choose_backend(self.backend, self.world_size, link)
        self._task_id += 1
        payload = cloudpickle.dumps((fn, args, kwargs))
        try:
            return self._run_task(payload, link, timeout)
        except KeyboardInterrupt:               # a notebook's stop button: ranks are mid-task
            self.close(force=True)
            raise

    def _run_task(self, payload: bytes, link: str, timeout: float) -> list:
        for conn in self._conns:
            conn.send(("run", self._task_id, payload, link, timeout))
        results: dict[int, object] = {}
        errors: dict[int, dict] = {}
        deadline = time.monotonic() + timeout
        first_error_at = None
        pending = dict(enumerate(self._conns))
        while pending:
            limit = deadline if first_error_at is None else min(deadline, first_error_at + ERROR_GRACE_S)
            ready = wait_for_pipes(list(pending.values()), max(0.0, limit - time.monotonic()))
            if not ready:
                break
            for conn in ready:
                rank = self._conns.index(conn)
                try:
                    kind, task_id, value = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    code = self._procs[rank].exitcode
                    errors[rank] = {"rank": rank, "type": "RankFailed", "secondary": False,
                                    "message": f"rank {rank} died (exit code {code})",
                                    "traceback": "", "pickled": None}
                    pending.pop(rank)
                    continue
                pending.pop(rank)
                if kind == "ok":
                    results[rank] = value
                else:
                    errors[rank] = value
                    first_error_at = first_error_at or time.monotonic()
        if errors:
            self._recover(pending)
            raise _reraise(_primary(errors), self.world_size)
        if pending:
            from workbook import flight
            slots = [flight.read_slot(self._shm.buf[r * flight.SLOT_BYTES:(r + 1) * flight.SLOT_BYTES])
                     for r in range(self.world_size)]
            report = flight.hang_report(slots, timeout)
            self.close(force=True)
            raise RanksTimedOut(report)
        return [results[r] for r in range(self.world_size)]

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
        self._shm.close()
        try:
            self._shm.unlink()
        except FileNotFoundError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _primary(errors: dict[int, dict]) -> dict:
    """The error that caused the others: the first that is not a peer's "connection closed"."""
    real = [e for e in errors.values() if not e["secondary"]]
    return (real or list(errors.values()))[0]


def _reraise(err: dict, world_size: int) -> BaseException:
    exc = pickle.loads(err["pickled"]) if err.get("pickled") else RankFailed(
        f"rank {err['rank']} raised {err['type']}: {err['message']}")
    exc.__cause__ = RemoteTraceback(err["traceback"]) if err["traceback"] else None
    try:
        exc.add_note(f"(raised on rank {err['rank']} of {world_size})")
        exc.rank = err["rank"]
    except Exception:
        pass
    return exc


_POOLS: dict[tuple, RankPool] = {}


def shared_pool(world_size: int, backend: str | None = None) -> RankPool:
    """A pool kept for the life of this process (tests, notebooks); replaced if it broke."""
    key = (world_size, choose_backend(backend, world_size))
    pool = _POOLS.get(key)
    if pool is None or not pool.alive():
        pool = _POOLS[key] = RankPool(world_size, key[1])
    return pool


@atexit.register
def close_shared_pools() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


def run(fn, world_size: int = 2, *args, backend: str | None = None, link: str = "none",
        timeout: float = DEFAULT_TIMEOUT, pool: bool = False, master_port: int | None = None,
        **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` fresh ranks (or a shared pool) and return
    the per-rank results."""
    if pool:
        return shared_pool(world_size, backend).run(fn, *args, link=link, timeout=timeout, **kwargs)
    with RankPool(world_size, backend, link=link, master_port=master_port) as p:
        return p.run(fn, *args, link=link, timeout=timeout, **kwargs)


# --------------------------------------------------------------------------- torchrun
def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def init_from_env(backend: str | None = None, link: str = "none",
                  timeout: float = DEFAULT_TIMEOUT) -> RankContext:
    """Join the job torchrun describes in the environment (single- or multi-node)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    chosen = choose_backend(backend, local_world, link)
    import torch
    if chosen == "gloo":
        torch.set_num_threads(_threads_per_rank(local_world))
    _init_rank(rank, world, local_rank, chosen, None, 0, timeout)
    _set_link(link, {})
    return context()


def main(fn, *, default_nproc: int = 4, describe=None) -> list | None:
    """The ``__main__`` of every lab file: torchrun or a plain ``python lab.py --nproc N``.

    ``fn()`` runs on every rank and returns something printable; rank 0 prints the results
    (``describe(results)`` formats them when given)."""
    import argparse
    parser = argparse.ArgumentParser(description=(fn.__doc__ or "").strip().split("\n")[0])
    parser.add_argument("--nproc", type=int, default=default_nproc, help="ranks (ignored under torchrun)")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default=None)
    parser.add_argument("--link", default=os.environ.get("WORKBOOK_LINK", "none"))
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    opts = parser.parse_args()
    if under_torchrun():
        import torch.distributed as dist
        init_from_env(opts.backend, opts.link, opts.timeout)
        try:
            result = fn()
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, result)
        finally:
            dist.destroy_process_group()
        if int(os.environ["RANK"]) == 0:
            print(describe(gathered) if describe else gathered)
        return gathered
    results = run(fn, opts.nproc, backend=opts.backend, link=opts.link, timeout=opts.timeout)
    print(describe(results) if describe else results)
    return results
