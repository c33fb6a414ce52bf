"""Which JSON reader should load profiler traces?  (a script, not a test)

    python tests/bench/bench_json_loaders.py                 # 513 MB + 5 MB traces, 3 rounds
    python tests/bench/bench_json_loaders.py --big-mb 50 --rounds 1    # quick

Compares, on the synthetic traces of ``bench_trace.py`` (the 513 MB file of its
default ``--big-mb 500``, a 5 MB one and its gzip, and a real 50 kB NCCL trace
of the test data), the workbook's streaming reader
(:func:`workbook.trace.load.iter_document`) with readers built on libraries:

* ``ijson-events``: ``ijson.items(f, "traceEvents.item")`` (yajl2_c backend),
  the events only -- no top-level keys, so *not* a full replacement;
* ``ijson``: the same plus a second pass for the top-level keys (ijson has no
  C-level way to build the keys around a streamed array in the same pass);
* ``orjson`` / ``msgspec``: the whole document decoded at once;
* ``msgspec-raw``: the whole file read, events kept as raw byte slices and
  decoded one at a time;
* ``msgspec-mmap``: the file memory-mapped (its pages count in RSS), each
  event decoded in C and passed on through ``dec_hook``; plain files only.

Each (reader, file) runs ``load_trace`` in a fresh process, ``--rounds`` times,
interleaved; the table gives the best wall time (interpreter start and imports
included), the best CPU time (user + sys: robust when the machine is shared)
and the peak RSS.  Libraries that are not installed are skipped:
``pip install ijson orjson msgspec`` to try them all.
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]   # the repository: this file is tests/bench/...
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "bench"))


# ----------------------------------------------------------------- the readers

def _open_bin(path):
    with open(path, "rb") as fh:
        magic = fh.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def read_ijson_events(path, on_event):
    import ijson
    with _open_bin(path) as f:
        for ev in ijson.items(f, "traceEvents.item", use_float=True):
            on_event(ev)
    return {"traceEvents": True}


def read_ijson(path, on_event):
    import ijson
    meta = read_ijson_events(path, on_event)
    with _open_bin(path) as f:      # second pass: the top-level keys other than traceEvents
        tokens = (t for t in ijson.parse(f, use_float=True)
                  if not (t[0].startswith("traceEvents") or (t[0] == "" and t[2] == "traceEvents")))
        meta.update(ijson.kvitems(tokens, ""))
    return meta


def _whole(decode, path, on_event):
    with _open_bin(path) as f:
        doc = decode(f.read())
    for ev in doc.pop("traceEvents"):
        on_event(ev)
    doc["traceEvents"] = True
    return doc


def read_orjson(path, on_event):
    import orjson
    return _whole(orjson.loads, path, on_event)


def read_msgspec(path, on_event):
    import msgspec
    return _whole(msgspec.json.decode, path, on_event)


def read_msgspec_raw(path, on_event):
    import msgspec
    with _open_bin(path) as f:
        data = f.read()
    top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    meta = {k: msgspec.json.decode(v) for k, v in top.items() if k != "traceEvents"}
    decode = msgspec.json.Decoder().decode
    for raw in msgspec.json.decode(top.pop("traceEvents"), type=list[msgspec.Raw]):
        on_event(decode(raw))
    meta["traceEvents"] = True
    return meta


def read_msgspec_mmap(path, on_event):
    """One C pass over a memory map of the file (plain files only: a map cannot be gunzipped):
    msgspec hands each element of traceEvents, decoded, to ``dec_hook``, which passes it on."""
    import mmap
    import msgspec

    class Event:                 # a type msgspec does not know: it calls dec_hook for each one
        pass

    done = Event()

    def hook(_type, obj):
        if type(obj) is dict:
            on_event(obj)
        return done              # the list left behind holds this one object, n times

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
        meta = {k: msgspec.json.decode(v) for k, v in top.items() if k != "traceEvents"}
        msgspec.json.decode(top.pop("traceEvents"), type=list[Event], dec_hook=hook)
        del top                  # no Raw may outlive the map
    meta["traceEvents"] = True
    return meta


READERS = {"hand (stdlib)": None, "ijson-events": read_ijson_events, "ijson": read_ijson,
           "orjson": read_orjson, "msgspec": read_msgspec, "msgspec-raw": read_msgspec_raw,
           "msgspec-mmap": read_msgspec_mmap}
NEEDS = {"ijson-events": "ijson", "ijson": "ijson", "orjson": "orjson", "msgspec": "msgspec",
         "msgspec-raw": "msgspec", "msgspec-mmap": "msgspec"}


def child(reader: str, path: str) -> None:
    """One measurement, in this fresh process: load_trace with the given reader."""
    t0 = time.perf_counter()
    from workbook.trace import load
    if READERS[reader] is not None:
        load.iter_document = READERS[reader]
    t = load.load_trace(path)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": ru.ru_utime + ru.ru_stime,
                      "rss_mb": ru.ru_maxrss / 1024, "events": t.events_read, "kept": len(t),
                      "keys": sorted(t.meta), "ts_sum": float(t.ts.sum())}))


# ----------------------------------------------------------------- the driver

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big-mb", type=float, default=500.0)
    ap.add_argument("--small-mb", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="keep (and reuse) the generated traces here")
    ap.add_argument("--child", nargs=2, metavar=("READER", "FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return 0
    import importlib.util
    from bench_trace import write_rank

    tmp = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench_json_"))
    tmp.mkdir(parents=True, exist_ok=True)
    files = {"real 50 kB": ROOT / "tests/package/data/traces/real_async/rank0.trace.json"}
    for label, mb in (("small", args.small_mb), ("big", args.big_mb)):
        p = tmp / f"{label}.trace.json"
        if not p.exists():
            write_rank(p, 0, 1, int(mb * 1e6 / 170))   # ~170 bytes per synthetic event
        files[f"{label} {p.stat().st_size / 1e6:.0f} MB"] = p
        if label == "small":
            gz = tmp / "small.trace.json.gz"
            if not gz.exists():
                with open(p, "rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
                    shutil.copyfileobj(src, dst)
            files[f"small .gz {gz.stat().st_size / 1e6:.1f} MB"] = gz
    readers = [r for r in READERS if r not in NEEDS or importlib.util.find_spec(NEEDS[r])]
    print(f"traces in {tmp}; readers: {', '.join(readers)}", flush=True)

    results: dict[tuple, list] = {}
    for _ in range(args.rounds):
        for label, path in files.items():
            for reader in readers:
                proc = subprocess.run([sys.executable, __file__, "--child", reader, str(path)],
                                      capture_output=True, text=True)
                if proc.returncode:
                    print(f"{reader} on {label} failed: {proc.stderr.strip().splitlines()[-1]}")
                    continue
                results.setdefault((label, reader), []).append(json.loads(proc.stdout))

    print("\n| trace | reader | wall s (best) | CPU s (best) | peak RSS MB | events | top-level keys |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label in files:
        ref = results.get((label, "hand (stdlib)"), [{}])[0]
        for reader in readers:
            runs = results.get((label, reader))
            if not runs:
                continue
            r = runs[0]
            same = (r["ts_sum"] == ref.get("ts_sum") and r["kept"] == ref.get("kept"))
            print(f"| {label} | {reader} | {min(x['wall_s'] for x in runs):.2f} | "
                  f"{min(x['cpu_s'] for x in runs):.2f} | {max(x['rss_mb'] for x in runs):.0f} | "
                  f"{r['events']:,}{'' if same else ' (differs!)'} | {len(r['keys'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
