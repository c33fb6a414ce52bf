"""Do the lessons run headless without stalling? Every lesson, many times, every cell timed.

    python tests/bench/lesson_stability.py --runs 20 [--lessons 03,10] [--timeout 120]

Each run executes each lesson in a fresh kernel exactly as ``tests/package/test_notebooks.py``
does (``workbook.lessons.run_headless``, grading cells skipped), and records how long every code
cell took, from the request to the kernel's reply and idle status. Then, per lesson, a table row:

* ``runs``, ``median s``, ``max s``: how many runs, the median and the longest of their times;
* ``slowest cell``: the cell with the longest single (finished) time, that time, and the cell's
  median;
* ``outliers``: finished cell runs slower than 3x that cell's median and slower than 2 s (so a
  0.01 s cell that once takes 0.05 s is not one): a cell that waited on something, a stall or a
  busy machine;
* cell runs that reached the per-cell timeout (within 1 s), of two kinds. ``stalled``: finished
  at the timeout, the stall of nbclient#312 (https://github.com/jupyter/nbclient/issues/312,
  docs/headless-lessons.md): the cell's work was done and its reply there, and the client
  noticed it only when its timeout fired. ``timed out``: still running at the timeout (the run
  stops with an error), work that outran the limit: a slow or overloaded machine;
* ``errors``: runs that raised anything else.

Exit status 1 when any cell run is an outlier, reached the timeout or raised; 0 otherwise. The
load average is printed at the start and the end: on a shared machine outliers can be load.

``--nbclient-output-widget`` runs the lessons the way a plain nbclient (``pytest --nbmake``,
``jupyter nbconvert --execute``) does, with its stand-in for ``ipywidgets.Output``: the
configuration in which the stall was found, to compare. ``--record FILE`` appends one JSON line
per lesson run as it finishes (so a long benchmark that is stopped keeps what it measured);
``--table FILE`` prints the table of such a file without running anything. ``--synthetic N``
runs, instead of the lessons, the bug alone: N cells that each fill an Output widget, once with
``with out: display(fig)`` and once with ``show_in`` (a stall rate of a few in a hundred cells
needs a hundred cells to show; ``--timeout 10`` keeps each stall short).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LESSONS = ROOT / "lessons"
OUTLIER_RATIO, OUTLIER_MIN_S = 3.0, 2.0
AT_TIMEOUT_SLACK_S = 1.0


def lesson_scripts(which: str | None) -> list[Path]:
    """The lesson scripts, all of them or those whose number is in ``which`` ("03,10"); an entry
    that names a ``.py`` file is that script (an older version of a lesson, to compare)."""
    scripts = sorted(LESSONS.glob("[0-9][0-9]_*.py"))
    if which:
        files = [Path(w.strip()) for w in which.split(",") if w.strip().endswith(".py")]
        if files:
            return files
        wanted = {w.strip().zfill(2) for w in which.split(",") if w.strip()}
        scripts = [s for s in scripts if s.name[:2] in wanted]
        missing = wanted - {s.name[:2] for s in scripts}
        if missing:
            raise SystemExit(f"no lesson numbered {', '.join(sorted(missing))} in {LESSONS}")
    return scripts


def synthetic(cells: int) -> dict:
    """Two notebooks of ``cells`` cells that each fill an Output widget with a plotly figure: one
    the way that stalls (``with out: display(fig)``), one with ``show_in`` -- the bug alone."""
    from nbformat.v4 import new_code_cell, new_notebook
    setup = ("import ipywidgets as W\nimport plotly.graph_objects as go\n"
             "from IPython.display import display\nfrom workbook.lessons import show_in")
    bodies = {"synthetic_with_out": "o = W.Output()\nwith o:\n    display(go.Figure(go.Bar(y=[{i}])))\n"
                                    "display(o)",
              "synthetic_show_in": "o = W.Output()\nshow_in(o, go.Figure(go.Bar(y=[{i}])))\ndisplay(o)"}
    return {name: new_notebook(cells=[new_code_cell(setup)]
                               + [new_code_cell(body.format(i=i)) for i in range(cells)])
            for name, body in bodies.items()}


def run_lesson(script: Path, timeout: float, output_widget: bool, nb=None) -> dict:
    """One headless run of one lesson (or of the notebook ``nb``, named ``script``):
    {"lesson", "total_s", "cells": {index: seconds}, "unfinished": {index: seconds}, "error"}
    (``unfinished``: the cell that was running when an error or a timeout stopped the run)."""
    import jupytext

    from workbook.lessons import run_headless

    os.environ["WORKBOOK_LESSONS_NO_GRADE"] = "1"     # as test_notebooks.py: the kernel inherits it
    nb = jupytext.read(script) if nb is None else nb
    started: dict[int, float] = {}
    cells: dict[int, float] = {}

    def on_execute(cell, cell_index, **_):
        started[cell_index] = time.perf_counter()

    def on_executed(cell, cell_index, **_):
        cells[cell_index] = time.perf_counter() - started[cell_index]

    hooks = dict(on_cell_execute=on_execute, on_cell_executed=on_executed)
    error = None
    t0 = time.perf_counter()
    try:
        if output_widget:                       # plain nbclient, its Output stand-in included
            from nbclient import NotebookClient
            NotebookClient(nb, timeout=timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(LESSONS)}}, **hooks).execute()
        else:
            run_headless(nb, timeout, path=LESSONS, **hooks)
    except Exception as exc:                    # a timeout or an error: recorded, the loop goes on
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc) else ''}"
    unfinished = {i: time.perf_counter() - started[i] for i in started.keys() - cells.keys()}
    return {"lesson": script.stem, "total_s": time.perf_counter() - t0,
            "cells": {str(i): round(t, 3) for i, t in sorted(cells.items())},
            "unfinished": {str(i): round(t, 3) for i, t in unfinished.items()}, "error": error}


def _split(rec: dict) -> tuple[dict, dict]:
    """A record's finished and unfinished cells (records written before ``unfinished`` existed
    counted the cell running at an error among the others: it is the last one)."""
    if "unfinished" in rec or not rec.get("error") or not rec["cells"]:
        return rec["cells"], rec.get("unfinished", {})
    last = max(rec["cells"], key=int)
    return {i: t for i, t in rec["cells"].items() if i != last}, {last: rec["cells"][last]}


def lesson_rows(records: list[dict], timeout: float) -> list[dict]:
    """The table's rows, one per lesson, from the run records."""
    rows = []
    for lesson in sorted({r["lesson"] for r in records}):
        runs = [r for r in records if r["lesson"] == lesson]
        done = [_split(r)[0] for r in runs]              # cell -> seconds, finished cells only
        stopped = [_split(r)[1] for r in runs]
        per_cell: dict[str, list[float]] = {}
        for cells in done:
            for i, t in cells.items():
                per_cell.setdefault(i, []).append(t)
        median = {i: statistics.median(ts) for i, ts in per_cell.items()}
        slow_i, slow_t = max(((i, max(ts)) for i, ts in per_cell.items()), key=lambda x: x[1],
                             default=("-", 0.0))
        outliers = [(r_no, i, t) for r_no, cells in enumerate(done) for i, t in cells.items()
                    if t > OUTLIER_RATIO * median[i] and t > OUTLIER_MIN_S]
        # finished at the timeout: the reply was there all along (the stall); still running at
        # the timeout: the work itself outran it (a slow machine, not a stall)
        stalled = [(r_no, i, t) for r_no, cells in enumerate(done) for i, t in cells.items()
                   if t >= timeout - AT_TIMEOUT_SLACK_S]
        timed_out = [(r_no, i, t) for r_no, cells in enumerate(stopped) for i, t in cells.items()
                     if t >= timeout - AT_TIMEOUT_SLACK_S]
        rows.append({"lesson": lesson, "runs": len(runs),
                     "median_s": statistics.median(r["total_s"] for r in runs),
                     "max_s": max(r["total_s"] for r in runs),
                     "slowest": (slow_i, slow_t, median.get(slow_i, 0.0)),
                     "outliers": outliers, "stalled": stalled, "timed_out": timed_out,
                     "errors": [(r_no, r["error"]) for r_no, r in enumerate(runs)
                                if r["error"] and not r["error"].startswith("CellTimeoutError")]})
    return rows


def print_table(rows: list[dict], timeout: float) -> bool:
    """Print the table, then each outlier, timeout and error; True when any of them happened."""
    print(f"\n{'lesson':<24}{'runs':>5}{'median s':>10}{'max s':>8}  {'slowest cell: max / median s':<30}"
          f"{'outliers':>9}{'stalled':>8}{'timed out':>10}{'errors':>7}")
    bad = False
    for row in rows:
        i, t, m = row["slowest"]
        print(f"{row['lesson']:<24}{row['runs']:>5}{row['median_s']:>10.1f}{row['max_s']:>8.1f}  "
              f"{f'cell {i}: {t:.2f} / {m:.2f}':<30}{len(row['outliers']):>9}"
              f"{len(row['stalled']):>8}{len(row['timed_out']):>10}{len(row['errors']):>7}")
        bad |= bool(row["outliers"] or row["stalled"] or row["timed_out"] or row["errors"])
    for row in rows:
        where = lambda r_no, i: f"{row['lesson']} run {r_no + 1}, cell {i}"    # noqa: E731
        for r_no, i, t in row["outliers"]:
            print(f"  outlier: {where(r_no, i)}: {t:.1f} s")
        for r_no, i, t in row["stalled"]:
            print(f"  STALLED: {where(r_no, i)}: {t:.1f} s, done only when the {timeout:g} s timeout fired")
        for r_no, i, t in row["timed_out"]:
            print(f"  timed out: {where(r_no, i)}: still running after {t:.1f} s (slow work, not a stall)")
        for r_no, e in row["errors"]:
            print(f"  error: {row['lesson']} run {r_no + 1}: {e}")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs of each lesson (default 3)")
    ap.add_argument("--lessons", help="lesson numbers, comma-separated (default: every lesson), "
                    "or paths of lesson scripts")
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="per-cell timeout, s (default 120: a stalled cell waits exactly this long; "
                    "the slowest lesson cell takes 35 s on a quiet 2-core machine)")
    ap.add_argument("--nbclient-output-widget", action="store_true",
                    help="run as plain nbclient/nbmake do, with its Output-widget stand-in")
    ap.add_argument("--synthetic", type=int, metavar="N",
                    help="instead of the lessons, two notebooks of N widget cells: `with out:` and show_in")
    ap.add_argument("--record", type=Path, help="append one JSON line per lesson run to this file")
    ap.add_argument("--table", type=Path, help="print the table of a --record file; run nothing")
    args = ap.parse_args(argv)

    if args.table:
        records = [json.loads(line) for line in args.table.read_text().splitlines() if line.strip()]
        timeout = records[0].get("timeout", args.timeout) if records else args.timeout
        return int(print_table(lesson_rows(records, timeout), timeout))

    notebooks = {}
    if args.synthetic:
        notebooks = synthetic(args.synthetic)
        scripts = [Path(name) for name in notebooks]
    else:
        scripts = lesson_scripts(args.lessons)
    mode = "plain nbclient (Output stand-in)" if args.nbclient_output_widget else "run_headless"
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}: {len(scripts)} lessons x "
          f"{args.runs} runs, cell timeout {args.timeout:g} s, {mode}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    records = []
    for run in range(1, args.runs + 1):        # run by run, so a stopped benchmark covers every lesson
        for script in scripts:
            nb = notebooks.get(str(script))
            rec = run_lesson(script, args.timeout, args.nbclient_output_widget,
                             nb=None if nb is None else copy.deepcopy(nb))
            rec["run"], rec["timeout"] = run, args.timeout
            records.append(rec)
            if args.record:
                with args.record.open("a") as fh:
                    fh.write(json.dumps(rec) + "\n")
            slow = max(rec["cells"].items(), key=lambda x: x[1], default=("-", 0.0))
            print(f"run {run:>2} {rec['lesson']:<24}{rec['total_s']:7.1f} s  slowest cell {slow[0]}: "
                  f"{slow[1]:.1f} s" + (f"  ERROR {rec['error']}" if rec["error"] else ""), flush=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}: done; "
          f"load average {os.getloadavg()[0]:.2f}")
    return int(print_table(lesson_rows(records, args.timeout), args.timeout))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
