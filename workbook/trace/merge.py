"""Merging the ranks of a run into one Chrome trace, for Perfetto.

Each rank's profiler writes its own file, with its own process ids.  To see
all ranks on one screen (https://ui.perfetto.dev, or ``chrome://tracing``)
they are rewritten into a single trace where

* every rank is one process, ``pid = rank``, named ``rank N`` and sorted by
  rank;
* every track of that rank (host thread, CUDA stream, link) is one thread of
  that process, keeping its original name;
* flow ids (the arrows from a kernel launch to its kernel) are made unique
  per rank.

Timestamps are kept as they are: ranks on one host share the profiler's
clock.  Events are streamed from input to output, so memory stays small
whatever the size of the traces.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from .load import Run, iter_document, load_run

_DROPPED_META = {"process_name", "process_labels", "process_sort_index", "thread_sort_index"}


def merge(run_dir, out_json) -> Path:
    """Write all ranks of ``run_dir`` (or a loaded :class:`Run`) into ``out_json``
    (gzipped when the name ends in ``.gz``); return its path."""
    run = run_dir if isinstance(run_dir, Run) else load_run(run_dir)
    out = Path(out_json)
    out.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if out.name.endswith(".gz") else open
    dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    with opener(out, "wt", encoding="utf-8") as fh:
        fh.write('{"traceEvents":[\n')
        first = [True]

        def write(ev):
            if not first[0]:
                fh.write(",\n")
            first[0] = False
            fh.write(dumps(ev))

        for t in run.traces:
            rank = t.rank
            tids: dict = {}
            names: dict = {}

            def tid_of(pid, tid):
                key = (pid, tid)
                if key not in tids:
                    tids[key] = len(tids) + 1
                return tids[key]

            def on_event(e, rank=rank):
                ph = e.get("ph")
                if ph == "M":
                    if e.get("name") in _DROPPED_META:
                        return
                    if e.get("name") == "thread_name":
                        names[(e.get("pid"), e.get("tid"))] = (e.get("args") or {}).get("name")
                        return
                e = dict(e)
                e["tid"] = tid_of(e.get("pid"), e.get("tid"))
                e["pid"] = rank
                if ph in ("s", "f", "t") and isinstance(e.get("id"), int):
                    e["id"] = (rank << 40) | e["id"]
                write(e)

            iter_document(t.path, on_event)
            write({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                   "args": {"name": f"rank {rank}"}})
            write({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                   "args": {"sort_index": rank}})
            for (pid, tid), new in tids.items():
                name = names.get((pid, tid)) or ("link" if tid == "link" else f"{pid}/{tid}")
                write({"ph": "M", "name": "thread_name", "pid": rank, "tid": new,
                       "args": {"name": name}})
                write({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": new,
                       "args": {"sort_index": new}})
        other = {"ranks": run.ranks, "source": run.label()}
        if run.meta.get("run_id"):
            other["run_id"] = run.meta["run_id"]
        fh.write('\n],"displayTimeUnit":"ms","otherData":' + dumps(other) + "}\n")
    return out
