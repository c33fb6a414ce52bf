"""Loading PyTorch profiler traces.

What a trace file is
--------------------
``torch.profiler`` writes a *Chrome trace*: one JSON object whose key
``traceEvents`` holds a list of events, plus a few small keys around it
(``distributedInfo`` with the rank and world size, ``deviceProperties`` with
the GPUs, ``baseTimeNanoseconds``, ``displayTimeUnit``...). Each event is a
small object.  The ones this toolkit reads are:

* complete events, ``"ph": "X"``: something ran on a track from ``ts`` for
  ``dur`` microseconds.  ``cat`` says what it was: ``cpu_op`` (an ATen
  operator), ``user_annotation`` (a ``record_function`` range, including the
  ``ProfilerStep#N`` markers), ``kernel`` / ``gpu_memcpy`` / ``gpu_memset``
  (work on a CUDA stream), ``cuda_runtime`` (the host call that launched it),
  ``link`` (the workbook's simulated interconnect);
* metadata events, ``"ph": "M"``, that name processes and threads.

A *track* is a ``(pid, tid)`` pair: a host thread, a CUDA stream, or the
simulated link.  Times are always microseconds (the Chrome format says so;
``displayTimeUnit`` only changes how viewers print them), possibly with a
fractional part when the profiler recorded nanoseconds.

Streaming and memory
--------------------
A trace of a real training step can be hundreds of megabytes, and
``json.load`` would build millions of Python dicts at once.  So the loader
*streams*: it reads the file in chunks, decodes one event at a time with the
standard library's :meth:`json.JSONDecoder.raw_decode`, keeps only a compact
row per event (times, and small integer ids for name, category and track)
in typed arrays, and throws the dict away.  Memory then grows with about 40
bytes per kept event, whatever the size of the JSON text.  Gzipped traces are
read through :mod:`gzip` the same way.

Why the standard library and not a JSON library?  Measured: ``load_trace``
with each reader in its place, in a fresh process, best of 3 (CPU seconds,
user + sys, because the machine was shared), with its peak RSS, on the
513 MB, 2.9-million-event trace of ``tests/bench/bench_trace.py``:

==========================================  =====  ===========
reader                                      CPU s  peak RSS MB
==========================================  =====  ===========
this module (stdlib ``raw_decode``)          11.4          179
ijson 3.6 ``items(f, "traceEvents.item")``   10.7          178
the same + a pass for the top-level keys     30.0          179
orjson 3.13 ``loads`` (whole document)       14.4        4,285
msgspec 0.22 ``decode`` (whole document)     14.3        3,041
msgspec, events as ``Raw`` slices             5.8          801
msgspec over ``mmap``, events via a hook      5.5          621
==========================================  =====  ===========

The one library that streams (ijson, C backend ``yajl2_c``) is no faster:
its C code builds the items under one prefix only, and the small keys
around ``traceEvents`` then need a second pass through Python.  They are
needed: torch writes ``traceName`` after the events, and
:func:`workbook.trace.capture.rank_trace` adds its ``workbook`` block (and
``distributedInfo``, when torch wrote none) after them too.  The libraries
that are faster hold the whole document, or the whole file, in memory:
their peak RSS grows with the file instead of with the events kept (and a
``.json.gz`` cannot be memory-mapped).  On the small traces users mostly
bring (a 50 kB real NCCL trace, a 5 MB synthetic one) every reader takes
0.1-0.3 s, most of it starting Python and importing numpy.  So the loader
keeps its own reader, and needs no dependency.

Events that never matter for overlap analysis (Python stack frames, flow
arrows, the profiler's own spans) are skipped while reading.  Host launch
calls (``cuda_runtime``) are kept only as ``(correlation id, time)`` pairs:
they tell on which host-side step or phase a GPU kernel was launched.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import warnings
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np


class TraceError(Exception):
    """A trace (or a run directory) cannot be read; the message names the file."""


# Categories dropped while reading: they never carry compute, communication
# or phase information, and some (python_function) are very numerous.
_DROP_CATS = frozenset({"python_function", "Trace", "fwdbwd", "ac2g", "overhead",
                        "cpu_instant_event", "ProfilerStep"})
_LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
# Older profilers (PyTorch 1.8-1.9) spelled the categories differently.
_CAT_ALIASES = {"Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset",
                "Runtime": "cuda_runtime", "Operator": "cpu_op"}
_DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"})

#: Bytes per element of the ``dtype`` names found in NCCL kernel args.
DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
    "bfloat16": 2, "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2,
    "int16": 2, "char": 1, "int8": 1, "byte": 1, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "complexfloat": 8, "complexdouble": 16,
}

_RANK_IN_NAME = [re.compile(r"rank[_-]?(\d+)", re.I), re.compile(r"[-_.](\d+)\.(?:pt\.)?(?:trace\.)?json")]


@dataclass
class Track:
    """One lane of a timeline: a host thread, a CUDA stream or the link."""
    pid: object
    tid: object
    name: str


@dataclass
class Trace:
    """The compact, analysable form of one rank's trace file.

    The per-event columns are numpy arrays of equal length, one entry per
    kept complete event; ``names``, ``cats`` and ``tracks`` are the tables
    that the integer id columns point into.  Times are microseconds measured
    from ``origin_us`` (the first event's whole-microsecond time), which keeps
    full float precision for nanosecond-resolution traces.
    """
    path: str
    rank: int | None
    rank_source: str
    world_size: int | None
    backend: str | None
    meta: dict
    names: list[str]
    cats: list[str]
    tracks: list[Track]
    origin_us: float
    ts: np.ndarray
    dur: np.ndarray
    name_id: np.ndarray
    cat_id: np.ndarray
    track_id: np.ndarray
    nbytes: np.ndarray          # bytes moved by a communication event, NaN if unknown
    corr: np.ndarray            # CUDA correlation id of device events, -1 otherwise
    coll_name: dict[int, str]   # event index -> collective name given in its args
    launch_corr: np.ndarray     # correlation ids of host launch calls
    launch_ts: np.ndarray       # ... and their start times
    run: dict | None = None     # run.json found beside the trace, if any
    events_read: int = 0

    def __len__(self) -> int:
        return len(self.ts)

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    @property
    def device(self) -> str:
        """``"cuda"`` when the trace holds GPU kernels, else ``"cpu"``."""
        return "cuda" if "kernel" in self.cats else "cpu"

    @property
    def device_name(self) -> str:
        props = self.meta.get("deviceProperties") or []
        if self.device == "cuda" and props and isinstance(props[0], dict) and props[0].get("name"):
            return f"cuda ({props[0]['name']})"
        return self.device

    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else os.path.basename(self.path)


# --------------------------------------------------------------------------
# A streaming reader of one JSON document
# --------------------------------------------------------------------------

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _Stream:
    """Reads JSON values one by one from a text file handle."""

    def __init__(self, fh, path: str, chunk: int = 1 << 20):
        self.fh, self.path, self.chunk = fh, path, chunk
        self.buf, self.pos, self.eof = "", 0, False

    def _more(self, size: int) -> bool:
        if self.eof:
            return False
        try:
            data = self.fh.read(size)
        except (OSError, EOFError, UnicodeDecodeError, ValueError) as exc:
            raise TraceError(f"{self.path}: cannot read ({exc.__class__.__name__}: {exc})") from None
        if not data:
            self.eof = True
            return False
        self.buf = self.buf[self.pos:] + data
        self.pos = 0
        return True

    def peek(self) -> str:
        """Skip whitespace; return the next character ('' at end of file)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more(self.chunk):
                return ""

    def expect(self, chars: str) -> str:
        c = self.peek()
        if not c or c not in chars:
            what = "end of file" if not c else repr(c)
            raise TraceError(f"{self.path}: not a trace (truncated or invalid JSON: expected "
                             f"{' or '.join(map(repr, chars))}, found {what})")
        self.pos += 1
        return c

    def value(self):
        self.peek()
        size = self.chunk
        while True:
            try:
                val, end = _DECODER.raw_decode(self.buf, self.pos)
                # A number at the very end of the buffer may continue in the next chunk.
                if end < len(self.buf) or self.eof:
                    self.pos = end
                    return val
            except json.JSONDecodeError as exc:
                if self.eof:
                    raise TraceError(f"{self.path}: not a trace (truncated or invalid JSON: "
                                     f"{exc.msg})") from None
            if not self._more(size):
                continue  # now at EOF: one last attempt above
            size *= 2


def _open_text(path: str):
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, "r", encoding="utf-8")


def iter_document(path: str | os.PathLike, on_event: Callable[[dict], None]) -> dict:
    """Stream one Chrome-trace file: call ``on_event`` for every element of
    ``traceEvents`` and return the other top-level keys.  Also accepts the
    bare-array form of the Chrome format (a JSON list of events)."""
    path = str(path)
    meta: dict = {}
    try:
        fh = _open_text(path)
    except OSError as exc:
        raise TraceError(f"{path}: cannot open ({exc.strerror or exc})") from None
    with fh:
        s = _Stream(fh, path)
        first = s.expect("{[")
        if first == "[":
            _stream_array(s, on_event, opened=True)
            meta["traceEvents"] = True
            return meta
        if s.peek() == "}":
            s.pos += 1
        else:
            while True:
                key = s.value()
                if not isinstance(key, str):
                    raise TraceError(f"{path}: not a trace (invalid JSON object key)")
                s.expect(":")
                if key == "traceEvents":
                    s.expect("[")
                    _stream_array(s, on_event, opened=True)
                    meta["traceEvents"] = True
                else:
                    meta[key] = s.value()
                if s.expect(",}") == "}":
                    break
    if "traceEvents" not in meta:
        raise TraceError(f"{path}: not a trace (no 'traceEvents' list)")
    return meta


_SEP = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")


def _stream_array(s: _Stream, on_event, opened: bool) -> None:
    if s.peek() == "]":
        s.pos += 1
        return
    decode, sep, JSONDecodeError = _DECODER.raw_decode, _SEP.match, json.JSONDecodeError
    while True:
        # Fast path: the whole event and the separator after it are in the buffer.
        buf = s.buf
        try:
            ev, end = decode(buf, s.pos)
            m = sep(buf, end)
            fast = m is not None and m.end() < len(buf)
        except JSONDecodeError:
            fast = False
        if fast:
            s.pos = m.end()
            if type(ev) is dict:
                on_event(ev)
            if m.group(1) == "]":
                return
            continue
        # Slow path near the end of the buffer: read more as needed.
        ev = s.value()
        if isinstance(ev, dict):
            on_event(ev)
        if s.expect(",]") == "]":
            return
        s.peek()  # leave the position on the next event, as the fast path expects


# --------------------------------------------------------------------------
# Building the compact form
# --------------------------------------------------------------------------

def rank_from_filename(path: str) -> int | None:
    """Guess a rank from a file name such as ``rank3.trace.json``,
    ``rank_3.json.gz`` or ``worker-3.pt.trace.json``; ``None`` if none."""
    base = os.path.basename(str(path))
    for pat in _RANK_IN_NAME:
        m = pat.search(base)
        if m:
            return int(m.group(1))
    return None


def _nbytes_from_args(args: dict) -> float:
    b = args.get("bytes")
    if isinstance(b, (int, float)):
        return float(b)
    n = args.get("In msg nelems")
    dt = args.get("dtype")
    if isinstance(n, (int, float)) and isinstance(dt, str):
        size = DTYPE_BYTES.get(dt.lower().replace("torch.", "").replace(" ", ""))
        if size:
            return float(n) * size
    return math.nan


def load_trace(path: str | os.PathLike, run: dict | None = None) -> Trace:
    """Read one rank's trace file (``.json`` or ``.json.gz``) into a :class:`Trace`.

    Raises :class:`TraceError` with the file name when the file is not a
    readable trace or holds no complete events.
    """
    path = str(path)
    names: dict[str, int] = {}
    cats: dict[str, int] = {}
    tracks: dict[tuple, int] = {}
    thread_names: dict[tuple, str] = {}
    ts, dur, nbytes = array("d"), array("d"), array("d")
    name_id, cat_id, track_id = array("i"), array("i"), array("i")
    corr = array("q")
    launch_corr, launch_ts = array("q"), array("d")
    coll_name: dict[int, str] = {}
    origin = [None]
    count = [0]
    nan = math.nan

    def on_event(e: dict) -> None:
        count[0] += 1
        ph = e.get("ph")
        if ph != "X":
            if ph == "M" and e.get("name") == "thread_name":
                a = e.get("args") or {}
                thread_names[(e.get("pid"), e.get("tid"))] = str(a.get("name", ""))
            return
        cat = e.get("cat") or ""
        cat = _CAT_ALIASES.get(cat, cat)
        if cat in _DROP_CATS:
            return
        try:
            t = float(e["ts"])
            d = float(e.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            return
        if origin[0] is None:
            origin[0] = math.floor(t)
        args = e.get("args")
        if cat in _LAUNCH_CATS:
            c = args.get("correlation") if isinstance(args, dict) else None
            if isinstance(c, int):
                launch_corr.append(c)
                launch_ts.append(t - origin[0])
            return
        name = e.get("name") or ""
        key = (e.get("pid"), e.get("tid"))
        tr = tracks.get(key)
        if tr is None:
            tr = tracks[key] = len(tracks)
        ni = names.get(name)
        if ni is None:
            ni = names[name] = len(names)
        ci = cats.get(cat)
        if ci is None:
            ci = cats[cat] = len(cats)
        b, c = nan, -1
        if isinstance(args, dict) and args:
            if cat == "link" or "Collective name" in args or "In msg nelems" in args or "bytes" in args:
                b = _nbytes_from_args(args)
                cn = args.get("Collective name")
                if isinstance(cn, str) and cn:
                    coll_name[len(ts)] = cn
            if cat in _DEVICE_CATS:
                cc = args.get("correlation")
                if isinstance(cc, int):
                    c = cc
        ts.append(t - origin[0])
        dur.append(d if d > 0 else 0.0)
        name_id.append(ni)
        cat_id.append(ci)
        track_id.append(tr)
        nbytes.append(b)
        corr.append(c)

    meta = iter_document(path, on_event)
    meta.pop("traceEvents", None)
    if not ts:
        raise TraceError(f"{path}: empty trace (no complete events)")

    ts_arr = np.frombuffer(ts, dtype=np.float64).copy()
    shift = math.floor(float(ts_arr.min()))
    ts_arr -= shift
    launch_arr = np.frombuffer(launch_ts, dtype=np.float64) - shift
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    rank, source = info.get("rank"), "distributedInfo"
    if not isinstance(rank, int):
        rank, source = rank_from_filename(path), "file name"
        if rank is None:
            source = "unknown"
    ws = info.get("world_size")
    track_list = []
    for (pid, tid), _ in sorted(tracks.items(), key=lambda kv: kv[1]):
        nm = thread_names.get((pid, tid))
        if not nm:
            nm = "link" if tid == "link" else f"{pid}/{tid}"
        track_list.append(Track(pid, tid, nm))
    return Trace(
        path=path, rank=rank, rank_source=source,
        world_size=ws if isinstance(ws, int) else None,
        backend=info.get("backend"), meta=meta,
        names=list(names), cats=list(cats), tracks=track_list,
        origin_us=float(origin[0] + shift),
        ts=ts_arr,
        dur=np.frombuffer(dur, dtype=np.float64).copy(),
        name_id=np.frombuffer(name_id, dtype=np.int32).copy(),
        cat_id=np.frombuffer(cat_id, dtype=np.int32).copy(),
        track_id=np.frombuffer(track_id, dtype=np.int32).copy(),
        nbytes=np.frombuffer(nbytes, dtype=np.float64).copy(),
        corr=np.frombuffer(corr, dtype=np.int64).copy(),
        coll_name=coll_name,
        launch_corr=np.frombuffer(launch_corr, dtype=np.int64).copy(),
        launch_ts=launch_arr,
        run=run, events_read=count[0],
    )


# --------------------------------------------------------------------------
# Runs: all ranks of one job
# --------------------------------------------------------------------------

@dataclass
class Run:
    """The traces of one job, one per rank, sorted by rank.

    ``meta`` is the ``run.json`` written by the capture code (empty when the
    traces came without one); ``warnings`` lists the files that could not be
    read when loading was not strict.
    """
    traces: list[Trace]
    meta: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    root: str | None = None

    def __iter__(self) -> Iterator[Trace]:
        return iter(self.traces)

    def __len__(self) -> int:
        return len(self.traces)

    @property
    def ranks(self) -> list:
        return [t.rank for t in self.traces]

    def rank(self, r: int) -> Trace:
        for t in self.traces:
            if t.rank == r:
                return t
        raise TraceError(f"no trace for rank {r} (ranks: {self.ranks})")

    def label(self) -> str:
        """Where the numbers come from: ``simulated link: <preset>`` or the hardware."""
        return describe_source(self.meta, self.traces)


def describe_source(meta: dict, traces: Iterable[Trace] = ()) -> str:
    link = meta.get("link") if isinstance(meta.get("link"), dict) else {}
    if link.get("simulated"):
        return f"simulated link: {link.get('preset', 'custom')}"
    if meta.get("hardware"):
        return str(meta["hardware"])
    devs = sorted({t.device_name for t in traces})
    return ", ".join(devs) if devs else "unknown hardware"


def _is_trace_file(p: Path) -> bool:
    n = p.name
    return (p.is_file() and n != "run.json" and not n.startswith("merged")
            and (n.endswith(".json") or n.endswith(".json.gz")))


def trace_files(run_dir: str | os.PathLike) -> list[Path]:
    """The trace files of a run directory: every ``*.json``/``*.json.gz`` but
    ``run.json`` and the ``merged*`` output of :func:`workbook.trace.merge.merge`."""
    d = Path(run_dir)
    if not d.is_dir():
        raise TraceError(f"{d}: not a directory")
    files = sorted(p for p in d.iterdir() if _is_trace_file(p))
    if not files:
        raise TraceError(f"{d}: no trace files (*.json, *.json.gz) in this directory")
    return files


def read_run_json(run_dir: str | os.PathLike) -> dict:
    p = Path(run_dir) / "run.json"
    if not p.exists():
        return {}
    try:
        with open(p, encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, ValueError) as exc:
        raise TraceError(f"{p}: unreadable run metadata ({exc})") from None
    if not isinstance(meta, dict):
        raise TraceError(f"{p}: run metadata is not a JSON object")
    return meta


def load_run(paths, strict: bool = False) -> Run:
    """Load every rank of a run.

    ``paths`` is a run directory, a trace file, or a list of either.  Files
    that fail to load raise :class:`TraceError` when ``strict``; otherwise
    they are skipped with a warning (kept in ``Run.warnings``) as long as at
    least one rank was read.  Mixing runs is an error: two ``run.json`` with
    different ``run_id``, or traces whose ``world_size`` disagree.
    A trace whose rank is recorded nowhere (neither ``distributedInfo`` nor
    its file name) gets the first free rank number, with a warning.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files: list[tuple[Path, dict, str]] = []
    metas: dict[str, dict] = {}
    for p in map(Path, paths):
        if p.is_dir():
            meta = read_run_json(p)
            metas[str(p)] = meta
            files += [(f, meta, str(p)) for f in trace_files(p)]
        elif p.exists():
            meta = read_run_json(p.parent)
            if meta:
                metas[str(p.parent)] = meta
            files.append((p, meta, str(p.parent)))
        else:
            raise TraceError(f"{p}: no such file or directory")
    run_ids = {m.get("run_id") for m in metas.values() if m.get("run_id") is not None}
    if len(run_ids) > 1:
        raise TraceError("traces from different runs mixed: run_id " + ", ".join(
            f"{m.get('run_id')!r} in {d}" for d, m in metas.items()))
    traces, problems = [], []
    for f, meta, _ in files:
        try:
            traces.append(load_trace(f, run=meta or None))
        except TraceError as exc:
            if strict:
                raise
            problems.append(str(exc))
    if not traces:
        raise TraceError("no readable trace: " + "; ".join(problems))
    sizes = {t.world_size for t in traces if t.world_size is not None}
    if len(sizes) > 1:
        raise TraceError("traces from different runs mixed: world sizes disagree (" + ", ".join(
            f"{os.path.basename(t.path)}: {t.world_size}" for t in traces) + ")")
    seen: dict[int, str] = {}
    for t in traces:
        if t.rank is None:
            continue
        if t.rank in seen:
            raise TraceError(f"{t.path}: rank {t.rank} appears twice (also in {seen[t.rank]}); "
                             "traces from different runs mixed?")
        seen[t.rank] = t.path
    for t in traces:
        if t.rank is None:
            t.rank = next(r for r in range(len(traces) + len(seen) + 1) if r not in seen)
            seen[t.rank] = t.path
            t.rank_source = "assumed"
            problems.append(f"{t.path}: no rank recorded (no distributedInfo, no rank in the "
                            f"file name); assumed rank {t.rank}")
    for msg in problems:
        warnings.warn(msg, stacklevel=2)
    traces.sort(key=lambda t: t.rank)
    meta = next(iter(metas.values()), {}) if metas else {}
    root = files[0][2] if files else None
    return Run(traces=traces, meta=meta, warnings=problems, root=root)


def as_run(obj) -> Run:
    """Accept a :class:`Run`, a :class:`Trace`, a list of traces, or paths."""
    if isinstance(obj, Run):
        return obj
    if isinstance(obj, Trace):
        return Run([obj], meta=obj.run or {})
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(t, Trace) for t in obj):
        return Run(sorted(obj, key=lambda t: (t.rank is None, t.rank or 0)), meta=obj[0].run or {})
    return load_run(obj)
