"""What ``workbook bench pp_schedules`` compares its measurements with, and how it shows them.

On paper: ``paper(schedules, p, v, placement, costs, t_p2p)`` plays a schedule with
``simulate_chunked`` at the measured per-chunk-action costs (its step, bubble and
``paper_hidden``, the steady state's transfers under compute); ``paper_rows`` adds to each
measured row its formula bubble (``pp_schedules_lesson.formula_bubble``, whole-stage costs =
chunk costs x v), the textbook one (equal costs), ``simulate_chunked``'s figures, the peaks in
flight from the schedule and the step over no_comm's; ``targets`` judges issue 30's targets.

``bench_table(result)`` prints, per variant (``pp_schedules_bench``'s module docstring defines each
figure): the step and ``simulate_chunked``'s step in brackets, the step over the
no-communication optimum, the busiest rank's p2p link time and what of it no compute hid, the
steady state's hidden share (``simulate_chunked``'s in brackets), the bubble three ways (measured
from the trace, the schedule's formula with the measured per-action costs, ``simulate_chunked``
with them and the link), and the most activations a rank holds, per rank, in whole stages. Then
the per-action costs the paper figures used, and issue 30's targets, each with the figure
measured, the figure on paper, and met or not. ``bench_figure(result)`` draws each variant's step
as compute and idle, beside its ``simulate_chunked`` step and its formula step.

On the simulated link every time is a CPU in slow motion (``workbook.link``), and the table says
so in its first line and in each preset's heading.
"""
from __future__ import annotations

from workbook.measure.output import human, where_measured

#: the name ``formula_bubble`` knows each variant's schedule by
FORMULA_OF = {"1f1b": "1F1B", "interleaved_v2": "interleaved 1F1B",
              "interleaved_v4": "interleaved 1F1B", "zb_h1": "ZB-H1", "zbv": "ZBV", "no_comm": "ZBV"}


# --------------------------------------------------------------------------- on paper
def paper_hidden(schedules, line, p: int, v: int, placement: str, t_p2p: float) -> float | None:
    """On a ``simulate_chunked`` timeline: the share of the transfers issued in each rank's
    steady state (a send from the end of its action, a receive from the end of the action that
    feeds it, each ``t_p2p`` long) that falls under the rank's own compute; None if none."""
    from workbook.pipeline_parallel import ChunkAction, destination_of, phases, source_of
    end = {(r, a): e for r, spans in enumerate(line.spans) for _, e, a in spans}
    total = hidden = 0.0
    for r, spans in enumerate(line.spans):
        acts = [ChunkAction(*a) for a in schedules[r]]
        steady = [k for k, ph in enumerate(phases([(a.kind, a.micro_batch) for a in acts]))
                  if ph == "steady"]
        if not steady or t_p2p <= 0:
            continue
        lo = spans[steady[0] - 1][1] if steady[0] > 0 else -1.0
        hi = spans[steady[-1]][1]
        starts = [end[r, a] for a in acts
                  if (d := destination_of(r, a, p, v, placement)) and d[0] != r]
        starts += [end[src] for a in acts if (src := source_of(r, a, p, v, placement)) and src[0] != r]
        for t0 in (t for t in starts if lo < t <= hi):
            total += t_p2p
            hidden += sum(max(0.0, min(t0 + t_p2p, e) - max(t0, b)) for b, e, _ in spans)
    return 100 * hidden / total if total else None


def paper(schedules, p: int, v: int, placement: str, costs: dict, t_p2p: float) -> dict:
    """``simulate_chunked`` of ``schedules`` with per-chunk-action ``costs`` (``t_f``, ``t_b``,
    ``t_w``; ms) and ``t_p2p`` ms a transfer: ``step_ms``, ``bubble``, ``hidden_pct``."""
    from workbook.pipeline_parallel import simulate_chunked
    line = simulate_chunked(schedules, p, v, placement, t_p2p=t_p2p, **costs)
    return {"step_ms": line.step, "bubble": line.bubble,
            "hidden_pct": paper_hidden(schedules, line, p, v, placement, t_p2p)}


# --------------------------------------------------------------------------- the rows
def costs_of(row: dict) -> dict:
    """One chunk action's measured costs as ``simulate_chunked`` takes them: an unsplit B's
    measured time already holds its W, so its ``t_w`` is 0."""
    return {"t_f": row["t_f_ms"], "t_b": row["t_b_ms"],
            "t_w": 0.0 if row["t_w_ms"] is None else row["t_w_ms"]}


def paper_rows(rows: dict, schedules: dict, p: int, m: int, t_p2p: float) -> None:
    """Add to each variant's row its formula, textbook and ``simulate_chunked`` figures, its
    peaks in flight (from the schedule) and its step over no_comm's."""
    from workbook.pipeline_parallel import simulate_chunked
    from workbook.pipeline_parallel.pp_schedules_lesson import formula_bubble
    for name, row in rows.items():
        acts, v, placement = schedules[name]
        costs = costs_of(row)
        whole = {k: v * c for k, c in costs.items()}             # a whole stage's: chunk x v
        if row["t_w_ms"] is None:                                 # unsplit: B + W measured as B
            whole = {"t_f": whole["t_f"], "t_b": whole["t_b"] / 2, "t_w": whole["t_b"] / 2}
        peaks = simulate_chunked(acts, p, v, placement).peak_in_flight
        row.update(v=v, placement=placement,
                   formula=max(0.0, formula_bubble(FORMULA_OF[name], p, v, m, **whole)),
                   textbook=formula_bubble(FORMULA_OF[name], p, v, m),
                   paper=paper(acts, p, v, placement, costs, 0.0 if name == "no_comm" else t_p2p),
                   paper_bare_ms=paper(acts, p, v, placement, costs, 0.0)["step_ms"],
                   peak_in_flight=peaks, peak_stages=max(peaks) / v,
                   over_no_comm=row["step_ms"] / rows["no_comm"]["step_ms"])


def targets(rows: dict) -> dict:
    """Issue 30's benchmark targets, each ``want`` / ``got`` / ``paper`` / ``met`` (None: a
    variant it needs did not run)."""
    out = {}
    iv2, one, zb, zbv = (rows.get(k) for k in ("interleaved_v2", "1f1b", "zb_h1", "zbv"))
    if iv2:
        book = iv2["textbook"]
        out["interleaved v=2: steady-state p2p hidden >= 80%"] = {
            "want": ">= 80%", "got": iv2["hidden_pct"], "paper": iv2["paper"]["hidden_pct"],
            "met": None if iv2["hidden_pct"] is None else iv2["hidden_pct"] >= 80}
        out["interleaved v=2: bubble within 10% of (p-1)/(vm+p-1)"] = {
            "want": f"{100 * book:.1f}% +- {10 * book:.1f}", "got": 100 * iv2["bubble"],
            "paper": 100 * iv2["paper"]["bubble"], "met": abs(iv2["bubble"] - book) <= 0.1 * book}
    if zb and one:
        out["ZB-H1: bubble <= 1/3 of 1F1B's"] = {
            "want": f"<= {100 * one['bubble'] / 3:.1f}%", "got": 100 * zb["bubble"],
            "paper": 100 * zb["paper"]["bubble"], "met": zb["bubble"] <= one["bubble"] / 3}
        # the paper's claim is in idle time: (p-1)(t_F + t_B - t_W) against (p-1)(t_F + t_B + t_W);
        # as a share of the step the same idle is more than a third ((m+p-1)/(3m+p-1) at equal costs)
        idle = {k: r["bubble"] * r["step_ms"] for k, r in (("zb", zb), ("one", one))}
        paper_idle = {k: r["paper"]["bubble"] * r["paper"]["step_ms"] for k, r in (("zb", zb), ("one", one))}
        out["ZB-H1: idle time per rank <= 1/3 of 1F1B's (the paper's form)"] = {
            "want": "<= 0.33x", "got": idle["zb"] / idle["one"] if idle["one"] else None,
            "paper": paper_idle["zb"] / paper_idle["one"] if paper_idle["one"] else None,
            "met": idle["zb"] <= idle["one"] / 3}
        out["ZB-H1: peak activations in flight = 1F1B's"] = {
            "want": f"{one['peak_stages']:g} stages", "got": zb["peak_stages"],
            "paper": zb["peak_stages"], "met": zb["peak_stages"] == one["peak_stages"]}
    if zbv:
        out["ZBV: step <= 1.10 x the no-communication optimum"] = {
            "want": "<= 1.10x", "got": zbv["over_no_comm"],
            "paper": zbv["paper"]["step_ms"] / zbv["paper_bare_ms"],
            "met": zbv["over_no_comm"] <= 1.10}
    return out


def _fmt(x, spec="{:.0f}") -> str:
    return "-" if x is None else spec.format(x)


def _pct(x) -> str:
    return _fmt(None if x is None else 100 * x, "{:.1f}")


def bench_table(result: dict) -> str:
    """The benchmark's text report (module docstring)."""
    o, p, m = result["options"], result["nproc"], result["options"]["micro_batches"]
    label = next(r["link_label"] for r in result["links"].values())
    load = result.get("load_avg")
    lines = [f"pp_schedules benchmark, {where_measured(label)}: {p} ranks on "
             f"{result.get('hardware', '?')} ({result['cores']} cores"
             + (f", load average {load[0]:.1f} at the end" if load else "") + f"), torch {result.get('torch')}",
             f"model: gpt, hidden {o['hidden']}, ffn {4 * o['hidden']}, heads {o['heads']}, "
             f"{o['layers']} layers cut into p x v stages, vocab {o['vocab']}, fp32, forward + backward; "
             f"{m} micro-batches of {o['rows']} x {o['seq']} tokens; median of {o['repeats']} steps; "
             f"measured (simulate_chunked with the measured per-action costs)"]
    if result.get("oversubscribed"):
        lines.append(f"note: {p} ranks on {result['cores']} CPU cores: oversubscribed, the ranks "
                     f"share cores, so compute is slower and the ranks skewed")
    for preset, r in result["links"].items():
        lines += ["", f"[{preset}] {where_measured(r['link_label'])}; one transfer "
                      f"({human(r['activation_bytes'])}B) {r['t_p2p_ms']:.1f} ms; no_comm: ZBV "
                      f"without link time, the optimum each step is divided by",
                  f"{'variant':<15}{'step ms':>14}{'x opt':>7}{'link ms':>9}{'exposed':>9}"
                  f"{'hid% steady':>13}{'bubble %':>10}{'formula':>9}{'simulate':>10}"
                  f"   peak stages/rank"]
        for name, x in r["variants"].items():
            q = x["paper"]
            lines.append(f"{name:<15}" + f"{_fmt(x['step_ms'])} ({_fmt(q['step_ms'])})".rjust(14)
                         + f"{x['over_no_comm']:>7.2f}{_fmt(x['link_ms']):>9}{_fmt(x['exposed_ms']):>9}"
                         + f"{_fmt(x['hidden_pct'])} ({_fmt(q['hidden_pct'])})".rjust(13)
                         + f"{_pct(x['bubble']):>10}{_pct(x['formula']):>9}{_pct(q['bubble']):>10}   "
                         + " / ".join(f"{k / x['v']:g}" for k in x["peak_in_flight"]))
        lines.append("per chunk action, ms (compute in its trace range; an unsplit B holds its W): "
                     + "; ".join(f"{n} F {_fmt(x['t_f_ms'], '{:.1f}')} B {_fmt(x['t_b_ms'], '{:.1f}')}"
                                 + (f" W {_fmt(x['t_w_ms'], '{:.1f}')}" if x["t_w_ms"] else "")
                                 for n, x in r["variants"].items()))
        lines.append("textbook (equal costs): " + ", ".join(
            f"{n} {_pct(x['textbook'])}%" for n, x in r["variants"].items()))
        lines.append("targets (benchmark figures, not timed tests):")
        for name, t in r["targets"].items():
            unit = ("{:.2f}x" if "x the" in name or "idle" in name else "{:g}" if "peak" in name
                    else "{:.1f}%")
            lines.append(f"  {name:<62} want {t['want']}, got {_fmt(t['got'], unit)} (on paper "
                         f"{_fmt(t['paper'], unit)})  " + {True: "met", False: "NOT met",
                                                           None: "n/a"}[t["met"]])
    return "\n".join(lines + [
        "", "step ms: the slowest rank's; x opt: step / no_comm's step; link ms: the busiest rank's "
        "modelled p2p time; exposed: of it, what no compute hid (skew excused); hid% steady: of the "
        "steady state's p2p time; bubble: 1 - compute / (p x step); formula: the schedule's "
        "formula with the measured costs; peak: activations in flight from the schedule, in "
        "whole stages",
        "simulated figures: a CPU in slow motion, calibrated to the preset's compute/link ratio"])


def bench_figure(result: dict):
    """Per preset, each variant's step: its ranks' mean compute and the idle rest (stacked),
    ``simulate_chunked``'s step (a diamond) and the formula's step (compute / (1 - formula), a
    line marker)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    links, p, m = result["links"], result["nproc"], result["options"]["micro_batches"]
    fig = make_subplots(cols=len(links), subplot_titles=[where_measured(r["link_label"], k)
                                                         for k, r in links.items()])
    for col, r in enumerate(links.values(), 1):
        v = r["variants"]
        comp = [x["step_ms"] * (1 - x["bubble"]) for x in v.values()]
        for name, y, kind in (
                ("compute (mean rank)", comp, go.Bar),
                ("idle: bubble and exposed p2p", [x["step_ms"] - c for x, c in zip(v.values(), comp)], go.Bar),
                ("simulate_chunked's step", [x["paper"]["step_ms"] for x in v.values()], go.Scatter),
                ("formula's step", [c / (1 - x["formula"]) for x, c in zip(v.values(), comp)], go.Scatter)):
            marker = {"mode": "markers", "marker_symbol": "diamond" if name.startswith("sim") else "line-ew-open",
                      "marker_size": 14} if kind is go.Scatter else {}
            fig.add_trace(kind(name=name, x=list(v), y=y, showlegend=col == 1, legendgroup=name, **marker),
                          1, col)
    fig.update_layout(barmode="stack", yaxis_title="step time (ms)", height=480, width=1200,
                      title=f"pp_schedules, {p} ranks, {m} micro-batches, SIMULATED links")
    return fig
