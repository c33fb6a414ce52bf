"""Inside a rank of the pool: start once, then run task after task until told to stop.

``workbook.runtime.pool`` starts each rank process at ``_rank_main`` (from its fork server) and
talks to it over a pipe: ``("run", task, payload, link, timeout)`` runs a function sent by value,
``("reinit", generation)`` builds a fresh process group after a failure, ``("close",)`` ends the
rank. What a rank does to keep the launcher informed:

* its flight recorder writes into a slot of shared memory the launcher reads (the last call,
  and a count of calls entered and left: the launcher's measure of progress);
* an exception goes back as itself, with its traceback (``_describe_error``), after the rank
  tears its process group down so that peers blocked on it fail at once;
* a fatal signal cannot go back: ``_keep_evidence`` has ``faulthandler`` write the Python stack
  to a file of the rank's own, and standard error go to another, for
  ``workbook.runtime.rank_death`` to read;
* it dies with the launcher (``PR_SET_PDEATHSIG``) and gives freed memory back to the system
  after each task.
"""
from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
from datetime import timedelta
from multiprocessing.shared_memory import SharedMemory

import cloudpickle

from workbook.runtime.ranks import init_rank, set_link, threads_per_rank

PROCESS_GROUP_TIMEOUT_S = 3600.0   # the pool is the watchdog: gloo's own timeout never fires first


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


def release_freed_memory() -> None:
    """Give the heap that a finished task freed back to the system (glibc keeps it otherwise:
    a rank that once held a large model would go on holding its pages while it waits). A few
    milliseconds; nothing where the C library is not glibc."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        try:
            import ctypes
            _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


_MALLOC_TRIM = None


def _keep_evidence(rank: int, folder: str) -> None:
    """A fatal signal's Python stack into this rank's fault file; standard error into its own
    file (the launcher relays it after each run and reads it when the rank dies)."""
    import faulthandler

    from workbook.runtime.rank_death import fault_file, stderr_file
    global _FAULTS
    _FAULTS = open(fault_file(folder, rank), "w")          # kept open for faulthandler
    faulthandler.enable(_FAULTS, all_threads=True)
    sys.stderr.flush()
    fd = os.open(stderr_file(folder, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 2)
    os.close(fd)


_FAULTS = None


def _rank_main(rank, world_size, backend, store_port, conn, shm_name, parent_path, env, nnodes=1,
               evidence=None):
    """The loop of a spawned rank: initialise once, then run tasks until told to stop."""
    import gc
    gc.freeze()     # what the fork server imported stays shared: the collector never writes to it
    _die_with_parent()
    if evidence:
        _keep_evidence(rank, evidence)
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C is the launcher's to handle
    os.environ.update(env)
    sys.path[:] = parent_path
    import torch
    import torch.distributed as dist
    from workbook import link
    from workbook.runtime import flight

    torch.set_num_threads(threads_per_rank(world_size))
    shm = SharedMemory(name=shm_name)
    flight.RECORDER.slot = shm.buf[rank * flight.SLOT_BYTES:(rank + 1) * flight.SLOT_BYTES]
    store = dist.TCPStore("127.0.0.1", store_port, world_size + 1, is_master=False,
                          timeout=timedelta(seconds=60))
    per_node = world_size // nnodes                   # simulated nodes, numbered as torchrun does
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank % per_node),
                      LOCAL_WORLD_SIZE=str(per_node), GROUP_RANK=str(rank // per_node),
                      WORKBOOK_RANKS_HERE=str(world_size))
    links: dict = {}
    generation, exit_code = 0, 0
    try:
        init_rank(rank, world_size, rank, backend, store, generation, PROCESS_GROUP_TIMEOUT_S)
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
                init_rank(rank, world_size, rank, backend, store, generation, PROCESS_GROUP_TIMEOUT_S)
                conn.send(("ready", None))
                continue
            _, task_id, payload, preset, timeout_s = msg
            flight.RECORDER.reset()
            try:
                fn, args, kwargs = cloudpickle.loads(payload)
                set_link(preset, links)
                result = fn(*args, **kwargs)
                payload = pickle.dumps(("ok", task_id, result))
                fn = args = kwargs = result = None
                conn.send_bytes(payload)
            except BaseException as exc:              # noqa: BLE001 - every failure goes back
                report = _describe_error(rank, exc)
                try:                                  # unblock peers waiting on this rank
                    dist.destroy_process_group()
                except Exception:
                    pass
                link.set_link(None)
                conn.send_bytes(pickle.dumps(("err", task_id, report)))
            payload = None
            release_freed_memory()
    except BaseException:                             # noqa: BLE001 - start-up failed: say why
        traceback.print_exc()
        exit_code = 1
    finally:
        flight.RECORDER.slot = None
        shm.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)  # skip C++ teardown of live gloo threads ("terminate called ...")
