"""Lab ``capstone``'s own figures in ``workbook run capstone``: one picture of a whole step.

Once the checks ran, on the 2 x 2 mesh (``WORLD_SIZE`` = 4 ranks):

* the loss of ``TrainSetup().steps`` (20) training steps of each configuration, TP x DP and
  PP x DP, beside the single-device run on the same global batches (``capstone_train``), with
  no link model (numbers, not time);
* one traced step of each configuration on the SIMULATED ``LINK`` (``TrainSetup.for_overlap``,
  ``capstone_run.traced_step``): per rank, when it computed and when each group's
  communication (TP, DP, PP: which group an operation ran on is read from the global ranks the
  link records with it, ``Mesh.group_of``) was on the link, and the part of it no compute
  covered, the *exposed* part (``step_spans``);
* the share of each group's link time hidden behind compute (``capstone_traffic.
  hidden_by_group``, the grader's figure: rank skew excused), and the bytes each group sent
  beside the model and the learner's ``predict_traffic``.

``figure(results)`` draws the picture: per configuration a timeline with a row per rank,
compute grey, each group's transfers in its colour (``GROUP_COLORS``, from the course's
Okabe-Ito palette, ``workbook.trace.colors``), the exposed part as a red bar under the row; and,
beside them, the loss curves against one device. ``describe(results)`` prints the figures and
writes the picture (``PICTURE``, plotly HTML) next to the traces. Lesson 14 draws the same
picture from its own runs (``capstone_lesson``).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from workbook.trace import colors

WORLD_SIZE = 4
LINK = "dgx-h100"
KINDS = ("tp", "pp")
NAMES = {"tp": "TP x DP", "pp": "PP x DP"}
#: each group's transfers in a colour of its own; compute grey, so that the groups stand out
GROUP_COLORS = {"TP": colors.COMMUNICATION, "DP": "#56B4E9", "PP": colors.MEMCPY,
                "other": colors.WAIT}
COMPUTE_GREY = "#BDBDBD"
PICTURE = "capstone_step.html"
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


@contextmanager
def implementation(impl: str | None):
    """On a rank: load the lab (and the earlier labs it composes) from ``impl`` (``labs``,
    ``solutions`` or a folder; None: as it is) inside the block, the rank's choice restored
    after (a warm rank serves later runs too)."""
    from workbook.grading.labs import ENV_IMPL, use_impl
    saved = os.environ.get(ENV_IMPL)
    if impl is not None:
        use_impl(impl)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(ENV_IMPL, None)
        else:
            os.environ[ENV_IMPL] = saved


def train_losses(kind: str, setup=None, steps: int | None = None, impl: str | None = None) -> dict:
    """On every rank: ``capstone_run.train_steps`` with no link model (the run's numbers do not
    depend on time), the link given back afterwards."""
    from workbook import link
    from workbook.capstone.capstone_run import train_steps
    from workbook.capstone.capstone_train import TrainSetup
    setup = setup or TrainSetup()
    saved = link.current_link()
    link.set_link(None)
    try:
        with implementation(impl):
            return train_steps(kind, setup, steps or setup.steps)
    finally:
        link.set_link(saved)


def traced_picture(trace_dir: str, kind: str, setup=None, impl: str | None = None) -> dict:
    """On every rank: ``capstone_run.traced_step`` of ``kind`` into ``trace_dir`` (default setup
    ``TrainSetup.for_overlap``), with this rank's ``step_spans`` added as ``"spans"``."""
    from workbook.capstone.capstone_run import traced_step
    from workbook.capstone.capstone_train import TrainSetup
    with implementation(impl):
        out = traced_step(str(trace_dir), kind, setup or TrainSetup.for_overlap())
    path = Path(trace_dir) / f"rank{out['rank']}.trace.json"
    if "ops" in out and path.is_file():
        out["spans"] = step_spans(path, groups_of(kind))
    out["trace_dir"] = str(trace_dir)
    return out


def run(trace_dir=None, impl=None, options=None) -> dict:
    """On every rank: the loss of every step of both configurations, one device's on rank 0,
    and one traced step of each (module docstring); ``options``: ``{"steps", "setup",
    "traced_setup"}`` to shrink the run."""
    import torch.distributed as dist

    from workbook import link
    from workbook.capstone.capstone_train import TrainSetup, train_single_device
    from workbook.grading.model_checks import rank_error
    from workbook.measure.calibration import recalibrate
    from workbook.measure.profiled_step import trace_folder
    o = {"steps": None, "setup": None, "traced_setup": None, **(options or {})}
    setup = o["setup"] or TrainSetup()
    rank, preset = dist.get_rank(), link.current_link() and link.current_link().preset
    out = {"rank": rank, "training": {}, "traced": {}, "traffic": {},
           "steps": o["steps"] or setup.steps}
    with implementation(impl):
        for kind in KINDS:
            out["training"][kind] = train_losses(kind, setup, o["steps"])
            if "error" in out["training"][kind] or "not_implemented" in out["training"][kind]:
                raise NotImplementedError(f"capstone: {NAMES[kind]} does not train yet")
        if rank == 0:
            try:
                out["single"] = train_single_device(setup, out["steps"])["losses"]
            except Exception as exc:                  # noqa: BLE001 - a figure, not a check
                out["single"] = rank_error(exc)
        if preset:
            recalibrate(preset)               # traced_step reads the link it is given
        with trace_folder(trace_dir, "capstone") as root:
            for kind in KINDS:
                res = out["traced"][kind] = traced_picture(str(Path(root) / kind), kind,
                                                           o["traced_setup"])
                if "error" in res or "not_implemented" in res:
                    raise NotImplementedError(f"capstone: the traced {NAMES[kind]} step failed")
                out["traffic"][kind] = traffic_rows(res, kind, o["traced_setup"])
    return out


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


def traffic_rows(res: dict, kind: str, setup=None, predict=None) -> list[tuple]:
    """``(name, predicted, model, measured)`` in MB per group for rank ``res["rank"]``:
    ``predict`` (default: the lab's ``predict_traffic``; one that raises gives None), the
    package's model (``capstone_traffic.traffic_model``) and the trace."""
    from workbook.capstone.capstone_train import TrainSetup
    from workbook.capstone.capstone_traffic import traffic_model
    setup = setup or TrainSetup.for_overlap()
    inner, dp, at = 2, WORLD_SIZE // 2, res["rank"] % 2
    args = (kind, setup.cfg, setup.batch, inner, dp, setup.micro_batches, res["param_bytes"], at)
    model, _ = traffic_model(*args)
    if predict is None:
        from workbook.grading.labs import load_lab

        def predict(*a):
            return load_lab("capstone").predict_traffic(*a)
    try:
        predicted = dict(predict(*args))
    except Exception:                                 # noqa: BLE001 - a stub shows as "-"
        predicted = {}
    sent = sent_by_group(res, kind)
    mb = lambda x: None if x is None else float(x) / 1e6              # noqa: E731
    return [(f"{NAMES[kind]}, rank {res['rank']}: {g} MB sent", mb(predicted.get(g)),
             mb(model[g]), mb(sent[g])) for g in model]


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


def describe(results: list[dict]) -> str:
    """The figures as text (module docstring); the picture written to ``PICTURE`` beside the
    traces, when they were kept."""
    from workbook.grading.predictions import comparison_lines
    from workbook.measure.output import where_measured
    first = results[0]
    gaps = loss_gap(results)
    link = next((first["traced"][k].get("link") for k in KINDS
                 if first["traced"].get(k, {}).get("link")), None)
    lines = [f"  capstone figures: 4 ranks as a 2 x 2 mesh; {first['steps']} training steps of "
             f"each configuration (no link), one traced step each ({where_measured(link)})"]
    for kind in KINDS:
        losses = first["training"][kind].get("losses", [])
        gap = gaps[kind]
        lines.append(f"  {NAMES[kind]}: loss {losses[0]:.4f} -> {losses[-1]:.4f}; against one "
                     f"device " + ("-" if gap is None else f"at most {gap:.1e} apart"))
    lines.append(f"  {'step':<10}{'group':>6}{'link ms':>10}{'exposed':>10}{'hidden':>8}"
                 "   (ranks added; skew excused)")
    for kind in KINDS:
        for row in hidden_rows([r["traced"][kind] for r in results], kind):
            pct = "-" if row["pct"] is None else f"{row['pct']:.0f}%"
            lines.append(f"  {NAMES[kind]:<10}{row['group']:>6}{row['comm_ms']:>10.0f}"
                         f"{row['exposed_ms']:>10.0f}{pct:>8}")
    rows = [tuple(row) for kind in KINDS for row in first.get("traffic", {}).get(kind, [])]
    lines.append("  the bytes each group sent in one step (predict_traffic, the model, the trace):")
    lines += comparison_lines(rows, unit="MB")
    folder = _trace_root(first)
    if folder is not None:
        path = Path(folder) / PICTURE
        figure(results).write_html(path)
        lines.append(f"  the picture of a whole step: {path}")
    return "\n".join(lines)


def _trace_root(res: dict):
    """The folder the traced steps went under (None: a temporary one, gone now)."""
    paths = [r.get("trace_dir") for r in res["traced"].values() if isinstance(r, dict)]
    for p in paths:
        if p and Path(p).parent.is_dir():
            return Path(p).parent
    return None
