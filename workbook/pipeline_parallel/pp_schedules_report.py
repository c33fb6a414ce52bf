"""How ``workbook bench pp_schedules`` shows its figures: a table per link preset and a figure.

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
