"""The capstone's picture of a whole step, from plain data: what one rank's traced step holds
(``step_spans``: its compute, each link operation with the group it ran on, the exposed part),
which group a set of ranks is (``groups_of``), the hidden share and bytes per group, and the
figure (``figure``): per configuration a timeline with a row per rank, compute grey, each
group's transfers in its own colour (``GROUP_COLORS``, from the course's Okabe-Ito palette,
``workbook.trace.colors``), the exposed part a red bar under the row, beside the loss curves
against one device. ``capstone_report`` (``workbook run capstone``) and lesson 14 draw it.
"""
from __future__ import annotations

from pathlib import Path

from workbook.trace import colors

WORLD_SIZE = 4
KINDS = ("tp", "pp")
NAMES = {"tp": "TP x DP", "pp": "PP x DP"}
#: each group's transfers in a colour of its own; compute grey, so that the groups stand out
GROUP_COLORS = {"TP": colors.COMMUNICATION, "DP": "#56B4E9", "PP": colors.MEMCPY,
                "other": colors.WAIT}
COMPUTE_GREY = "#BDBDBD"
MERGE_US = 50.0                   # compute spans closer than this are drawn as one bar


# --------------------------------------------------------------------------- on a rank
def _intervals(pairs) -> list:
    return [[float(a), float(b)] for a, b in zip(*pairs)]


def step_spans(trace_path, group_of) -> dict:
    """One rank's traced step as plain data, in microseconds on the profiler's clock (the ranks
    of one machine share it): ``compute`` (the union of its compute spans, gaps under
    ``MERGE_US`` closed), ``link`` (each link operation ``[start, end, group, op, bytes]``) and
    ``exposed`` (per group, the union of its link time not covered by compute)."""
    import json

    import numpy as np

    from workbook.trace import intervals as iv
    from workbook.trace import load_trace
    from workbook.trace.analyse import all_compute
    trace = load_trace(str(trace_path))
    c0, c1 = all_compute(trace)
    compute = (c0 + trace.origin_us, c1 + trace.origin_us)
    events = json.loads(Path(trace_path).read_text())
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    link, by_group = [], {}
    for e in events:
        if e.get("cat") != "link" or e.get("ph") != "X":
            continue
        group = group_of(e["args"].get("ranks") or [])
        a, b = float(e["ts"]), float(e["ts"] + e.get("dur", 0.0))
        link.append([a, b, group, e["name"], int(e["args"].get("bytes") or 0)])
        by_group.setdefault(group, []).append((a, b))
    exposed = {}
    for group, pairs in by_group.items():
        comm = iv.union(np.array([a for a, _ in pairs]), np.array([b for _, b in pairs]))
        exposed[group] = _intervals(iv.subtract(comm, compute))
    merged = iv.union(compute[0], compute[1] + MERGE_US)
    return {"compute": _intervals((merged[0], merged[1] - MERGE_US)), "link": link,
            "exposed": exposed}


def groups_of(kind: str, inner: int = 2, world: int = WORLD_SIZE):
    """``group_of(ranks)``: ``"TP"``/``"PP"``, ``"DP"`` or ``"other"`` on the mesh lesson 14
    builds (inner groups contiguous, DP groups strided); a point-to-point pair inside an inner
    group is that group's."""
    inner_groups = [list(range(d * inner, (d + 1) * inner)) for d in range(world // inner)]
    dp_groups = [list(range(i, world, inner)) for i in range(inner)]

    def group_of(ranks) -> str:
        ranks = sorted(ranks)
        if ranks in dp_groups:
            return "DP"
        if any(set(ranks) <= set(g) for g in inner_groups) and ranks:
            return kind.upper()
        return "other"
    return group_of


# --------------------------------------------------------------------------- the figures
def hidden_rows(traced: list[dict], kind: str) -> list[dict]:
    """Per group of ``kind``'s step: the job's link ms (ranks added), exposed ms, share hidden
    (``workbook.grading.timing.hidden_pct``, as the grader reads it)."""
    from workbook.grading.timing import hidden_pct
    rows = []
    for group in (kind.upper(), "DP"):
        comm = sum(r.get("hidden", {}).get(group, {}).get("comm_ms", 0.0) for r in traced)
        exposed = sum(r.get("hidden", {}).get(group, {}).get("exposed_ms", 0.0) for r in traced)
        rows.append({"group": group, "comm_ms": comm, "exposed_ms": exposed,
                     "pct": hidden_pct(comm, exposed) if comm else None})
    return rows


def sent_by_group(res: dict, kind: str) -> dict:
    """The bus bytes one rank's traced step sent per group, the activations' and gradients'
    traffic only (``capstone_traffic.is_bulk``), from its link records."""
    from workbook.capstone.capstone_traffic import is_bulk
    group_of = groups_of(kind)
    sent = {kind.upper(): 0.0, "DP": 0.0}
    for op in res.get("ops", []):
        group = group_of(op["ranks"])
        if group in sent and is_bulk(kind, group, op["op"], op["bytes"]):
            sent[group] += op["bus"]
    return sent


def loss_gap(results: list[dict]) -> dict:
    """Per configuration, the largest ``|loss - one device's|`` over the steps and ranks."""
    single = results[0].get("single")
    out = {}
    for kind in KINDS:
        if not isinstance(single, list):
            out[kind] = None
            continue
        out[kind] = max(abs(a - b) for r in results for a, b in
                        zip(r["training"][kind].get("losses", []), single))
    return out


def figure(results: list[dict], title: str | None = None, kinds=KINDS):
    """The picture: per configuration of ``kinds`` a timeline of the traced step, a row per
    rank, beside the loss curves against one device (module docstring). JSON-serialisable
    (plain lists)."""
    from plotly.subplots import make_subplots
    traced = {k: [r["traced"][k] for r in results] for k in KINDS if k in results[0]["traced"]}
    link = next((t[0].get("link") for t in traced.values() if t and t[0].get("link")), "no link")
    kinds, n = list(kinds), len(kinds)
    specs = [[{}, {"rowspan": n}]] + [[{}, None] for _ in range(n - 1)]
    titles = [_panel_title(traced, kinds[0]), "loss, every step"] + \
        [_panel_title(traced, k) for k in kinds[1:]]
    fig = make_subplots(rows=n, cols=2, column_widths=[0.7, 0.3], horizontal_spacing=0.08,
                        vertical_spacing=0.14, specs=specs, subplot_titles=titles)
    shown = set()
    for row, kind in enumerate(kinds, 1):
        for bar in timeline_bars(traced.get(kind, []), kind, shown):
            fig.add_trace(bar, row=row, col=1)
        fig.update_yaxes(tickvals=list(range(WORLD_SIZE)),
                         ticktext=[f"rank {r}" for r in range(WORLD_SIZE)], autorange="reversed",
                         row=row, col=1)
        fig.update_xaxes(title_text="ms from the step's start", row=row, col=1)
    for trace in loss_traces(results):
        fig.add_trace(trace, row=1, col=2)
    fig.update_xaxes(title_text="step", row=1, col=2)
    fig.update_yaxes(title_text="loss (cross-entropy, nats)", row=1, col=2)
    fig.update_layout(
        title=title or f"One step of each configuration, 4 ranks as a 2 x 2 mesh — "
                       f"{link.replace('simulated', 'SIMULATED', 1)}",
        barmode="overlay", height=150 + 300 * n, plot_bgcolor="white", hovermode="closest",
        legend=dict(orientation="h", y=-0.22 if n == 1 else -0.12, yanchor="top", x=0,
                    xanchor="left"),
        margin=dict(l=10, r=10, t=90, b=80))
    return fig


def _panel_title(traced: dict, kind: str) -> str:
    """``TP x DP: one step per rank; hidden TP 47%, DP 53%`` (the grader's shares)."""
    rows = hidden_rows(traced.get(kind, []), kind)
    shares = ", ".join(f"{r['group']} {r['pct']:.0f}%" for r in rows if r["pct"] is not None)
    return f"{NAMES[kind]}: one step, a row per rank" + (f"; hidden: {shares}" if shares else "")


def timeline_bars(per_rank: list[dict], kind: str, shown: set) -> list:
    """The bars of one configuration's traced step: per rank (y = rank) compute grey, each
    link operation in its group's colour (thinner, over the compute), the exposed part a red
    bar under the row. ``shown``: legend entries already drawn (each once)."""
    import plotly.graph_objects as go
    spans = [r.get("spans") for r in per_rank]
    if not spans or any(s is None for s in spans):
        return []
    zero = min([s["compute"][0][0] for s in spans if s["compute"]]
               + [op[0] for s in spans for op in s["link"]])
    ms = lambda us: (us - zero) / 1e3                                     # noqa: E731
    bars = []

    def bar(name, color, y, pairs, width, hover, legend):
        if not pairs:
            return
        bars.append(go.Bar(
            orientation="h", y=y, base=[ms(a) for a, _ in pairs],
            x=[(b - a) / 1e3 for a, b in pairs], width=width, name=legend,
            legendgroup=legend, showlegend=legend not in shown, marker_color=color,
            marker_line_width=0, hovertext=hover, hoverinfo="text"))
        shown.add(legend)

    for rank, s in enumerate(spans):
        bar("compute", COMPUTE_GREY, [rank] * len(s["compute"]), s["compute"], 0.8,
            [f"rank {rank}: compute {(b - a) / 1e3:.1f} ms" for a, b in s["compute"]], "compute")
        for group in sorted({op[2] for op in s["link"]}):
            ops = [op for op in s["link"] if op[2] == group]
            lane = rank + (0.14 if group == "DP" else -0.14)      # the inner group above
            bar(group, GROUP_COLORS.get(group, GROUP_COLORS["other"]),
                [lane] * len(ops), [(op[0], op[1]) for op in ops], 0.26,
                [f"rank {rank}: {group} {op[3]}, {op[4] / 1e6:.2f} MB, {(op[1] - op[0]) / 1e3:.1f}"
                 f" ms on the link" for op in ops], f"{group} communication")
        exposed = [p for g in s["exposed"] for p in s["exposed"][g]]
        hover = [f"rank {rank}: {g} exposed {(b - a) / 1e3:.1f} ms (no compute beside it)"
                 for g in s["exposed"] for a, b in s["exposed"][g]]
        bar("exposed", colors.EXPOSED, [rank + 0.4] * len(exposed), exposed, 0.1, hover,
            "exposed (no compute beside it)")
    return bars


def loss_traces(results: list[dict]) -> list:
    """The loss curves: one device (a thick grey line), TP x DP and PP x DP (rank 0's; every
    rank returns the same) as markers on it."""
    import plotly.graph_objects as go
    out = []
    single = results[0].get("single")
    if isinstance(single, list):
        out.append(go.Scatter(x=list(range(len(single))), y=single, mode="lines",
                              name="one device", line=dict(color="#555555", width=6),
                              opacity=0.45))
    for kind, symbol, color in (("tp", "circle-open", GROUP_COLORS["TP"]),
                                ("pp", "x-thin-open", GROUP_COLORS["PP"])):
        losses = results[0]["training"].get(kind, {}).get("losses")
        if losses:
            out.append(go.Scatter(x=list(range(len(losses))), y=losses, mode="markers",
                                  name=f"{NAMES[kind]} (4 ranks)",
                                  marker=dict(symbol=symbol, size=9, color=color,
                                              line=dict(width=2, color=color))))
    return out
