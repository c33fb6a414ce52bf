"""Where does Domino's overlap break down? Sweep the link and the number of chunks.

For each link preset (fast to slow: dgx-h100 NVLink, dgx-h100-ib InfiniBand, pcie-h100) and each
p, run ``workbook.tensor_parallel.domino_bench`` (vanilla TP, Domino, no-comm optimum) and plot, against the
communication fraction, Domino's forward and backward overlap and its step time relative to the
no-communication optimum. Writes a standalone plotly HTML figure and the raw numbers as JSON.

The multi-node points (``--nodes``, default ``dgx-h100:2x1,dgx-h100:2x2``) run the same model with
tensor parallelism spanning simulated nodes (``PRESET:NODESxRANKS``: NVLink inside a node, one
network card per rank between nodes, ``workbook.link.topology``): the Domino paper's multi-node setting.

    python tests/bench/domino_sweep.py --out runs/domino_sweep.html            # full sweep
    python tests/bench/domino_sweep.py --links dgx-h100 --ps 4 --steps 1       # a quick look
    python tests/bench/domino_sweep.py --links '' --nodes dgx-h100:2x2 --ps 4  # nodes only

Simulated-link figures: a CPU in slow motion, calibrated to each preset's compute/link ratio.
"""
from __future__ import annotations

import argparse
import contextlib
import io
from types import SimpleNamespace

import sweep_output

from workbook.tensor_parallel import domino_bench

LINKS = ("dgx-h100", "dgx-h100-ib", "pcie-h100")


def points(links, nodes) -> list[tuple[str, int, int]]:
    """``(preset, nodes, ranks)`` per point: each flat link on 2 ranks of one node, then each
    ``PRESET:NODESxRANKS`` on that many simulated nodes of that many ranks."""
    out = [(link, 1, 2) for link in links if link]
    for spec in (s for s in nodes if s):
        preset, _, shape = spec.partition(":")
        k, _, m = shape.partition("x")
        if not (k.isdigit() and m.isdigit()):
            raise SystemExit(f"--nodes {spec!r}: write PRESET:NODESxRANKS, e.g. dgx-h100:2x2")
        out.append((preset, int(k), int(k) * int(m)))
    return out


def sweep(links, ps, steps: int, base: dict, nodes=()) -> list[dict]:
    rows = []
    for link, nnodes, nproc in points(links, nodes):
        for p in ps:
            model = {**domino_bench.DEFAULTS, **base, "p": p}
            args = SimpleNamespace(**model, nproc=nproc, nnodes=nnodes, link=link,
                                   impl="solutions", style="gpt", lookahead=1, steps=steps,
                                   warmup=1, variants="vanilla_tp,domino,no_comm",
                                   trace_dir=None, json=None)
            with contextlib.redirect_stdout(io.StringIO()):
                res = domino_bench.run_bench(args)
            v = res["variants"]
            where = link if nnodes == 1 else f"{link} {nnodes}x{nproc // nnodes}"
            rows.append({"link": where, "p": p, "nnodes": nnodes, "nproc": nproc,
                         "comm_fraction_pct": res["comm_fraction_pct"],
                         "fwd_pct": v["domino"]["overlap_fwd_pct"],
                         "bwd_pct": v["domino"]["overlap_bwd_pct"],
                         "vs_no_comm": v["domino"]["step_ms"] / v["no_comm"]["step_ms"],
                         "speedup_vs_tp": v["vanilla_tp"]["step_ms"] / v["domino"]["step_ms"]})
            r = rows[-1]
            print(f"{where:<16} p={p}: comm fraction {r['comm_fraction_pct']:.0f}%, forward "
                  f"{r['fwd_pct']:.0f}% / backward {r['bwd_pct']:.0f}% hidden, "
                  f"{r['vs_no_comm']:.2f}x no-comm, {r['speedup_vs_tp']:.2f}x over vanilla TP",
                  flush=True)
    return rows


def figure(rows: list[dict]):
    import plotly.graph_objects as go
    fig = sweep_output.two_panels("Domino step / no-communication step")
    for p in sorted({r["p"] for r in rows}):
        pts = sorted((r for r in rows if r["p"] == p), key=lambda r: r["comm_fraction_pct"])
        xs = [r["comm_fraction_pct"] for r in pts]
        labels = [r["link"] for r in pts]
        for key, dash in (("fwd_pct", "solid"), ("bwd_pct", "dot")):
            fig.add_trace(go.Scatter(x=xs, y=[r[key] for r in pts], text=labels,
                                     mode="lines+markers", line={"dash": dash},
                                     name=f"p={p} {'forward' if key == 'fwd_pct' else 'backward'}"),
                          row=1, col=1)
        fig.add_trace(go.Scatter(x=xs, y=[r["vs_no_comm"] for r in pts], text=labels,
                                 mode="lines+markers", name=f"p={p} step ratio"), row=1, col=2)
    return sweep_output.label(fig, "communication fraction of vanilla TP (%)",
                              "Domino on a simulated link: where overlap breaks down (CPU ranks, "
                              "simulated presets; 'dgx-h100 2x2': TP over 2 nodes of 2)",
                              height=480, width=1100)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--links", default=",".join(LINKS))
    parser.add_argument("--nodes", default="dgx-h100:2x1,dgx-h100:2x2",
                        help="multi-node points, PRESET:NODESxRANKS (comma-separated; '' for none)")
    parser.add_argument("--ps", default="2,4,8", help="chunk counts (must divide --batch)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=domino_bench.DEFAULTS["hidden"])
    parser.add_argument("--batch", type=int, default=domino_bench.DEFAULTS["batch"])
    parser.add_argument("--out", default="runs/domino_sweep.html")
    opts = parser.parse_args(argv)
    base = {"hidden": opts.hidden, "batch": opts.batch, "ffn": 4 * opts.hidden}
    rows = sweep(opts.links.split(","), [int(p) for p in opts.ps.split(",")], opts.steps, base,
                 opts.nodes.split(","))
    sweep_output.write(opts.out, figure(rows), rows)


if __name__ == "__main__":
    main()
