"""A standalone HTML report of one run.

The report is one file that opens in any browser, offline: plotly.js is
inlined (about 4.5 MB), so it can be mailed to a student or attached to a
grade.  It shows

* where the numbers come from -- ``simulated link: <preset>`` for CPU runs
  on the workbook's modelled interconnect, the hardware's name otherwise
  (taken from the ``run.json`` written beside the traces);
* the per-rank metrics (step, compute, communication, overlap, exposed
  communication, wait, idle), and, when the run has several steps (``ProfilerStep#N``: two
  builds of a comparison traced into one file), each step's own, which the sum would average;
* the collectives each rank ran, with their count and bytes, and the ranges that issued them;
* the timeline of :func:`workbook.trace.view.timeline_figure`, a dashed line where each step
  begins.

Very large traces would make a very large page, so above ``max_events``
drawable spans the timeline shows a single step (the middle one) and says so.
"""

from __future__ import annotations

import html
from collections import Counter
from pathlib import Path

import numpy as np

from . import intervals as iv
from .analyse import analyse, anchor_times, step_metrics
from .classify import COMM, COMPUTE, LATE, MEMCPY, WAIT, classify, collective_of, is_phase_range
from .load import as_run
from .view import metrics_table_html, steps_table_html, timeline_figure

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 10px; text-align: right; }
th { background: #f2f2f2; }
.source { font-size: 1.1em; padding: 6px 10px; background: #fff6e0; display: inline-block; }
"""


def collectives_table_html(run) -> str:
    """Per collective: calls and bytes on every rank, and the ``record_function`` ranges that
    issued them on the first rank (so ten barriers read as one timed barrier and nine that
    line the ranks up, not as a miscount)."""
    per_rank = {t.rank: analyse(t).collectives for t in run.traces}
    names = sorted({n for c in per_rank.values() for n in c})
    if not names:
        return "<p>No collective communication was recorded.</p>"
    first = run.traces[0]
    where = issued_in(first)
    head = ("<tr><th>collective</th>" + "".join(f"<th>rank {r}<br>calls · bytes</th>"
                                               for r in per_rank)
            + f"<th>issued in (rank {first.rank})</th></tr>")
    rows = []
    for n in names:
        cells = []
        for c in per_rank.values():
            d = c.get(n)
            if d is None:
                cells.append("<td>–</td>")
            else:
                b = "bytes unknown" if d["bytes"] is None else f"{d['bytes']:,} B"
                cells.append(f"<td>{d['count']} · {b}</td>")
        ranges = ", ".join(f"{k} in {html.escape(p) if p else 'no range'}"
                           for p, k in where.get(n, Counter()).most_common(_MAX_PLACES))
        rows.append(f"<tr><td>{html.escape(n)}</td>{''.join(cells)}"
                    f"<td style='text-align:left'>{ranges}</td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


_MAX_PLACES = 4          # ranges listed per collective
_MAX_RANGE_NAMES = 500   # beyond this many distinct range names, skip the "issued in" column


def issued_in(t) -> dict[str, Counter]:
    """``{collective: Counter({range name: calls})}``: the innermost user
    ``record_function`` range (same rule as ``within=``: the range that contains the call's
    issue time) of each collective call of one rank; ``""`` for calls outside every range."""
    kinds = classify(t)
    comm = np.flatnonzero(kinds == COMM)
    at = anchor_times(t)[comm]
    ranges = is_phase_range(t)
    names = np.unique(t.name_id[ranges])
    best_name = np.full(comm.size, -1)
    best_start = np.full(comm.size, -np.inf)
    if names.size <= _MAX_RANGE_NAMES:
        for ni in names.tolist():      # nested ranges start later: the latest start is innermost
            mask = ranges & (t.name_id == ni)
            starts, ends = iv.union(t.ts[mask], t.end[mask])
            k = np.searchsorted(starts, at, side="right") - 1
            inside = (k >= 0) & (at <= ends[np.maximum(k, 0)])
            better = inside & (starts[np.maximum(k, 0)] > best_start)
            best_name[better], best_start[better] = ni, starts[k[better]]
    out: dict[str, Counter] = {}
    for i, ni in zip(comm.tolist(), best_name.tolist()):
        out.setdefault(collective_of(t, i), Counter())[t.names[ni] if ni >= 0 else ""] += 1
    return out


def write_report(run_dir_or_traces, out_html, max_events: int = 200_000) -> Path:
    """Write the HTML report of a run directory (or loaded traces) to ``out_html``."""
    run = as_run(run_dir_or_traces)
    drawable = sum(int(np.isin(classify(t), (COMPUTE, COMM, MEMCPY, WAIT, LATE)).sum())
                   for t in run.traces)
    step, note = None, ""
    if drawable > max_events:
        steps = sorted({s.step for t in run.traces for s in step_metrics(t)})
        step = steps[len(steps) // 2]
        note = (f"<p>The run has {drawable:,} spans; the timeline shows step {step} only "
                f"(use <code>workbook trace merge</code> and Perfetto for everything).</p>")
    fig = timeline_figure(run, step=step)
    meta = run.meta
    title = f"Trace report — {meta.get('lab', '')} {meta.get('run_id', '')}".strip(" —")
    nsteps = len(step_metrics(run.traces[0]))
    per_step = ""
    if any(len(step_metrics(t)) > 1 for t in run.traces):
        per_step = f"""<h2>Each step</h2>
<p>The run has several steps (<code>ProfilerStep#N</code>): the table above sums them, which
averages different builds into a figure that is neither's. Here each step has its own; the
timeline marks where each begins. <code>workbook trace summary RUN_DIR --step N</code> prints one.</p>
{steps_table_html(run)}"""
    facts = [f"ranks: {len(run)}", f"steps: {nsteps}"]
    for k in ("backend", "torch"):
        if meta.get(k):
            facts.append(f"{k}: {html.escape(str(meta[k]))}")
    warn = "".join(f"<p style='color:#a00'>warning: {html.escape(w)}</p>" for w in run.warnings)
    body = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{_CSS}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p class="source">{html.escape(run.label())}</p>
<p>{' · '.join(facts)}</p>{warn}
<h2>Per-rank metrics</h2>
<p>Times in microseconds, summed over the profiled steps. Overlap % is the share of
communication time during which the same rank computes; exposed communication is the rest.
Late-peer time is the total of the yellow <i>link: peers late</i> spans (an op's modelled
transfer was over, a peer had not issued it yet); the column after it is the part of the exposed
communication that fell inside those spans, which is 0 when the rank waited out each op before
issuing the next one. Hover over a column's header for its definition.</p>
{metrics_table_html(run)}{per_step}
<h2>Collectives</h2>
<p>Every collective call counted once per rank, on the track that carried it (the simulated
link; gloo's own thread without a link; the NCCL kernel on a GPU), with the bytes the trace
recorded for it (the simulated link records the whole n-rank buffer of gather- and scatter-type
ops, as nccl-tests does; a barrier moves none). The last column says which
<code>record_function</code> range issued the calls.</p>
{collectives_table_html(run)}
<h2>Timeline</h2>
{note}
{fig.to_html(full_html=False, include_plotlyjs=True)}
</body></html>
"""
    out = Path(out_html)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(body, encoding="utf-8")
    return out
