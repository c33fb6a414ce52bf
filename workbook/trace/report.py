"""A standalone HTML report of one run.

The report is one file that opens in any browser, offline: plotly.js is
inlined (about 4.5 MB), so it can be mailed to a student or attached to a
grade.  It shows

* where the numbers come from -- ``simulated link: <preset>`` for CPU runs
  on the workbook's modelled interconnect, the hardware's name otherwise
  (taken from the ``run.json`` written beside the traces);
* the per-rank metrics (step, compute, communication, overlap, exposed
  communication, wait, idle);
* the collectives each rank ran, with their count and bytes;
* the timeline of :func:`workbook.trace.view.timeline_figure`.

Very large traces would make a very large page, so above ``max_events``
drawable spans the timeline shows a single step (the middle one) and says so.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from .analyse import analyse, step_metrics
from .classify import COMM, COMPUTE, MEMCPY, WAIT, classify
from .load import as_run
from .view import metrics_table_html, timeline_figure

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 10px; text-align: right; }
th { background: #f2f2f2; }
.source { font-size: 1.1em; padding: 6px 10px; background: #fff6e0; display: inline-block; }
"""


def collectives_table_html(run) -> str:
    names = sorted({n for t in run.traces for n in analyse(t).collectives})
    if not names:
        return "<p>No collective communication was recorded.</p>"
    head = "<tr><th>rank</th>" + "".join(f"<th>{html.escape(n)}<br>count / bytes</th>"
                                         for n in names) + "</tr>"
    rows = []
    for t in run.traces:
        c = analyse(t).collectives
        cells = []
        for n in names:
            d = c.get(n)
            if d is None:
                cells.append("<td>–</td>")
            else:
                b = "unknown" if d["bytes"] is None else f"{d['bytes']:,}"
                cells.append(f"<td>{d['count']} / {b}</td>")
        rows.append(f"<tr><td>{t.rank}</td>{''.join(cells)}</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def write_report(run_dir_or_traces, out_html, max_events: int = 200_000) -> Path:
    """Write the HTML report of a run directory (or loaded traces) to ``out_html``."""
    run = as_run(run_dir_or_traces)
    drawable = sum(int(np.isin(classify(t), (COMPUTE, COMM, MEMCPY, WAIT)).sum()) for t in run.traces)
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
communication time during which the same rank computes; exposed communication is the rest.</p>
{metrics_table_html(run)}
<h2>Collectives</h2>
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
