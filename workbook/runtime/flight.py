"""The flight recorder: which collective each rank called, and which one it is stuck in.

A learner's most common distributed bug is a *mismatch*: rank 0 calls ``all_reduce`` while
rank 1 calls ``broadcast``, or one rank skips a ``recv``. Nothing crashes; every rank waits
forever. The recorder keeps, for each rank, the calls it made to ``torch.distributed`` (name,
tensor shapes, dtype, peer, sequence number) and writes the *last one entered* into a small
shared-memory slot that the launcher reads when a run times out, so the report can say::

    rank 0: in all_reduce #3 (float32[1024])  <- entered, never returned
    rank 1: in broadcast #3 (float32[1024], src=0)

It works on every backend (gloo, NCCL, the simulated link) because it wraps the module-level
functions of ``torch.distributed`` that lab code calls (``dist.all_reduce(...)``); the graders
also use its counts ("each rank sends exactly 2(N-1) messages").

Two more things the slot holds, for the watchdog and the report:

* ``events``: how many times the rank entered or left a call or a wait. The launcher calls a
  run a hang only when this count has stood still on every rank for the whole timeout while
  every unfinished rank sits inside a call: a slow machine still makes events, a hang does not;
* ``own``: whether the call was made by the check itself (a file of the grader: its reference
  ``all_reduce``, its ``barrier`` between phases) or by the code under test, so the report can
  say "the check's own barrier, waiting for rank 1, which is still in your reduce #2".
"""
from __future__ import annotations

import functools
import json
import sys
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

# Every public torch.distributed call that moves data, with the name of its peer argument.
RECORDED = {
    "broadcast": "src", "all_reduce": None, "reduce": "dst", "all_gather": None,
    "all_gather_into_tensor": None, "all_gather_single": None, "gather": "dst", "scatter": "src",
    "reduce_scatter": None, "reduce_scatter_tensor": None, "reduce_scatter_single": None,
    "all_to_all": None, "all_to_all_single": None, "barrier": None,
    "send": "dst", "recv": "src", "isend": "dst", "irecv": "src", "batch_isend_irecv": None,
}
SLOT_BYTES = 1024
P2P_NAMES = ("send", "recv", "isend", "irecv", "batch_isend_irecv")   # pairs, not collectives
#: Where the grader's own code lives: a call made from a file under one of these folders is the
#: check's own, not the learner's.
CHECK_FOLDERS = ("/tests/grading/", "/workbook/grading/")


@dataclass
class Call:
    """One call a rank made. ``size_bytes`` is the first tensor argument's size."""
    seq: int
    name: str
    shapes: list
    dtype: str
    size_bytes: int
    peer: int | None
    async_op: bool
    t_enter: float = field(default_factory=time.time)
    returned: bool = False
    own: bool = False               # made by the check itself, not by the code under test
    helper: str = ""                # made by a helper of this package (its name), for the learner
    at: str = ""                    # the line of the code under test that led to it, if any

    def describe(self) -> str:
        shapes = ", ".join(f"{self.dtype}{list(s)}" for s in self.shapes[:3])
        if len(self.shapes) > 3:
            shapes += f", ... {len(self.shapes)} tensors"
        peer = "" if self.peer is None else f", {RECORDED.get(self.name) or 'peer'}={self.peer}"
        inside = f" ({shapes}{peer})" if shapes or peer else ""
        return f"{self.name} #{self.seq}{inside}"


def _tensors(obj, out):
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _tensors(o, out)
    elif hasattr(obj, "tensor") and isinstance(getattr(obj, "tensor"), torch.Tensor):  # dist.P2POp
        out.append(obj.tensor)
    return out


class FlightRecorder:
    """Records this process's torch.distributed calls; see the module docstring."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.slot: memoryview | None = None
        self.state: dict = {"state": "idle"}    # what the slot holds, kept in-process too (torchrun)
        self.events = 0                           # calls and waits entered or left, ever
        self._depth = threading.local()
        self._installed = False

    # -- the record
    def reset(self) -> None:
        self.calls = []
        self._write({"state": "idle"})

    def counts(self) -> dict[str, dict[str, int]]:
        """``{name: {"count": n, "bytes": b}}`` over the calls since the last reset."""
        out: dict[str, dict[str, int]] = {}
        for c in self.calls:
            entry = out.setdefault(c.name, {"count": 0, "bytes": 0})
            entry["count"] += 1
            entry["bytes"] += c.size_bytes
        return out

    def _write(self, payload: dict) -> None:
        self.events += 1
        payload["events"] = self.events
        self.state = payload
        if self.slot is None:
            return
        data = json.dumps(payload).encode()[: SLOT_BYTES - 1]
        self.slot[:len(data)] = data
        self.slot[len(data):] = b"\0" * (SLOT_BYTES - len(data))

    # -- the wrapping
    def install(self) -> None:
        """Wrap the functions in RECORDED (idempotent, once per process)."""
        if self._installed:
            return
        for name in RECORDED:
            original = getattr(dist, name, None)
            if original is not None:
                setattr(dist, name, self._wrap(name, original))
        # dist.P2POp(dist.isend, ...) checks ``op in [isend, irecv]`` against c10d's own names,
        # and batch_isend_irecv tells sends from receives by identity: c10d must see the same
        # wrapped functions as learners do
        from torch.distributed import distributed_c10d as c10d
        for name in ("isend", "irecv"):
            if hasattr(c10d, name):
                setattr(c10d, name, getattr(dist, name))
        self._installed = True

    def _wrap(self, name, original):
        peer_arg = RECORDED[name]

        @functools.wraps(original)
        def recorded(*args, **kwargs):
            depth = getattr(self._depth, "n", 0)
            if depth:                                   # a call made by another recorded call
                return original(*args, **kwargs)
            tensors = _tensors(list(args[:2]) + [kwargs.get(k) for k in ("tensor", "tensor_list",
                               "output", "input", "output_tensor", "input_tensor", "p2p_op_list")], [])
            peer = kwargs.get(peer_arg) if peer_arg else None
            if peer is None and peer_arg and len(args) > 1 and isinstance(args[1], int):
                peer = args[1]
            first = tensors[0] if tensors else None
            call = Call(len(self.calls) + 1, name, [tuple(t.shape) for t in tensors],
                        str(first.dtype).replace("torch.", "") if first is not None else "",
                        first.numel() * first.element_size() if first is not None else 0,
                        peer, bool(kwargs.get("async_op")) or name in ("isend", "irecv",
                                                                       "batch_isend_irecv"),
                        **caller_of(sys._getframe(1)))
            self.calls.append(call)
            self._write(_entry("in", call, call.describe(), call.t_enter))
            self._depth.n = depth + 1
            try:
                result = original(*args, **kwargs)
            finally:
                self._depth.n = depth
            call.returned = True
            self._write(_entry("returned", call, call.describe(), call.t_enter))
            if name in ("isend", "irecv") and result is not None:
                return WaitOnce(result, self, call)
            if name == "batch_isend_irecv" and isinstance(result, list):
                return [WaitOnce(w, self, call) for w in result]
            if kwargs.get("async_op") and result is not None:   # a hang in its wait names it
                return WaitOnce(result, self, call)
            return result
        return recorded


class WaitOnce:
    """A work that may be waited on more than once, as NCCL's may: gloo's send and receive
    works block for ever on a second ``wait()`` (each wait takes one completion), which would
    turn a harmless extra wait in a learner's ring into a hang. While it waits, the rank's slot
    says so, so that a hang report names the wait (a peer that never sent, a collective some
    rank never started). Point-to-point works and asynchronous collectives' works are wrapped."""

    def __init__(self, work, recorder: "FlightRecorder", call: Call):
        self._work, self._recorder, self._call, self._done = work, recorder, call, False

    def wait(self, *args, **kwargs):
        if not self._done:
            c = self._call
            self._recorder._write(_entry("in", c, f"wait() on {c.describe()}", time.time()))
            self._work.wait(*args, **kwargs)
            self._recorder._write(_entry("returned", c, f"wait() on {c.describe()}", c.t_enter))
            self._done = True
        return True

    def __getattr__(self, name):
        return getattr(self._work, name)


def _entry(state: str, call: Call, text: str, t: float) -> dict:
    return {"state": state, "call": text, "name": call.name, "seq": call.seq, "t": t,
            "own": call.own, "helper": call.helper, "at": call.at}


_PACKAGE = __file__.replace("\\", "/").rsplit("/runtime/", 1)[0] + "/"     # .../workbook/


def caller_of(frame) -> dict:
    """Who made the call in ``frame``: ``{"own": True}`` for the grader's own files
    (``CHECK_FOLDERS``), ``{"helper": name}`` for a function of this package that the code under
    test calls (``all_reduce_sum``), else the code under test itself; with ``"at"``, the line of
    the code under test it came from (``dp_overlap.py:331, in start_gather``), if any."""
    name = source_file(frame) if frame is not None else ""
    out: dict = {}
    if any(folder in name for folder in CHECK_FOLDERS) and "/tests/grading/wrong/" not in name:
        out["own"] = True
    elif name.startswith(_PACKAGE):
        out["helper"] = frame.f_code.co_name
    for _ in range(12):                                # the nearest line of the code under test
        if frame is None:
            break
        if in_code_under_test(source_file(frame)):
            path = source_file(frame).rsplit("/", 2)
            out["at"] = f"{'/'.join(path[-2:])}:{frame.f_lineno}, in {frame.f_code.co_name}"
            break
        frame = frame.f_back
    return out


def source_file(frame) -> str:
    """The file a frame's code comes from. A function sent to a rank by value (cloudpickle) has
    lost its code's file name (``<dynamic-code>``) but kept its module's ``__file__``."""
    name = frame.f_code.co_filename
    if name.startswith("<"):
        name = frame.f_globals.get("__file__") or name
    return name.replace("\\", "/")


_LIBRARIES: tuple = ()


def in_code_under_test(path: str) -> bool:
    """Whether a source file is the code under test (a lab file, a notebook's cells are not
    files): neither Python's nor an installed package's, nor this package's, nor the grader's
    (a deliberately wrong lab under ``tests/grading/wrong/`` is code under test)."""
    global _LIBRARIES
    if not _LIBRARIES:
        import sysconfig
        paths = sysconfig.get_paths()
        _LIBRARIES = tuple({paths[k] for k in ("stdlib", "purelib", "platlib")})
    path = path.replace("\\", "/")
    if path.startswith("<") or not path.endswith(".py"):
        return False
    if "/tests/grading/wrong/" in path:
        return True
    return not (path.startswith(_LIBRARIES) or path.startswith(_PACKAGE)
                or any(folder in path for folder in CHECK_FOLDERS))


RECORDER = FlightRecorder()


def read_slot(buf) -> dict:
    raw = bytes(buf).split(b"\0", 1)[0]
    try:
        return json.loads(raw) if raw else {"state": "starting"}
    except ValueError:
        return {"state": "unknown"}


def _call(slot: dict) -> str:
    if slot.get("own"):
        return f"the check's own {slot['call']}"
    if slot.get("helper"):
        return f"{slot['call']}, made for you by the course's {slot['helper']}"
    return f"your {slot['call']}"


def describe_slot(slot: dict) -> str:
    """One rank's state in words: ``in your reduce #2 (...)``, ``in the check's own barrier
    #3``, ``outside any collective (the last it finished: ...)``."""
    state = slot.get("state")
    if state == "in":
        return f"in {_call(slot)}"
    if state == "returned":
        return f"outside any collective (the last it finished: {_call(slot)})"
    if state == "done":
        return "finished its part of the run"
    if state == "idle":
        return "outside any collective, with no call to torch.distributed yet in this run"
    return f"not started ({state})"


def hang_report(slots: list[dict], timeout: float, *, headline: str | None = None) -> str:
    """The message a learner reads when ranks stop making progress: the last call of every
    rank, whose it was (the check's or the learner's), and who is waiting for whom.

    ``timeout``: the seconds without progress that made this a hang. Every line ends in a
    sentence, so the report reads whole wherever it is cut into a note."""
    lines = [headline or f"no rank made progress for {timeout:g} s (no collective, point-to-point "
                         f"operation or wait was entered or left), so the run was stopped.",
             "The last call of each rank:"]
    now = time.time()
    for rank, s in enumerate(slots):
        waited = now - s["t"] if s.get("state") == "in" and "t" in s else 0.0
        since = f", for {waited:.1f} s" if waited >= 1 else ""
        at = f" (at {s['at']})" if s.get("at") and s.get("state") == "in" else ""
        lines.append(f"  rank {rank}: {describe_slot(s)}{at}{since}.")
    waiting = {r: s for r, s in enumerate(slots) if s.get("state") == "in"}
    checks = [r for r, s in waiting.items() if s.get("own")]
    others = [r for r in range(len(slots)) if r not in checks]
    if checks and others:                   # the grader's calls wait for the learner's ranks
        ranks = ", ".join(map(str, checks))
        who = "; ".join(f"rank {r} is {describe_slot(slots[r])}" for r in others)
        lines.append(f"  Rank{'s' * (len(checks) > 1)} {ranks} wait{'s' * (len(checks) == 1)} in "
                     f"the check's own calls for the other ranks to reach them: {who}.")
    collectives = [s for s in waiting.values() if s["name"] not in P2P_NAMES]
    if len({(s["name"], s["seq"]) for s in collectives}) == 1 and \
            len({s["call"] for s in collectives}) > 1:
        lines.append("  The ranks disagree on the tensors: every rank must pass the same shapes "
                     "and dtypes to a collective (or the sizes its peers expect).")
    elif len({(s["name"], s["seq"]) for s in collectives}) > 1:
        lines.append("  The ranks disagree: every rank must call the same collectives in the same "
                     "order (check branches on the rank and early returns).")
    elif waiting and len(waiting) < len(slots):
        lines.append("  Some ranks wait for peers that are busy elsewhere or never call it.")
    return "\n".join(lines)
