"""Capturing traces: one PyTorch-profiler Chrome trace per rank, plus the simulated link's track.

Inside a rank (a lab's self-check, a benchmark, a notebook cell run through the launcher)::

    with rank_trace(run_dir, lab="tp"):
        step()

writes ``run_dir/rank{r}.trace.json`` on every rank and ``run_dir/run.json`` (lab, world size,
backend, link, hardware) from rank 0. The profiler records CPU activity, and on a rank whose
tensors live on a GPU the CUDA kernels too (NCCL's on their own stream, beside the compute).
On a simulated link it sees only gloo's real, tiny transfers, so the capture adds what the link
modelled as a track of its own: a thread named ``link`` with one span per
operation (name, bytes, modelled time), placed where the link carried it. Time spent *waiting*
for the link shows on the compute thread as ``link_wait:<op>`` ranges (``workbook.link``), and
where an op's real transfer finished after its modelled end (a peer issued it late), a thread
``link: peers late`` holds a span from the modelled end to the real finish: rank skew, drawn and
counted apart from the communication itself (``Metrics.skew_us``).

Clocks: the profiler stamps events with its own clock, the link with ``time.perf_counter_ns``.
Marker ranges recorded around known ``perf_counter_ns`` reads tie the two together (the
shortest of several, at its middle: ``_clock_offset``).

Steps: a trace that holds two builds of a comparison (vanilla TP, then Domino) marks each as a
step of its own with ``traced_step(n)``, a ``ProfilerStep#n`` range (what ``prof.step()``
records under a profiler schedule), so that the analysis gives each build its own figures
(``workbook trace summary --step n``) instead of averaging them, and the report draws the split::

    with rank_trace(run_dir, lab="domino"):
        with traced_step(0), record_function("vanilla TP step"):
            ...
        dist.barrier()                    # between two steps: part of neither
        with traced_step(1), record_function("Domino step"):
            ...
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

# Kineto (the profiler's C++ side) prints "profiler_start"/"profiler_stop" lines on stderr at
# every capture; read when the profiler first starts, so setting it here is early enough.
# Export KINETO_LOG_LEVEL=0 to see its messages again.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")
from torch.profiler import ProfilerActivity, profile, record_function

from workbook import link
from workbook.runtime import ranks
from workbook.trace.classify import CAPTURE_MARKERS, STEP_PREFIX

# empty ranges the analysis sets aside (classify.CAPTURE_MARKERS): not the rank's compute
WARMUP_MARKER, SYNC_MARKER = CAPTURE_MARKERS


_AGREED = [0]


def _agree(key: str, make) -> str:
    """A value rank 0 makes and every rank reads (through the rendezvous store)."""
    if not dist.is_initialized():
        return make()
    _AGREED[0] += 1                       # every rank counts its calls alike: a fresh key each time
    key = f"{key}/{_AGREED[0]}"
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() == 0:
        store.set(key, make())
    return store.get(key).decode()




def profiled_device() -> torch.device:
    """The device a trace records: inside a launched rank, the rank's own (``ranks.device()``: a
    CPU rank on a GPU machine is a CPU rank); in a plain script, the GPU when there is one."""
    if ranks.inside_rank():
        return ranks.device()
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def hardware() -> str:
    dev = profiled_device()
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def run_metadata(lab: str, run_id: str) -> dict:
    lk = link.current_link()
    backend = dist.get_backend() if dist.is_initialized() else "none"
    return {"run_id": run_id, "lab": lab,
            "world_size": dist.get_world_size() if dist.is_initialized() else 1,
            "backend": "gloo" if link.is_link_backend(backend) else backend,
            "link": lk.describe() if lk else {"preset": "none", "simulated": False},
            "hardware": hardware(), "torch": torch.__version__, "created": time.time()}


@contextmanager
def traced_step(n: int):
    """Mark the enclosed code as step ``n`` of the trace being captured: a ``ProfilerStep#n``
    range (``workbook.trace.classify``'s step marker). Number the builds of a comparison in the
    order they run; code between two steps belongs to neither (see the module docstring)."""
    with record_function(f"{STEP_PREFIX}{n}"):
        yield


#: The thread on which the late-peer spans are drawn.
LATE_TID = "link: peers late"


def link_events(records, pid, offset_us: float, since_ns: int) -> list[dict]:
    """The link's operations as Chrome-trace spans on a thread named ``link``.

    An op whose real gloo transfer finished after its modelled end (a peer issued it late, or
    loopback gloo was slower than the model) also gets a span from the modelled end to the real
    finish on a second thread, ``link: peers late``: the rank skew the analysis sets apart.
    Ops logged with no link modelled (``link.measure_real_ops``: GPU ranks on gloo) are drawn as
    they really ran, from issue to completion (``args.measured``)."""
    events = [{"ph": "M", "name": "thread_name", "pid": pid, "tid": "link", "args": {"name": "link"}},
              {"ph": "M", "name": "thread_name", "pid": pid, "tid": LATE_TID,
               "args": {"name": LATE_TID}}]
    for r in records:
        end = r.arrival_ns if r.measured else r.end_ns     # measured: as it really ran
        if end < since_ns or r.link_ns == 0:
            continue
        how = {"measured": True} if r.measured else {"modelled_us": r.modelled_ns / 1000}
        events.append({"ph": "X", "cat": "link", "name": r.op, "pid": pid, "tid": "link",
                       "ts": r.start_ns / 1000 + offset_us, "dur": r.link_ns / 1000,
                       "args": {"bytes": r.size_bytes, "seq": r.seq, "group_size": r.group_size,
                                "ranks": list(r.ranks),
                                **how, "async": r.async_op,
                                **({"recv_bytes": r.recv_bytes, "split_bytes": r.split_bytes}
                                   if r.op == "all_to_all" else {}),
                                "issued_ts": r.issued_ns / 1000 + offset_us}})
        if not r.measured and r.arrival_ns > r.end_ns:
            events.append({"ph": "X", "cat": "link_late", "name": f"{r.op}: peers late",
                           "pid": pid, "tid": LATE_TID, "ts": r.end_ns / 1000 + offset_us,
                           "dur": (r.arrival_ns - r.end_ns) / 1000, "args": {"seq": r.seq}})
    return events


class _Profile(profile):
    """``torch.profiler.profile`` that does not import ``torch._inductor`` on CPU.

    Starting a profiler runs ``hasattr(torch, "_inductor")``, which imports the compiler
    (torch._inductor and torch._dynamo: about 40 MB and 2 s of CPU in every rank that traces)
    only to read a CUDA-graphs flag. Without CUDA activity and with the compiler not imported
    yet, the attribute is reported missing while the profiler starts, as if torch had no
    compiler; everything else is torch's own ``prepare_trace``."""

    def prepare_trace(self) -> None:
        lazy = getattr(torch, "__getattr__", None)
        if (ProfilerActivity.CUDA in self.activities or "torch._inductor" in sys.modules
                or lazy is None):
            return super().prepare_trace()

        def no_compiler(name):
            if name == "_inductor":
                raise AttributeError(name)
            return lazy(name)
        torch.__getattr__ = no_compiler
        try:
            super().prepare_trace()
        finally:
            torch.__getattr__ = lazy


_PROFILER_WARM = False


def _warm_up_profiler(activities) -> None:
    """The first profiler session of a process is slow to start and stop (hundreds of ms):
    pay for it once, outside any traced region, so the first traced step looks like the rest."""
    global _PROFILER_WARM
    if not _PROFILER_WARM:
        with _Profile(activities=activities):
            torch.ones(1).add_(1)
        _PROFILER_WARM = True


SYNC_TRIES = 5


def _clock_offset(events: list[dict], sync_ns: list[int]) -> tuple[int, float]:
    """``(pid, offset)``: the profiler's pid and its clock minus the host's, in µs, from the
    sync markers (each a ``record_function`` range around one ``perf_counter_ns`` read).

    The read lies somewhere inside its marker's range: a rank descheduled between the two (a
    loaded machine: milliseconds) would shift every link span by that much against the
    profiler's events, and a receive of the next phase could be drawn inside the previous one.
    So the shortest of several markers is used, at its middle: the error is at most half its
    length (microseconds)."""
    markers = sorted((e for e in events if e.get("name") == SYNC_MARKER and e.get("ph") == "X"),
                     key=lambda e: e["ts"])
    if not markers:
        return os.getpid(), 0.0
    pairs = list(zip(markers, sync_ns)) if len(markers) == len(sync_ns) else \
        [(markers[0], sync_ns[0])]
    marker, read_ns = min(pairs, key=lambda pair: pair[0].get("dur", 0.0))
    return marker["pid"], marker["ts"] + marker.get("dur", 0.0) / 2 - read_ns / 1000


@contextmanager
def rank_trace(run_dir, *, lab: str = "", run_id: str | None = None):
    """Profile the enclosed code on this rank; see the module docstring."""
    run_dir = Path(run_dir)
    rank = dist.get_rank() if dist.is_initialized() else 0
    run_id = run_id or _agree("workbook/run_id", lambda: uuid.uuid4().hex[:12])
    run_dir.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU]
    on_gpu = torch.cuda.is_available() and profiled_device().type == "cuda"
    if on_gpu:                            # kernels, NCCL's included, on their CUDA streams
        activities.append(ProfilerActivity.CUDA)
    _warm_up_profiler(activities)
    started_ns = time.perf_counter_ns()
    with _Profile(activities=activities) as prof:
        with record_function(WARMUP_MARKER):
            pass
        sync_ns = []                      # the host clock read inside each sync marker
        for _ in range(SYNC_TRIES):
            with record_function(SYNC_MARKER):
                sync_ns.append(time.perf_counter_ns())
        yield prof
        if on_gpu:                        # every kernel launched inside the block has ended
            torch.cuda.synchronize()
    # wait out the link so every op issued inside the block has its final place on the track
    records = link.op_log()
    raw = run_dir / f".rank{rank}.raw.json"
    prof.export_chrome_trace(str(raw))
    trace = json.loads(raw.read_text())
    raw.unlink()
    events = trace["traceEvents"]
    pid, offset_us = _clock_offset(events, sync_ns)
    events.extend(link_events(records, pid, offset_us, started_ns))
    trace.setdefault("distributedInfo", {"rank": rank, "world_size": dist.get_world_size()
                                         if dist.is_initialized() else 1,
                                         "backend": run_metadata(lab, run_id)["backend"]})
    trace["workbook"] = {"run_id": run_id, "lab": lab, "rank": rank}
    (run_dir / f"rank{rank}.trace.json").write_text(json.dumps(trace))
    if rank == 0:
        (run_dir / "run.json").write_text(json.dumps(run_metadata(lab, run_id), indent=2))
