"""Where does TP communication overlap break down? Sweep the ranks and the link.

For each number of ranks n (2, 4) and each link preset (fast to slow: dgx-h100 NVLink,
dgx-h100-ib InfiniBand, pcie-h100), run ``workbook.tensor_parallel.tp_overlap_bench`` (plain SP,
pipelined+bulk, Domino, no-comm optimum, on one model) and plot, against plain SP's
communication fraction, the share of communication pipelined+bulk and Domino hide in the
forward and backward passes, and their step time relative to the no-communication optimum.
Writes a standalone plotly HTML figure (and a PNG beside it where kaleido is installed) and the
raw numbers as JSON.

    python tests/bench/tp_overlap_sweep.py --out runs/tp_overlap_sweep.html          # full sweep
    python tests/bench/tp_overlap_sweep.py --nprocs 2 --links dgx-h100 --steps 1     # a quick look

Simulated-link figures: a CPU in slow motion, calibrated to each preset's compute/link ratio.
"""
from __future__ import annotations

import argparse

import sweep_output

from workbook.tensor_parallel import tp_overlap_bench

LINKS = ("dgx-h100", "dgx-h100-ib", "pcie-h100")
VARIANTS = ("sp", "pipelined+bulk", "domino", "no_comm")


def sweep(nprocs, links, steps: int, shape: dict) -> list[dict]:
    rows = []
    for n in nprocs:
        for link in links:
            res = tp_overlap_bench.measure(nproc=n, link=link, variants=VARIANTS, steps=steps,
                                           warmup=1, **shape)
            v = res["variants"]
            row = {"nproc": n, "link": link, "link_label": res["link_label"],
                   "comm_fraction_pct": res["comm_fraction_pct"], "ceiling": res["ceiling"],
                   "step_ms": {k: r["step_ms"] for k, r in v.items()},
                   "targets": {k: t["met"] for k, t in res["targets"].items()}}
            for name in ("pipelined+bulk", "domino"):
                r = v[name]
                row[name] = {"fwd_pct": r["overlap_fwd_pct"], "bwd_pct": r["overlap_bwd_pct"],
                             "vs_no_comm": r["step_ms"] / v["no_comm"]["step_ms"],
                             "speedup_vs_sp": v["sp"]["step_ms"] / r["step_ms"]}
            rows.append(row)
            pb, d = row["pipelined+bulk"], row["domino"]
            print(f"n={n} {link:<12} f {row['comm_fraction_pct']:.0f}% (ceiling "
                  f"{row['ceiling']:.2f}x): pipelined+bulk {pb['fwd_pct']:.0f}% / "
                  f"{pb['bwd_pct']:.0f}% hidden, {pb['vs_no_comm']:.2f}x no-comm, "
                  f"{pb['speedup_vs_sp']:.2f}x over sp; domino {d['fwd_pct']:.0f}% / "
                  f"{d['bwd_pct']:.0f}%, {d['vs_no_comm']:.2f}x no-comm, "
                  f"{d['speedup_vs_sp']:.2f}x over sp", flush=True)
    return rows


def figure(rows: list[dict]):
    import plotly.graph_objects as go
    fig = sweep_output.two_panels("Step / no-communication step")
    for n in sorted({r["nproc"] for r in rows}):
        pts = sorted((r for r in rows if r["nproc"] == n), key=lambda r: r["comm_fraction_pct"])
        xs, labels = [r["comm_fraction_pct"] for r in pts], [r["link"] for r in pts]
        for name, marker in (("pipelined+bulk", "circle"), ("domino", "diamond")):
            for key, dash in (("fwd_pct", "solid"), ("bwd_pct", "dot")):
                fig.add_trace(go.Scatter(
                    x=xs, y=[r[name][key] for r in pts], text=labels, mode="lines+markers",
                    line={"dash": dash}, marker={"symbol": marker},
                    name=f"n={n} {name} {'forward' if key == 'fwd_pct' else 'backward'}"),
                    row=1, col=1)
            fig.add_trace(go.Scatter(x=xs, y=[r[name]["vs_no_comm"] for r in pts], text=labels,
                                     mode="lines+markers", marker={"symbol": marker},
                                     name=f"n={n} {name} step ratio"), row=1, col=2)
        fig.add_trace(go.Scatter(x=xs, y=[r["ceiling"] for r in pts], text=labels, mode="lines",
                                 line={"dash": "dash", "color": "grey"},
                                 name=f"n={n} plain SP's link time, all exposed"), row=1, col=2)
    return sweep_output.label(
        fig, "communication fraction f of plain SP (%)",
        "TP communication overlap vs Domino on a SIMULATED link (CPU ranks on a 2-core machine, "
        "presets calibrated to its matmul rate)", height=520, width=1200)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nprocs", default="2,4", help="rank counts (must divide heads, ffn, seq)")
    parser.add_argument("--links", default=",".join(LINKS))
    parser.add_argument("--steps", type=int, default=2)
    for name in ("hidden", "heads", "ffn", "layers", "batch", "seq"):
        parser.add_argument(f"--{name}", type=int, default=tp_overlap_bench.DEFAULTS[name])
    parser.add_argument("--out", default="runs/tp_overlap_sweep.html")
    opts = parser.parse_args(argv)
    shape = {k: getattr(opts, k) for k in ("hidden", "heads", "ffn", "layers", "batch", "seq")}
    rows = sweep([int(n) for n in opts.nprocs.split(",")], opts.links.split(","), opts.steps, shape)
    sweep_output.write(opts.out, figure(rows), {"shape": shape, "rows": rows}, png=True)


if __name__ == "__main__":
    main()
