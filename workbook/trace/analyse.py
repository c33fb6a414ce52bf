"""Analysing a trace: step time, overlap, exposed communication, collectives.

The definitions
---------------
For one rank and one step, let *C* be the union of the communication
intervals, *P* the union of the compute intervals (minus the intervals in
which the compute thread was waiting) and *M* the union of memory copies
(see :mod:`workbook.trace.classify` for which span is which).  Then

* **step time** -- the length of the step's window (below);
* **compute time** = \\|P\\|, **communication time** = \\|C\\|;
* **overlap %** = 100 · \\|C ∩ P\\| / \\|C\\|: the share of communication time
  during which the same rank computes (any compute of the rank: a collective
  issued in one step may be hidden by kernels launched in the next).  This is Holistic Trace Analysis'
  *comm/comp overlap*.  It is ``None`` when there is no communication;
* **exposed communication** = \\|C\\| − \\|C ∩ P\\| = \\|C \\ P\\|: the
  communication nothing hides, the time that a better overlap could win back;
* **skew** = the part of the exposed communication that fell while a peer
  was late: the rank had issued an op, its modelled transfer was over, and
  the real operation could not finish until another rank issued it too
  (``link: peers late`` spans, CPU runs on the simulated link only).  That
  wait is set by the ranks' different speeds, not by the schedule, so
  **overlap % excluding skew** = 100 · (\\|C ∩ P\\| + skew) / \\|C\\| is
  what a schedule can be graded on.  A GPU trace has no such spans: skew
  there is part of the NCCL kernel and counts as communication, as in HTA;
* **late-peer time** = \\|L\\|, the union of the late-peer spans themselves.
  It is not a part of the communication time: a late-peer span starts where
  its op's modelled transfer ended, so only the *next* ops' transfers can
  fall inside it (skew).  A rank that issues one blocking op at a time has
  late-peer time (spent in the wait) and no skew;
* **idle time** = step time − \\|P ∪ C ∪ M\\|: nothing at all is running;
* **wait time** = the union of the compute thread's waits (CPU traces).

Steps
-----
``ProfilerStep#N`` ranges (written by ``prof.step()``, or by
:func:`workbook.trace.capture.traced_step` around each build of a comparison)
cut a trace into steps.  Each event belongs to the step in which it *started*
-- on a GPU, the step in which the host *launched* it (found through the CUDA
correlation id), because kernels run later than their launch.  A step's window
runs from the earlier of its marker's start and its first event to the later
of its marker's end and its last event's end, so an asynchronous collective
that spills into the next iteration is still counted once, in the step that
issued it.  An event that started outside every marker (before the first,
after the last, or in a gap between two: the barrier that lines the ranks up
between two traced builds) belongs to no step.  Without markers the whole
trace is one step.

Each step has a *label*: the names of the outermost user ranges that start
inside its marker (``"vanilla TP step"``), what the summary and the report
print beside its number.

The per-rank numbers of :func:`analyse` add up the selected steps (all of
them by default); ``RankMetrics.steps`` keeps each step's own, which is what a
trace holding two different builds needs: their sum averages two schedules
into a figure that is neither's.

Phases
------
A *phase* is a user ``record_function`` range, such as ``"forward"`` or
``"backward"``.  A collective belongs to the phase whose range contains its
start (its launch on a GPU) on the same rank.  ``within="backward"`` matches
ranges named exactly ``backward``, or else every range whose name contains
it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import intervals as iv
from .classify import (CAPTURE_MARKERS, COMM, COMPUTE, LATE, MEMCPY, STEP, WAIT, classify,
                       collective_of, is_phase_range, tracks_with)
from .load import Trace, TraceError, as_run


@dataclass
class Metrics:
    """Times in microseconds over one step (or the sum over several)."""
    step_us: float = 0.0
    compute_us: float = 0.0
    comm_us: float = 0.0
    overlap_us: float = 0.0
    exposed_comm_us: float = 0.0
    memcpy_us: float = 0.0
    wait_us: float = 0.0
    idle_us: float = 0.0
    skew_us: float = 0.0        # exposed communication while a peer was late (simulated link)
    late_us: float = 0.0        # late-peer time: the union of the late-peer spans
    collectives: dict = field(default_factory=dict)

    @property
    def overlap_pct(self) -> float | None:
        return 100.0 * self.overlap_us / self.comm_us if self.comm_us > 0 else None

    @property
    def overlap_pct_ex_skew(self) -> float | None:
        """Overlap % counting the exposed time a late peer caused as hidden: the schedule's own
        share, whatever the other ranks' speed."""
        if self.comm_us <= 0:
            return None
        return 100.0 * (self.overlap_us + self.skew_us) / self.comm_us

    def add(self, other: "Metrics") -> None:
        for k in ("step_us", "compute_us", "comm_us", "overlap_us", "exposed_comm_us",
                  "memcpy_us", "wait_us", "idle_us", "skew_us", "late_us"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        _merge_collectives(self.collectives, other.collectives)


@dataclass
class StepMetrics(Metrics):
    step: int = 0           # N of ProfilerStep#N (0 when the trace has no markers)
    start_us: float = 0.0   # window, relative to the trace's origin
    end_us: float = 0.0
    label: str = ""         # the outermost user ranges inside the step ("Domino step")

    def as_dict(self) -> dict:
        """One step's record in ``workbook trace summary --json`` (``"steps"`` of a rank)."""
        return {"step": self.step, "label": self.label, "step_us": _r(self.step_us),
                "compute_us": _r(self.compute_us), "comm_us": _r(self.comm_us),
                "overlap_us": _r(self.overlap_us),
                "overlap_pct": None if self.overlap_pct is None else _r(self.overlap_pct),
                "exposed_comm_us": _r(self.exposed_comm_us), "skew_us": _r(self.skew_us),
                "idle_us": _r(self.idle_us)}


@dataclass
class RankMetrics(Metrics):
    rank: int | None = None
    file: str = ""
    device: str = "cpu"
    steps: list = field(default_factory=list)

    def as_dict(self) -> dict:
        """The ``workbook trace summary --json`` record of this rank."""
        return {"rank": self.rank, "file": self.file, "device": self.device,
                "step_us": _r(self.step_us), "compute_us": _r(self.compute_us),
                "comm_us": _r(self.comm_us),
                "overlap_pct": None if self.overlap_pct is None else _r(self.overlap_pct),
                "exposed_comm_us": _r(self.exposed_comm_us), "idle_us": _r(self.idle_us),
                "collectives": {k: dict(v) for k, v in sorted(self.collectives.items())},
                "steps": [s.as_dict() for s in self.steps]}


def _r(x: float) -> float:
    return round(float(x), 3)


def _merge_collectives(into: dict, other: dict) -> None:
    for name, c in other.items():
        d = into.setdefault(name, {"count": 0, "bytes": 0})
        d["count"] += c["count"]
        d["bytes"] = None if d["bytes"] is None or c["bytes"] is None else d["bytes"] + c["bytes"]


# --------------------------------------------------------------------------
# Anchors, steps, phases
# --------------------------------------------------------------------------

def anchor_times(trace: Trace) -> np.ndarray:
    """When each event was *issued*: its host launch time for a GPU event
    whose launch is in the trace, else its own start."""
    cached = getattr(trace, "_anchor", None)
    if cached is not None:
        return cached
    anchor = trace.ts.copy()
    has = trace.corr >= 0
    if has.any() and trace.launch_corr.size:
        order = np.argsort(trace.launch_corr, kind="stable")
        lc, lt = trace.launch_corr[order], trace.launch_ts[order]
        idx = np.flatnonzero(has)
        pos = np.clip(np.searchsorted(lc, trace.corr[idx]), 0, lc.size - 1)
        hit = lc[pos] == trace.corr[idx]
        anchor[idx[hit]] = lt[pos[hit]]
    trace._anchor = anchor
    return anchor


def step_ranges(trace: Trace) -> list[tuple[int, float, float]]:
    """``(N, start, end)`` of every ``ProfilerStep#N`` marker, in time order;
    one pseudo-step ``(0, first start, last end)`` when there is none."""
    kinds = classify(trace)
    idx = np.flatnonzero(kinds == STEP)
    if idx.size == 0:
        useful = np.isin(kinds, (COMPUTE, COMM, MEMCPY, WAIT))
        sel = useful if useful.any() else np.ones(len(trace), bool)
        return [(0, float(trace.ts[sel].min()), float(trace.end[sel].max()))]
    out = []
    for i in idx[np.argsort(trace.ts[idx], kind="stable")]:
        name = trace.names[trace.name_id[i]]
        try:
            n = int(name.split("#", 1)[1])
        except (IndexError, ValueError):
            n = len(out)
        out.append((n, float(trace.ts[i]), float(trace.ts[i] + trace.dur[i])))
    return out


def _step_of_events(trace: Trace, steps) -> np.ndarray:
    """Index into ``steps`` of the step each event belongs to (-1: none: it started outside
    every marker, see the module docstring)."""
    a = anchor_times(trace)
    if len(steps) == 1 and steps[0][0] == 0 and not (classify(trace) == STEP).any():
        return np.zeros(len(trace), dtype=np.int64)
    starts = np.array([s for _, s, _ in steps])
    ends = np.array([e for _, _, e in steps])
    k = np.searchsorted(starts, a, side="right") - 1
    inside = k >= 0
    inside[inside] = a[inside] <= ends[k[inside]]
    k[~inside] = -1
    return k


_MAX_LABEL_NAMES = 3     # range names in a step's label, then "..."


def step_labels(trace: Trace, steps=None) -> list[str]:
    """Each step's label: the names of the outermost host-side user ranges that start inside
    its marker (the whole trace without markers), in time order, each once."""
    steps = step_ranges(trace) if steps is None else steps
    user = is_phase_range(trace) & (trace.cat_id != (trace.cats.index("gpu_user_annotation")
                                                    if "gpu_user_annotation" in trace.cats else -1))
    marker = np.array([n in CAPTURE_MARKERS for n in trace.names] or [False], bool)
    idx = np.flatnonzero(user & ~marker[trace.name_id])
    idx = idx[np.lexsort((-trace.end[idx], trace.ts[idx]))]          # by start, outer first
    starts = trace.ts[idx]
    out = []
    for _, s0, s1 in steps:
        names, reach = [], -np.inf
        lo, hi = np.searchsorted(starts, s0, "left"), np.searchsorted(starts, s1, "left")
        for i in idx[lo:hi].tolist():
            if trace.ts[i] >= reach:                                  # not inside an earlier one
                reach = trace.end[i]
                name = trace.names[trace.name_id[i]]
                if name not in names:
                    names.append(name)
                if len(names) > _MAX_LABEL_NAMES:
                    break
        more = ", ..." if len(names) > _MAX_LABEL_NAMES else ""
        out.append(", ".join(names[:_MAX_LABEL_NAMES]) + more)
    return out


def phase_ranges(trace: Trace, within: str) -> tuple[iv.Intervals, bool]:
    """The union of the user ranges matching ``within`` (exact name, else
    substring), and whether they are device-side ranges
    (``gpu_user_annotation``, used only when no host range matches)."""
    names = np.array(trace.names, dtype=object)
    exact = names[trace.name_id] == within
    hits = np.array([within.lower() in n.lower() for n in trace.names] or [False], bool)
    fuzzy = hits[trace.name_id]
    user = is_phase_range(trace)
    on_gpu = trace.cat_id == (trace.cats.index("gpu_user_annotation")
                              if "gpu_user_annotation" in trace.cats else -1)
    for mask, device in ((user & ~on_gpu & exact, False), (user & ~on_gpu & fuzzy, False),
                         (user & on_gpu & exact, True), (user & on_gpu & fuzzy, True)):
        if mask.any():
            return iv.union(trace.ts[mask], trace.end[mask]), device
    raise TraceError(f"{trace.path}: no record_function range named like {within!r} on "
                     f"{trace.label()}")


def _in_ranges(t: np.ndarray, ranges: iv.Intervals) -> np.ndarray:
    k = np.searchsorted(ranges[0], t, side="right") - 1
    ok = k >= 0
    ok[ok] = t[ok] <= ranges[1][k[ok]]
    return ok


# --------------------------------------------------------------------------
# The metrics
# --------------------------------------------------------------------------

def all_compute(trace: Trace) -> iv.Intervals:
    """When the rank computes, over the whole trace: the union of its compute
    spans minus the union of its waits."""
    cached = getattr(trace, "_compute", None)
    if cached is None:
        kinds = classify(trace)
        wait = iv.union(trace.ts[kinds == WAIT], trace.end[kinds == WAIT])
        cached = iv.subtract(iv.union(trace.ts[kinds == COMPUTE], trace.end[kinds == COMPUTE]), wait)
        trace._compute = cached
    return cached


def _metrics(trace: Trace, sel: np.ndarray, window: tuple[float, float] | None,
             comm_sel: np.ndarray | None = None) -> Metrics:
    """Metrics of the events in mask ``sel``; ``comm_sel`` optionally narrows
    which communication counts (phase queries).

    Whether communication is hidden is a question of physical concurrency, so
    overlap is measured against *all* of the rank's compute -- a collective
    issued in one step may be hidden by kernels launched in the next.
    """
    kinds = classify(trace)
    s, e = trace.ts, trace.end

    def u(mask):
        return iv.union(s[mask], e[mask])

    comm_mask = sel & (kinds == COMM) if comm_sel is None else comm_sel & (kinds == COMM)
    wait = u(sel & (kinds == WAIT))
    comp = iv.subtract(u(sel & (kinds == COMPUTE)), wait)
    comm = u(comm_mask)
    mem = u(sel & (kinds == MEMCPY))
    m = Metrics()
    m.compute_us = iv.measure(comp)
    m.comm_us = iv.measure(comm)
    m.overlap_us = iv.measure(iv.intersect(comm, all_compute(trace)))
    m.exposed_comm_us = m.comm_us - m.overlap_us
    late = kinds == LATE
    if late.any():
        m.skew_us = iv.measure(iv.intersect(iv.subtract(comm, all_compute(trace)),
                                            iv.union(s[late], e[late])))
        m.late_us = iv.measure(u(sel & late))
    m.memcpy_us = iv.measure(mem)
    m.wait_us = iv.measure(wait)
    busy = iv.join(iv.join(comp, comm), mem)
    if window is not None:
        m.step_us = window[1] - window[0]
        m.idle_us = max(0.0, m.step_us - iv.measure(iv.clip(busy, *window)))
    for i in np.flatnonzero(comm_mask).tolist():
        name = collective_of(trace, i)
        c = m.collectives.setdefault(name, {"count": 0, "bytes": 0})
        c["count"] += 1
        b = trace.nbytes[i]
        c["bytes"] = None if c["bytes"] is None or math.isnan(b) else c["bytes"] + int(b)
    return m


def step_metrics(trace: Trace) -> list[StepMetrics]:
    """The metrics of every step of one rank, in time order."""
    cached = getattr(trace, "_steps", None)
    if cached is not None:
        return cached
    kinds = classify(trace)
    steps = step_ranges(trace)
    which = _step_of_events(trace, steps)
    useful = np.isin(kinds, (COMPUTE, COMM, MEMCPY, WAIT))
    labels = step_labels(trace, steps)
    out = []
    for k, (n, s0, s1) in enumerate(steps):
        sel = useful & (which == k)
        lo = min(s0, float(trace.ts[sel].min())) if sel.any() else s0
        hi = max(s1, float(trace.end[sel].max())) if sel.any() else s1
        # late-peer spans count in the step they start in, but do not widen it
        m = _metrics(trace, sel | ((kinds == LATE) & (which == k)), (lo, hi))
        out.append(StepMetrics(**{f: getattr(m, f) for f in Metrics.__dataclass_fields__},
                               step=n, start_us=lo, end_us=hi, label=labels[k]))
    trace._steps = out
    return out


def _pick(obj, rank) -> Trace:
    if isinstance(obj, Trace):
        if rank is not None and obj.rank != rank:
            raise TraceError(f"{obj.path}: holds rank {obj.rank}, not rank {rank}")
        return obj
    run = as_run(obj)
    if rank is None:
        if len(run) != 1:
            raise TraceError(f"several ranks ({run.ranks}); say which with rank=")
        return run.traces[0]
    return run.rank(rank)


def _select_steps(trace: Trace, step) -> list[StepMetrics]:
    all_steps = step_metrics(trace)
    if step is None:
        return all_steps
    wanted = {step} if isinstance(step, int) else set(step)
    got = [s for s in all_steps if s.step in wanted]
    if not got:
        raise TraceError(f"{trace.path}: no step {step} (steps: {[s.step for s in all_steps]})")
    return got


def analyse(trace, rank: int | None = None, step=None) -> RankMetrics:
    """Per-rank metrics, summed over the chosen steps (``step``: an ``N`` of
    ``ProfilerStep#N`` or a list of them; all steps by default)."""
    t = _pick(trace, rank)
    out = RankMetrics(rank=t.rank, file=t.path, device=t.device_name)
    for s in _select_steps(t, step):
        out.add(s)
        out.steps.append(s)
    return out


def _phase_selection(t: Trace, within: str | None, step) -> np.ndarray:
    kinds = classify(t)
    sel = np.isin(kinds, (COMPUTE, COMM, MEMCPY, WAIT, LATE))
    if step is not None:
        steps = step_ranges(t)
        wanted = {step} if isinstance(step, int) else set(step)
        which = _step_of_events(t, steps)
        sel &= np.isin(which, [k for k, (n, _, _) in enumerate(steps) if n in wanted])
    if within is not None:
        ranges, device = phase_ranges(t, within)
        sel &= _in_ranges(t.ts if device else anchor_times(t), ranges)
    return sel


def collectives(trace, rank: int | None = None, within: str | None = None, step=None) -> dict:
    """``{name: {"count": n, "bytes": b}}`` of the collectives one rank ran,
    optionally only those issued inside the phase ``within`` (see module
    docstring) and/or in the chosen steps.  ``bytes`` is ``None`` when some
    event of that collective did not record its size."""
    t = _pick(trace, rank)
    if within is None and step is None:
        return analyse(t).collectives
    sel = _phase_selection(t, within, step)
    return _metrics(t, sel & (classify(t) == COMM), None).collectives


def overlap(trace, rank: int | None = None, within: str | None = None, step=None) -> Metrics:
    """Communication, overlap and exposed time of one rank.  With ``within``,
    only the communication issued in that phase counts, and it is compared
    against *all* of the rank's compute (compute after the phase ends may
    still hide a collective the phase started)."""
    t = _pick(trace, rank)
    kinds = classify(t)
    everything = _phase_selection(t, None, step)
    comm_sel = _phase_selection(t, within, step) & (kinds == COMM)
    return _metrics(t, everything, None, comm_sel=comm_sel)


def overlap_pct(trace, rank: int | None = None, within: str | None = None, step=None) -> float | None:
    """Share (0-100) of one rank's communication time hidden behind its
    compute; ``None`` when it did not communicate."""
    return overlap(trace, rank, within, step).overlap_pct


def exposed_comm_us(trace, rank: int | None = None, within: str | None = None, step=None) -> float:
    """Communication time (µs) not hidden behind compute."""
    return overlap(trace, rank, within, step).exposed_comm_us


def kernel_streams(trace, rank: int | None = None) -> list[dict]:
    """The CUDA streams of one rank (GPU traces): per stream, how many kernels of each kind ran
    on it and how long it was busy with them (µs, the union of the kernels' spans).

    This is where overlap on a GPU comes from: NCCL runs its kernels on a stream of its own, so a
    collective can be hidden only by compute kernels on *other* streams, running at the same
    time.  ``[{"device", "stream", "name", "comm_kernels", "comm_us", "compute_kernels",
    "compute_us", "memcpy_kernels", "memcpy_us"}]`` in stream order; ``[]`` for a CPU trace."""
    t = _pick(trace, rank)
    kinds = classify(t)
    device_cats = [i for i, c in enumerate(t.cats) if c in ("kernel", "gpu_memcpy", "gpu_memset")]
    on_device = np.isin(t.cat_id, device_cats)
    out = []
    for tr in tracks_with(t, on_device):
        track = t.tracks[tr]
        row = {"device": track.pid, "stream": track.tid, "name": track.name}
        for kind, label in ((COMM, "comm"), (COMPUTE, "compute"), (MEMCPY, "memcpy")):
            mask = on_device & (t.track_id == tr) & (kinds == kind)
            row[f"{label}_kernels"] = int(mask.sum())
            row[f"{label}_us"] = iv.measure(iv.union(t.ts[mask], t.end[mask]))
        out.append(row)
    return sorted(out, key=lambda r: [(isinstance(x, str), x if isinstance(x, int) else str(x))
                                      for x in (r["device"], r["stream"])])


def summary(traces, step=None) -> dict:
    """The ``{"ranks": [...]}`` record printed by ``workbook trace summary --json``."""
    run = as_run(traces)
    return {"ranks": [analyse(t, step=step).as_dict() for t in run.traces]}
