"""What the lessons of the overlap families ask and draw alike: is the lab usable yet, what did a
rank do and when, and the bars that show it.

Lessons 9 to 11 (data, pipeline and context parallelism) check the learner's lab before they
measure it, run steps on warm ranks, and draw what each rank did as horizontal bars on rows: its
compute, the link, its waiting. The pieces are written once here, with parameters; each family's
lesson helper (``dp_overlap_lesson``, ``pp_overlap_lesson``, ``cp_ring_lesson``) builds its
figures and tables from them.

* Is the lab usable? ``verdict_of`` (an exception as one line), ``probe`` (a check on ranks, one
  verdict per part), ``whose_code`` (the learner's lab or the reference), ``yours_or_reference``
  (a piece checked on the spot, no ranks).
* On a rank: ``ms_now`` (the clock the ranks share), ``link_ops`` (the link's log as plain data,
  in ms), ``timed`` (a wrapper that notes when each call ran), ``overlap_summary`` (what the
  trace says of a pass, as plain data).
* Printing and drawing: ``print_table`` (rows of figures, fixed width), ``span`` (one bar),
  ``link_bars`` (each op queued, carried, waited for), ``legend_keys``, ``lanes_figure`` (rows
  of coloured spans), ``live_figure`` (widgets that redraw a figure), and ``full_speed`` (a
  preset's link at the real GPU's FLOP rate, for the "at the real machine's scale" figures).

A layer: it imports ``workbook.trace``, ``workbook.runtime`` and ``workbook.link`` below it, never
a family or the grader; plotly and ipywidgets are imported where a figure is drawn.
"""
from __future__ import annotations

import time

from workbook.runtime.messages import first_line
from workbook.trace import colors

BACKWARD = "#56B4E9"            # a backward pass is compute too: a lighter blue than a forward
ACCEPT_RUNS = ("ok", "WRONG")   # verdicts of code that runs to the end (right or wrong)


# --------------------------------------------------------------------------- is the lab usable?
def verdict_of(exc: BaseException) -> str:
    """An exception as a verdict: its type and the first line of its message."""
    return f"{type(exc).__name__}: {first_line(str(exc))}"


def probe(check, n: int, *args, keys, timeout: float = 60.0) -> dict:
    """``check(*args)`` on ``n`` warm ranks, each returning ``{key: verdict}`` (``"ok"``,
    ``"WRONG: ..."`` or an error): per key, the first verdict of any rank that is not ``"ok"``.
    A crash or a hang (past ``timeout`` s) gives every key its message."""
    from workbook.runtime.launch import on_ranks
    try:
        per_rank = on_ranks(check, n, *args, timeout=timeout)
    except Exception as exc:                     # noqa: BLE001 - unfinished work is expected here
        return dict.fromkeys(keys, verdict_of(exc))
    return {k: next((r.get(k, "missing from the lab") for r in per_rank if r.get(k) != "ok"), "ok")
            for k in keys}


def whose_code(verdicts: dict, names, accept=ACCEPT_RUNS) -> tuple[str, str]:
    """``("labs", "your")`` where every named part's verdict starts with one of ``accept``, else
    ``("solutions", "the REFERENCE")``: which implementation a figure shows, and its label."""
    runs = all(verdicts.get(v, "").split(":")[0] in accept for v in names)
    return ("labs", "your") if runs else ("solutions", "the REFERENCE")


def yours_or_reference(what: str, yours, reference, problem_of, lab_file: str):
    """``(thing, whose)``: ``yours`` where ``problem_of(yours)`` finds nothing wrong (None), else
    ``reference``; prints which, and why."""
    try:
        problem = problem_of(yours)
    except Exception as exc:                     # noqa: BLE001 - unfinished work is expected here
        problem = verdict_of(exc)
    if problem:
        print(f"your {what}: {problem}\n  -> this lesson uses the REFERENCE {what} "
              f"({lab_file}) until yours works; run the cells again when it does.")
        return reference, "the REFERENCE"
    print(f"your {what} works: the cells below use it")
    return yours, "your"


# --------------------------------------------------------------------------- on a rank
def ms_now() -> float:
    """``perf_counter`` in ms: a clock the rank processes of one machine share."""
    return time.perf_counter_ns() / 1e6


def link_ops(since: int = 0, t0_ms: float = 0.0, kinds=None) -> list[dict]:
    """The link's log (``workbook.link.op_log()``) from entry ``since`` on, as plain data in ms
    after ``t0_ms``: ``op``, ``bytes``, ``issued``, ``start`` (the link began carrying it),
    ``end``, ``modelled`` (a duration) and ``waited`` (first waited for; None: never). ``kinds``:
    only these ops (e.g. ``("send", "recv")``)."""
    from workbook import link
    ms = lambda ns: ns / 1e6 - t0_ms                                      # noqa: E731
    return [{"op": r.op, "bytes": r.size_bytes, "issued": ms(r.issued_ns), "start": ms(r.start_ns),
             "end": ms(r.end_ns), "modelled": r.modelled_ns / 1e6,
             "waited": ms(r.first_wait_ns) if r.first_wait_ns else None}
            for r in link.op_log()[since:] if kinds is None or r.op in kinds]


def timed(fn, note):
    """``fn`` wrapped: each call runs it, then ``note(args, kwargs, start_ms, end_ms)``
    (``ms_now``), also when it raises."""
    def wrapper(*args, **kwargs):
        t0 = ms_now()
        try:
            return fn(*args, **kwargs)
        finally:
            note(args, kwargs, t0, ms_now())
    return wrapper


def overlap_summary(o) -> dict:
    """A ``trace.overlap`` result as plain data: ``pct`` hidden, ``pct_ex_skew`` (skew counted as
    hidden), ``comm_ms``, ``exposed_ms``, ``skew_ms``."""
    return {"pct": o.overlap_pct, "pct_ex_skew": o.overlap_pct_ex_skew, "comm_ms": o.comm_us / 1e3,
            "exposed_ms": o.exposed_comm_us / 1e3, "skew_ms": o.skew_us / 1e3}


# --------------------------------------------------------------------------- printing, drawing
def print_table(rows, columns) -> None:
    """``rows`` (dicts) as a fixed-width table: ``columns`` is ``[(header, width, template)]``,
    each cell ``template.format(**row)`` right-aligned in ``width`` characters."""
    print("".join(f"{header:>{width}}" for header, width, _ in columns))
    for row in rows:
        print("".join(f"{template.format(**row):>{width}}" for _, width, template in columns))


def full_speed(preset: str):
    """The link of ``preset`` at the real GPU's own FLOP rate (not this CPU's slow motion)."""
    from workbook import link
    return link.make_link(preset, link.PRESETS[preset].peak_tflops * 1e12)


def add(fig, trace, row=None) -> None:
    """``trace`` into subplot ``row`` of ``fig`` (a plain figure: ``row=None``)."""
    fig.add_trace(trace, row=row, col=1) if row else fig.add_trace(trace)


def span(x0: float, x1: float, y: str, color: str, hover: str, text: str = ""):
    """One horizontal bar from ``x0`` to ``x1`` on row ``y``, ``text`` inside, ``hover`` on it."""
    import plotly.graph_objects as go
    return go.Bar(x=[x1 - x0], base=[x0], y=[y], orientation="h", width=0.6, text=text,
                  textposition="inside", textangle=0, insidetextanchor="middle",
                  marker=dict(color=color, line=dict(color="white", width=1)),
                  hovertemplate=hover + "<extra></extra>", showlegend=False)


def link_bars(fig, ops, y: str, *, row=None, exposed_from=None, tint=None, names=None,
              text=None) -> None:
    """Each op of ``ops`` (``link_ops``) on row ``y``: a dotted line while it was posted but
    queued behind the op before it, then a bar while the link carried it. The part carried after
    ``exposed_from(op)`` (a time in ms; None: no such part) is red: the rank was waiting for it.
    ``tint``: a colour per op name (default orange); ``names[k]``: what op k carried (hover);
    ``text(op, k)``: a label inside the bar's hidden part."""
    import plotly.graph_objects as go
    for k, o in enumerate(ops):
        what = names[k] if names and k < len(names) else f"{o['op']} #{k}"
        hover = (f"{what}<br>{o['bytes'] / 1024:.0f} KiB, modelled {o['modelled']:.1f} ms<br>"
                 f"posted {o['issued']:.0f} ms, carried {o['start']:.0f}-{o['end']:.0f} ms")
        color = (tint or {}).get(o["op"], colors.COMMUNICATION)
        if o["start"] > o["issued"] + 0.05:
            add(fig, go.Scatter(x=[o["issued"], o["start"]], y=[y, y], mode="lines",
                                line=dict(color=color, width=1, dash="dot"),
                                hoverinfo="skip", showlegend=False), row)
        after = exposed_from(o) if exposed_from else None
        cut = o["end"] if after is None else min(max(after, o["start"]), o["end"])
        for a, b, c, label in ((o["start"], cut, color, text(o, k) if text else ""),
                               (cut, o["end"], colors.EXPOSED, "")):
            if b > a:
                add(fig, span(a, b, y, c, hover, label), row)


def legend_keys(fig, y: str, keys: dict) -> None:
    """A legend entry per ``{name: colour}``, drawn as empty bars on row ``y``."""
    import plotly.graph_objects as go
    for name, color in keys.items():
        fig.add_trace(go.Bar(x=[None], y=[y], name=name, marker_color=color, orientation="h"))


def lanes_figure(rows: dict, title: str, kind_colors: dict, xtitle: str = "time", thin=()):
    """Rows of spans, top to bottom: ``rows`` is ``{row label: [(start, end, kind, text)]}``, one
    bar a span, coloured by ``kind_colors[kind]`` (kinds not listed are not drawn); the hover says
    the kind, the text and the span's times. The kinds in ``thin`` (transfers, say) get thinner
    bars than the others."""
    import plotly.graph_objects as go
    fig = go.Figure()
    labels = list(rows)
    for kind, color in kind_colors.items():
        spans = [(r, a, z, txt) for r in labels for a, z, k, txt in rows[r] if k == kind]
        if not spans:
            continue
        fig.add_trace(go.Bar(
            y=[r for r, *_ in spans], base=[a for _, a, _, _ in spans],
            x=[z - a for _, a, z, _ in spans], orientation="h", name=kind,
            marker=dict(color=color, line=dict(color="white", width=0.5)),
            text=[txt for *_, txt in spans], textposition="inside", insidetextanchor="middle",
            textangle=0, customdata=[[txt, a, z] for _, a, z, txt in spans],
            width=0.5 if kind in thin else 0.8,
            hovertemplate=f"{kind} %{{customdata[0]}}: %{{customdata[1]:.2f}} to "
                          "%{customdata[2]:.2f}<extra></extra>"))
    fig.update_yaxes(categoryorder="array", categoryarray=labels[::-1])
    fig.update_layout(title=title, barmode="overlay", height=130 + 32 * len(labels),
                      xaxis_title=xtitle, plot_bgcolor="white",
                      uniformtext=dict(minsize=7, mode="hide"),
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
                      margin=dict(l=10, r=10, t=80, b=40))
    return fig


def live_figure(draw, controls: dict, layout):
    """A panel of widgets over an output that ``draw(**values)`` fills (it may print; a figure it
    returns is shown), drawn now and again whenever a control changes. ``controls``:
    ``{argument: widget}``; ``layout``: the rows of the panel, each a list of arguments.

    What ``draw`` prints is collected and shown with its figure by ``show_in``, never captured
    by ``with out:`` (which stalls headless runs: docs/headless-lessons.md)."""
    import contextlib
    import io

    import ipywidgets as W

    from workbook.trace.view import show_in
    out = W.Output()

    def redraw(_=None):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            fig = draw(**{name: w.value for name, w in controls.items()})
        show_in(out, printed.getvalue() or None, fig)

    for w in controls.values():
        w.observe(redraw, names="value")
    redraw()
    return W.VBox([W.HBox([controls[name] for name in row]) for row in layout] + [out])
