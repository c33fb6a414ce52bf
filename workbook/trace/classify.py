"""Classifying trace events: what kind of time is each span?

Overlap analysis asks one question of every span in a trace: *was this rank
computing, communicating, copying memory, or waiting?*  This module answers
it with a few rules, applied per rank.

On a GPU (the trace holds ``kernel`` events)
    * a kernel whose name contains ``nccl`` (``ncclKernel_*``,
      ``ncclDevKernel_*``) is **communication**, whatever stream it ran on;
    * every other kernel is **compute**;
    * ``gpu_memcpy`` and ``gpu_memset`` are **memcpy**;
    * host-side spans (operators, Python ranges) are only *host activity*:
      the GPU is the device whose time we account for, as Holistic Trace
      Analysis does.

On a CPU (no kernels: the course's laptop labs over gloo)
    * spans on the ``link`` thread (category ``link``), written by the
      workbook's simulated interconnect, are **communication**;
    * ``link_late`` spans (thread ``link: peers late``) are **late peer**:
      an op had finished its modelled transfer but a peer had not issued it
      yet, so the real operation could not end (rank skew);
    * ``gloo:*`` spans, on gloo's own threads, are **communication** *only
      when the rank has no link track*: with the simulated link the gloo
      spans are the real (fast, local) transfer underneath the modelled one,
      and counting both would count the same collective twice;
    * operators that gloo runs *inside* one of its spans, on its own
      ``pt_gloo_runloop`` thread (the ``aten::copy_`` that unpacks a gather),
      are part of that collective, not the rank's compute: **other**.  A gloo
      thread therefore carries no compute, and on the simulated link no work
      at all, so the timeline does not draw it;
    * ``link_wait:*`` ranges and the host side of a blocking collective
      (``c10d::*``, ``nccl:*``, ``record_param_comms``) are **wait**: the
      compute thread is blocked, not computing;
    * every other operator (``aten::*``, autograd functions) is **compute**,
      and so is a user ``record_function`` range that wraps no operator.
      A range that does wrap operators (``forward``, ``backward``) is
      accounted for by those operators: its gaps are Python overhead or a
      blocking wait the profiler did not record, not arithmetic (counting
      them would show a synchronous gloo all-reduce as "100 % overlapped").
      Nested spans are not counted twice because the analysis takes the
      *union* of intervals, and waits are cut out of that union afterwards.

Everywhere, ``ProfilerStep#N`` ranges are **step** markers, the two empty
ranges :func:`workbook.trace.capture.rank_trace` records to start the
profiler and tie its clock to the link's are **other**, and user ranges
(``record_function``) are also **phase** candidates for queries such as
"collectives during backward".
"""

from __future__ import annotations

import re

import numpy as np

from . import intervals as iv
from .load import Trace

COMPUTE, COMM, MEMCPY, WAIT, STEP, HOST, OTHER, RANGE, LATE = range(9)
#: Human names of the category codes, indexable by code.
KINDS = ("compute", "communication", "memcpy", "wait", "step", "host", "other", "range",
         "late peer")

#: The name of a step marker, ``ProfilerStep#N`` (``prof.step()``, ``capture.traced_step``).
STEP_PREFIX = "ProfilerStep#"
#: The ranges ``capture.rank_trace`` records for itself (profiler warm-up, clock sync).
CAPTURE_MARKERS = ("workbook_warmup", "workbook_clock_sync")
_WAIT_PREFIXES = ("link_wait:", "c10d::", "nccl:", "record_param_comms")
_USER_CATS = ("user_annotation", "gpu_user_annotation")

# Canonical collective names: lower-case, no separators -> snake_case.
_CANON = {
    "allreduce": "all_reduce", "allgather": "all_gather", "allgatherbase": "all_gather",
    "allgatherintotensor": "all_gather", "allgathercoalesced": "all_gather",
    "reducescatter": "reduce_scatter", "reducescatterbase": "reduce_scatter",
    "reducescattertensor": "reduce_scatter", "broadcast": "broadcast", "bcast": "broadcast",
    "reduce": "reduce", "gather": "gather", "scatter": "scatter", "barrier": "barrier",
    "alltoall": "all_to_all", "alltoallv": "all_to_all", "alltoallbase": "all_to_all",
    "send": "send", "recv": "recv", "sendrecv": "send_recv", "isend": "send", "irecv": "recv",
}
_NCCL_KERNEL = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)", re.I)


def canonical_collective(name: str) -> str:
    """Map the many spellings of a collective to one name.

    ``all_reduce`` (link span), ``gloo:all_reduce``, ``allreduce`` (NCCL's
    ``Collective name`` arg) and ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``
    all become ``"all_reduce"``.  Unknown names are returned unchanged.
    """
    raw = name
    m = _NCCL_KERNEL.match(name)
    if m:
        name = m.group(1)
    for prefix in ("gloo:", "nccl:", "c10d::", "link_wait:"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    key = name.lower().replace("_", "").replace("-", "").rstrip("_")
    return _CANON.get(key, raw if not m else name)


def has_link_track(trace: Trace) -> bool:
    """Does this rank's trace carry simulated-link spans?"""
    return "link" in trace.cats or any(t.tid == "link" for t in trace.tracks)


def classify(trace: Trace) -> np.ndarray:
    """Return one category code (``COMPUTE``, ``COMM``...) per event.

    The rule is evaluated once per distinct (name, category, on-link-track)
    triple and then spread over the events with numpy, so the cost is a
    handful of array operations whatever the number of events.

    To find the distinct triples, picture a table with one cell per possible
    triple: ``len(names)`` x ``len(cats)`` x 2 (off/on the link track).
    :func:`numpy.ravel_multi_index` gives each event the number of its cell,
    :func:`numpy.unique` keeps each cell once, and
    :func:`numpy.unravel_index` turns the cell numbers back into triples.
    (``np.unique(..., axis=0)`` on an events x 3 array says the same thing
    but is several times slower on a million events.)
    """
    cached = getattr(trace, "_kinds", None)
    if cached is not None:
        return cached
    gpu = trace.device == "cuda"
    link = has_link_track(trace)
    link_tracks = np.array([t.tid == "link" or t.name == "link" for t in trace.tracks], dtype=bool)
    on_link = link_tracks[trace.track_id] if len(trace.tracks) else np.zeros(len(trace), bool)
    table_shape = (max(len(trace.names), 1), max(len(trace.cats), 1), 2)
    cell = np.ravel_multi_index((trace.name_id, trace.cat_id, on_link.astype(np.intp)), table_shape)
    cells, event_cell = np.unique(cell, return_inverse=True)
    triples = zip(*(axis.tolist() for axis in np.unravel_index(cells, table_shape)))
    codes = np.array([_rule(trace.names[name], trace.cats[cat], bool(is_link), gpu, link)
                      for name, cat, is_link in triples], dtype=np.int8)
    kinds = codes[event_cell.reshape(-1)]
    if not gpu:
        _demote_backend_internals(trace, kinds)
        _demote_wrapping_ranges(trace, kinds)
    trace._kinds = kinds
    return kinds


def tracks_with(trace: Trace, mask: np.ndarray) -> list[int]:
    """The ids of the tracks that hold at least one event of ``mask``, in ascending order.

    Track ids are small integers (``0 .. len(trace.tracks) - 1``), so counting the events per
    track with :func:`numpy.bincount` finds them in one pass.  (``np.unique`` gives the same list
    by sorting, and its first call imports ``numpy.ma``: milliseconds a one-shot
    ``workbook trace summary`` would spend for nothing.)
    """
    per_track = np.bincount(trace.track_id[mask], minlength=len(trace.tracks))
    return np.flatnonzero(per_track).tolist()


def _demote_backend_internals(trace: Trace, kinds: np.ndarray) -> None:
    """On gloo's own threads, mark the operators that start inside a ``gloo:*`` span as OTHER.

    A thread is gloo's own when every operator on it starts inside one of its gloo spans (the
    ``pt_gloo_runloop`` of a collective). Point-to-point ops (``isend``/``irecv``) record their
    ``gloo:send``/``gloo:recv`` span on the *calling* thread, from issue until done: the compute
    and the waits that thread runs meanwhile are the rank's own, and stay as they are."""
    is_gloo = np.array([n.startswith("gloo:") for n in trace.names] or [False], bool)[trace.name_id]
    if not is_gloo.any():
        return
    inner = np.isin(kinds, (COMPUTE, WAIT)) & ~is_gloo
    for tr in tracks_with(trace, is_gloo):
        on = trace.track_id == tr
        starts, ends = iv.union(trace.ts[is_gloo & on], trace.end[is_gloo & on])
        ops = np.flatnonzero(inner & on)
        k = np.searchsorted(starts, trace.ts[ops], side="right") - 1
        inside = k >= 0
        inside[inside] = trace.ts[ops[inside]] < ends[k[inside]]
        if inside.all():
            kinds[ops] = OTHER


def _demote_wrapping_ranges(trace: Trace, kinds: np.ndarray) -> None:
    """Mark user ranges that contain an operator of their own thread as RANGE."""
    user_cat = trace.cats.index("user_annotation") if "user_annotation" in trace.cats else -1
    is_range = (kinds == COMPUTE) & (trace.cat_id == user_cat)
    if not is_range.any():
        return
    ops = (kinds == COMPUTE) & ~is_range | (kinds == WAIT)
    for tr in tracks_with(trace, is_range):
        on = trace.track_id == tr
        starts = np.sort(trace.ts[ops & on])
        rng = np.flatnonzero(is_range & on)
        lo = np.searchsorted(starts, trace.ts[rng], side="left")
        hi = np.searchsorted(starts, trace.ts[rng] + trace.dur[rng], side="right")
        kinds[rng[hi > lo]] = RANGE


def _rule(name: str, cat: str, on_link: bool, gpu: bool, link: bool) -> int:
    if cat == "link_late":
        return LATE
    if cat == "link" or on_link:
        return COMM
    if name.startswith("gloo:"):
        return OTHER if link else COMM
    if cat == "kernel":
        return COMM if "nccl" in name.lower() else COMPUTE
    if cat in ("gpu_memcpy", "gpu_memset"):
        return MEMCPY
    if cat == "gpu_user_annotation":
        return OTHER
    if name.startswith(STEP_PREFIX):
        return STEP
    if name in CAPTURE_MARKERS:
        return OTHER
    if name.startswith(_WAIT_PREFIXES):
        return HOST if gpu else WAIT
    if cat in ("cpu_op", "user_annotation", "") or cat.startswith("cpu"):
        return HOST if gpu else COMPUTE
    return OTHER


def is_phase_range(trace: Trace) -> np.ndarray:
    """Boolean mask of the user ``record_function`` ranges usable as phases
    (not step markers, not gloo/link spans, not waits)."""
    user = np.isin(trace.cat_id, [i for i, c in enumerate(trace.cats) if c in _USER_CATS])
    bad = np.array([n.startswith((STEP_PREFIX, "gloo:") + _WAIT_PREFIXES) for n in trace.names]
                   or [False], dtype=bool)
    return user & ~bad[trace.name_id]


def collective_of(trace: Trace, index: int) -> str:
    """The canonical collective name of communication event ``index``."""
    given = trace.coll_name.get(index)
    return canonical_collective(given if given else trace.names[trace.name_id[index]])
