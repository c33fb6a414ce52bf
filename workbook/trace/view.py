"""Viewing traces: plotly timelines and a notebook explorer.

A timeline has one row per (rank, track): a host thread, a CUDA stream, the
simulated link.  Each span is coloured by what kind of time it is (the
course palette of :mod:`workbook.trace.colors`), and below each rank a thin row
marks in red its *exposed* communication -- the stretches during which the
rank communicates and computes nothing.  Hovering a span shows its name,
duration, thread and kind of time and, for communication, the bytes it moved;
a bar wide enough for it also carries its name as a label.

Only *top-level* spans are drawn: an ``aten::addmm`` nested inside an
``aten::linear`` would be hidden behind it anyway.  Only rows that carry work
are drawn: a thread with no compute, communication, memory-copy, wait or
late-peer span (gloo's ``pt_gloo_runloop`` threads on the simulated link, whose
spans are the real transfer underneath the modelled one) gets no row.

A trace of several steps (``ProfilerStep#N``: two builds of a comparison traced into one file,
or the iterations of a training loop) gets a dashed line where each step begins, labelled with
its number and the ranges it holds, and :func:`steps_table_html` gives each step its own row.

The explorer redraws through :func:`live_output` (an output area redrawn when
a control changes), which the lessons use for their own interactive figures;
:func:`show_in` puts figures and text in an output area.

Why :func:`show_in` and not ``with out: display(fig)``
------------------------------------------------------
Inside ``with out:`` an ``ipywidgets.Output`` *captures*: it tells the front end
"the outputs of this request are mine", and the front end files them in the widget
and sends the widget's new state back to the kernel.  A headless runner (nbclient,
used by the notebook tests, ``pytest --nbmake``, ``jupyter nbconvert --execute``,
papermill) plays that front end, and the message it sends back on the shell
channel, while it is waiting on that very channel for the cell's reply,
sometimes makes it miss the reply: the cell then finishes only when the per-cell
timeout runs out (https://github.com/jupyter/nbclient/issues/312; measured in
docs/headless-lessons.md).  :func:`show_in` writes the area's content directly
(its ``outputs`` state, as ``Output.append_display_data`` does), so nothing is
captured and no runner has anything to send back; JupyterLab shows the same.

Drawing many spans
------------------
A plotly "shape" per span becomes unusable after a few thousand.  Small
timelines use one horizontal bar chart per kind of time (``go.Bar`` with
``base=`` the start and ``x=`` the duration); beyond about 5,000 spans each
kind becomes a single WebGL line trace (``go.Scattergl``) whose segments are
separated by ``None`` -- hundreds of thousands of spans stay responsive.
WebGL hover finds points, not lines, so each segment has a point at its start,
middle and end, all three with the span's hover text; it draws no labels.
Bars are labelled with plotly's own rule: ``textposition="inside"`` and
``uniformtext`` mode ``"hide"`` drop every label that would not fit its bar at
the minimum font size, so narrow bars stay clean.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape as html_escape

import numpy as np

from workbook.trace import colors
from . import intervals as iv
from .analyse import all_compute, analyse, step_metrics
from .classify import (COMM, COMPUTE, KINDS, LATE, MEMCPY, WAIT, canonical_collective, classify,
                       collective_of)
from .load import Trace, TraceError, as_run

BAR_LIMIT = 5000
_DRAWN = (COMPUTE, COMM, MEMCPY, WAIT, LATE)


def _top_level(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Indices (into the given arrays) of spans not nested in an earlier one."""
    if starts.size == 0:
        return np.empty(0, dtype=np.int64)
    order = np.lexsort((-ends, starts))
    e = ends[order]
    prev_max = np.concatenate([[-np.inf], np.maximum.accumulate(e)[:-1]])
    return order[starts[order] >= prev_max]


@dataclass
class _Spans:
    """The spans of one kind of time, gathered row by row before they are drawn."""
    starts: list = field(default_factory=list)   # arrays of start times (µs)
    ends: list = field(default_factory=list)     # arrays of end times
    rows: list = field(default_factory=list)     # arrays of row numbers
    hover: list = field(default_factory=list)    # one hover text per span
    labels: list = field(default_factory=list)   # one bar label per span

    def add(self, row: int, starts: np.ndarray, ends: np.ndarray, hover, labels) -> None:
        self.starts.append(starts)
        self.ends.append(ends)
        self.rows.append(np.full(starts.size, row))
        self.hover.extend(hover)
        self.labels.extend(labels)


def _window(t: Trace, step) -> tuple[float, float]:
    if step is None:
        return float(t.ts.min()), float(t.end.max())
    for s in step_metrics(t):
        if s.step == step:
            return s.start_us, s.end_us
    raise TraceError(f"{t.path}: no step {step}")


def timeline_figure(traces, ranks=None, step=None, t0: float | None = None,
                    t1: float | None = None, title: str | None = None):
    """A plotly timeline of the chosen ranks (all by default).

    ``step`` shows only ``ProfilerStep#<step>``; ``t0``/``t1`` zoom to a time
    range, in microseconds from the start of what is shown.  Ranks are
    aligned on the profiler's clock (ranks of one host share it).
    """
    import plotly.graph_objects as go

    run = as_run(traces)
    chosen = [t for t in run.traces if ranks is None or t.rank in set(ranks)]
    if not chosen:
        raise TraceError(f"no trace for ranks {ranks} (ranks: {run.ranks})")
    windows = {id(t): _window(t, step) for t in chosen}
    zero = min(t.origin_us + windows[id(t)][0] for t in chosen)
    rows: list[str] = []
    spans = {kind: _Spans() for kind in ("compute", "communication", "memcpy", "wait",
                                         "late peer", "exposed")}

    for t in chosen:
        kinds = classify(t)
        w0, w1 = windows[id(t)]
        shift = t.origin_us - zero
        lo = -np.inf if t0 is None else t0 - shift
        hi = np.inf if t1 is None else t1 - shift
        sel = np.isin(kinds, _DRAWN) & (t.end >= max(w0, lo)) & (t.ts <= min(w1, hi))
        for tr in np.unique(t.track_id[sel]).tolist():      # a track with no work gets no row
            idx = np.flatnonzero(sel & (t.track_id == tr))
            # Outermost spans only, except waits: a wait nested in an operator (an autograd
            # function that blocks on its all-reduce) is drawn over it, as the metrics count it.
            waits = kinds[idx] == WAIT
            other, wait = idx[~waits], idx[waits]
            idx = np.concatenate([other[_top_level(t.ts[other], t.end[other])],
                                  wait[_top_level(t.ts[wait], t.end[wait])]])
            row = len(rows)
            thread = t.tracks[tr].name
            rows.append(f"rank {t.rank} · {thread}")
            for code in _DRAWN:
                k = idx[kinds[idx] == code]
                if k.size == 0:
                    continue
                ks = k.tolist()
                spans[KINDS[code]].add(row, t.ts[k] + shift, t.end[k] + shift,
                                       [_hover(t, i, code, thread) for i in ks],
                                       [_label(t, i, code) for i in ks])
        m = analyse(t, step=step)
        if m.comm_us > 0:
            comm = iv.union(t.ts[sel & (kinds == COMM)], t.end[sel & (kinds == COMM)])
            exp = iv.subtract(comm, all_compute(t))
            if exp[0].size:
                row = len(rows)
                rows.append(f"rank {t.rank} · exposed comm")
                spans["exposed"].add(
                    row, exp[0] + shift, exp[1] + shift,
                    [f"<b>exposed communication</b><br>{e - s:,.1f} µs<br>rank {t.rank}: "
                     "communicating, computing nothing" for s, e in zip(*exp)], [""] * exp[0].size)

    total = sum(len(sp.hover) for sp in spans.values())
    draw = _bars if total <= BAR_LIMIT else _webgl_lines
    fig = go.Figure()
    for kind, sp in spans.items():
        if sp.starts:
            s, e, y = np.concatenate(sp.starts), np.concatenate(sp.ends), np.concatenate(sp.rows)
            fig.add_trace(draw(go, kind, s, e, y, sp.hover, sp.labels))
    label = run.label()
    what = f"step {step}" if step is not None else "all steps"
    fig.update_layout(
        title=title or f"Timeline ({what}) — {label}", barmode="overlay",
        # rows 40 px apart leave a bar room for a 10 px label; one that does not fit is hidden
        xaxis_title="time (µs)", height=max(250, 110 + 40 * len(rows)), hovermode="closest",
        uniformtext=dict(minsize=8, mode="hide"),
        yaxis=dict(tickmode="array", tickvals=list(range(len(rows))), ticktext=rows,
                   autorange="reversed"),
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
        margin=dict(l=10, r=10, t=70, b=40))
    if step is None:
        _draw_step_splits(fig, chosen, zero)
    if t0 is not None or t1 is not None:
        fig.update_xaxes(range=[t0, t1])
    return fig


_MAX_SPLITS = 50         # beyond this many steps the timeline draws no step lines


def step_splits(traces, zero: float = 0.0) -> list[tuple[float, int, str]]:
    """``(x, N, label)`` where each step begins, on the timeline's axis (µs from ``zero``, on
    the profiler's clock): the earliest rank's start of ``ProfilerStep#N``; ``[]`` for a trace
    of one step."""
    first: dict[int, tuple[float, str]] = {}
    for t in traces:
        for s in step_metrics(t):
            x = t.origin_us + s.start_us - zero
            if s.step not in first or x < first[s.step][0]:
                first[s.step] = (x, s.label or first.get(s.step, (0, ""))[1])
    if len(first) < 2:
        return []
    return sorted((x, n, label) for n, (x, label) in first.items())


def _draw_step_splits(fig, traces, zero: float) -> None:
    """A dashed line where each step begins, labelled ``step N: label``."""
    splits = step_splits(traces, zero)
    if len(splits) > _MAX_SPLITS:
        return
    for x, n, label in splits:
        fig.add_vline(x=x, line_dash="dash", line_color="#555", line_width=1,
                      annotation_text=f"step {n}" + (f": {label}" if label else ""),
                      annotation_position="top right", annotation_font_size=10)


# Label colour inside each kind's bars: white on the dark colours, black on the light ones.
_TEXT_COLOR = {"compute": "white", "memcpy": "white", "exposed": "white"}


def _bars(go, kind, s, e, y, hover, labels):
    """One horizontal bar per span, labelled inside where the label fits."""
    return go.Bar(orientation="h", base=s, x=e - s, y=y, name=kind,
                  marker_color=colors.color(kind), hovertext=hover, hoverinfo="text",
                  text=labels, textposition="inside", insidetextanchor="middle",
                  constraintext="inside", textangle=0,
                  textfont=dict(color=_TEXT_COLOR.get(kind, "black"), size=10),
                  width=0.35 if kind == "exposed" else 0.8)


def _webgl_lines(go, kind, s, e, y, hover, labels):
    """All spans of one kind as one WebGL line trace: start, middle, end, gap per span."""
    n = s.size
    xs, yy, tt = (np.empty(4 * n, dtype=object) for _ in range(3))
    xs[0::4], xs[1::4], xs[2::4], xs[3::4] = s, (s + e) / 2, e, None
    for j in range(3):
        yy[j::4], tt[j::4] = y, hover
    yy[3::4] = tt[3::4] = None
    return go.Scattergl(x=xs, y=yy, mode="lines", name=kind, hovertext=tt, hoverinfo="text",
                        line=dict(color=colors.color(kind), width=4 if kind == "exposed" else 10))


def _label(t: Trace, i: int, code: int) -> str:
    """The short name written inside a bar (short, so that more of them fit)."""
    name = t.names[t.name_id[i]]
    if code == COMM:
        return collective_of(t, i)
    if code == LATE:
        return "peers late"
    if code == WAIT:
        return f"wait {canonical_collective(name)}"         # link_wait:barrier -> wait barrier
    return name.split("::", 1)[1] if name.startswith("aten::") else name


def _hover(t: Trace, i: int, code: int, thread: str) -> str:
    name = t.names[t.name_id[i]]
    txt = f"<b>{name}</b><br>{t.dur[i]:,.1f} µs<br>{KINDS[code]} · rank {t.rank} · {thread}"
    if code == COMM:
        b = t.nbytes[i]
        txt += f"<br>{collective_of(t, i)}, " + ("bytes unknown" if np.isnan(b) else f"{int(b):,} B")
    return txt


def metrics_table_html(traces, step=None, ranks=None) -> str:
    """An HTML table of the per-rank metrics (used by the explorer and the report)."""
    run = as_run(traces)
    rows = []
    for t in run.traces:
        if ranks is not None and t.rank not in ranks:
            continue
        m = analyse(t, step=step)
        pct = "–" if m.overlap_pct is None else f"{m.overlap_pct:.1f}"
        cells = (t.rank, m.device, f"{m.step_us:,.1f}", f"{m.compute_us:,.1f}", f"{m.comm_us:,.1f}",
                 pct, f"{m.exposed_comm_us:,.1f}", f"{m.late_us:,.1f}", f"{m.skew_us:,.1f}",
                 f"{m.wait_us:,.1f}", f"{m.idle_us:,.1f}")
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th title='{tip}'>{h}</th>" for h, tip in METRIC_COLUMNS)
    return f"<table class='wb-metrics'><tr>{head}</tr>{''.join(rows)}</table>"


def steps_table_html(traces, ranks=None) -> str:
    """An HTML table with one row per rank and step (used by the report when a trace has several
    steps): each step's own overlap, where the per-rank table sums them."""
    run = as_run(traces)
    rows = []
    for t in run.traces:
        if ranks is not None and t.rank not in ranks:
            continue
        for s in step_metrics(t):
            pct = "–" if s.overlap_pct is None else f"{s.overlap_pct:.1f}"
            cells = (t.rank, s.step, html_escape(s.label) or "–", f"{s.step_us:,.1f}",
                     f"{s.compute_us:,.1f}", f"{s.comm_us:,.1f}", pct, f"{s.exposed_comm_us:,.1f}",
                     f"{s.skew_us:,.1f}", f"{s.idle_us:,.1f}")
            rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th title='{tip}'>{h}</th>" for h, tip in STEP_COLUMNS)
    return f"<table class='wb-steps'><tr>{head}</tr>{''.join(rows)}</table>"


#: The metrics table's columns: (header, what it means -- the header's tooltip).
METRIC_COLUMNS = (
    ("rank", "rank"), ("device", "where the time was measured"),
    ("step µs", "length of the profiled steps"),
    ("compute µs", "union of the compute spans, waits cut out"),
    ("comm µs", "union of the communication spans"),
    ("overlap %", "share of communication time during which the rank computes"),
    ("exposed comm µs", "communication time during which the rank computes nothing"),
    ("late-peer µs", "total of the yellow late-peer spans: an op's modelled transfer was over "
                     "but a peer had not issued it yet"),
    ("exposed comm while a peer was late µs", "the part of the exposed communication that fell "
                                              "inside a late-peer span (skew_us)"),
    ("wait µs", "the compute thread blocked on a collective"),
    ("idle µs", "nothing running on the rank"),
)


#: The steps table's columns.
STEP_COLUMNS = (
    ("rank", "rank"), ("step", "N of ProfilerStep#N"),
    ("ranges", "the outermost record_function ranges inside the step"),
    *(c for c in METRIC_COLUMNS if c[0] in ("step µs", "compute µs", "comm µs", "overlap %",
                                             "exposed comm µs",
                                             "exposed comm while a peer was late µs", "idle µs")),
)


def explorer(traces):
    """A notebook widget: pick ranks, a step and a zoom range; the timeline and
    the metrics table update.  Needs ``ipywidgets``."""
    try:
        import ipywidgets as W
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("explorer() needs ipywidgets: pip install ipywidgets") from exc

    run = as_run(traces)
    steps = sorted({s.step for t in run.traces for s in step_metrics(t)})
    rank_pick = W.SelectMultiple(options=run.ranks, value=tuple(run.ranks), description="ranks")
    step_pick = W.Dropdown(options=[("all", None)] + [(str(s), s) for s in steps], description="step")
    span = max(float(t.end.max() - t.ts.min()) for t in run.traces)
    zoom = W.FloatRangeSlider(value=(0.0, span), min=0.0, max=span, step=span / 1000 or 1.0,
                              description="zoom µs", layout=W.Layout(width="90%"))
    table = W.HTML()

    def draw():
        ranks = list(rank_pick.value) or run.ranks
        table.value = metrics_table_html(run, step=step_pick.value, ranks=ranks)
        lo, hi = zoom.value
        return timeline_figure(run, ranks=ranks, step=step_pick.value,
                               t0=lo if lo > 0 else None, t1=hi if hi < span else None)

    out = live_output(draw, (rank_pick, step_pick, zoom))
    return W.VBox([W.HBox([rank_pick, step_pick]), zoom, table, out])


def live_output(draw, controls):
    """A notebook output area that shows ``draw()`` and draws it again whenever
    one of the ``controls`` (ipywidgets: sliders, pickers) changes value.

    ``draw`` takes no argument and returns what to display (a plotly figure, a
    string, or a tuple of them, shown in order: see :func:`show_in`); it reads the
    controls' ``.value`` itself.  Returns the ``ipywidgets.Output`` to place in a
    layout, e.g. ``W.VBox([W.HBox(controls), out])``.
    """
    import ipywidgets as W

    out = W.Output()

    def redraw(_change=None):
        shown = draw()
        show_in(out, *(shown if isinstance(shown, tuple) else (shown,)))

    for control in controls:
        control.observe(redraw, names="value")
    redraw()
    return out


def show_in(out, *items) -> None:
    """Replace what the output area ``out`` (an ``ipywidgets.Output``) shows by ``items``.

    A string is shown as printed text, anything else as ``display(item)`` would
    show it (a plotly figure, a DataFrame, HTML); ``None`` is skipped.  The area
    changes in one step, with no flicker.  Use it instead of ``with out:
    display(...)``, which stalls headless runs (the module's docstring says why)::

        show_in(out, f"total: {ms:.1f} ms", fig)
    """
    out.outputs = tuple(_output(item) for item in items if item is not None)


def _output(item) -> dict:
    """One item as a notebook output (nbformat's dict): a stream for text, else display data."""
    if isinstance(item, str):
        return {"output_type": "stream", "name": "stdout",
                "text": item if item.endswith("\n") else item + "\n"}
    if hasattr(item, "_repr_mimebundle_"):
        # plotly: the very bundle display(fig) publishes (the same renderers build it); a
        # figure also has _ipython_display_, which IPython's formatter would call, and that
        # would print the figure into the cell instead of returning it
        bundle = item._repr_mimebundle_(include=None, exclude=None)
        data, metadata = bundle if isinstance(bundle, tuple) else (bundle, {})
    else:
        from IPython.core.interactiveshell import InteractiveShell
        data, metadata = InteractiveShell.instance().display_formatter.format(item)
    if not data:                # e.g. plotly rendering to a browser outside Jupyter: say what it is
        data, metadata = {"text/plain": repr(item)}, {}
    return {"output_type": "display_data", "data": data, "metadata": metadata or {}}
