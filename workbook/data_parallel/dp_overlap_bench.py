"""``workbook bench dp_overlap``: data parallelism and ZeRO with their traffic hidden, against
naive DP and the no-communication optimum, each figure beside what the overlap arithmetic predicts.

Every variant trains one model (``--style``, ``--layers`` blocks, fp32, Adam) on the same ranks
and global batch ``[batch, seq]``, each rank on its ``batch / n`` rows (lab ``dp_overlap``):
``naive`` (a blocking all-reduce per gradient after backward); ``bucketed@SIZE`` (``BucketedDP``
with ``--buckets`` bytes a bucket); ``zero1``, ``zero2`` and ``zero3``; ``no_comm`` (naive with
``finish_gradient_sync`` a no-op: the optimum). Warm-up steps (a row a rank, no link) only
allocate; then per ``--link`` preset the ranks recalibrate it (``domino_measure.recalibrate``)
and run ``--steps`` profiled steps, variants taking turns; a step ends by waiting for the
all-gather ZeRO-1/2 leave under way (the next forward would, first thing). Medians over the
steps, then the slowest rank (shares: the ranks' mean). Per variant (``links[preset]``):

* ``step_ms`` wall time of a step; ``link_ms`` the link busy (``link.op_log()``);
* ``exposed_ms`` link time no compute ran beside (``trace.overlap(t)``); ``skew_ms`` the part
  of it while a peer was late, shown but not excused (as in ``bench tp_overlap``);
* ``fwd_hidden_pct`` / ``bwd_hidden_pct`` / ``hidden_pct``: share of the link time of the ops
  issued in the ``forward`` / ``backward`` range / the step that compute hid;
* ``fwd_compute_ms`` / ``bwd_compute_ms``: compute inside each range.

``predicted``, the same from the shapes (``predict``): each op's alpha-beta time
``Link.op_time``; ``no_comm``'s compute per pass split over the layers by FLOPs; the lab's
schedule on one serial link (``_play``: op b starts at ``s_b = max(issued_b, e_{b-1})``, ends at
``e_b = s_b + t_b``; a wait blocks until ``e_b``; hidden = link time under compute). ``ratios``
(lesson 9's overlap condition, the Ultra-Scale Playbook's appendix A3, with measured compute):
bucketed ``sum t_b / backward compute``: below 1 every bucket but the last (the embedding's,
ready when backward ends) can hide, at best ``hidden % = 100 (1 - t_last / sum t_b)``; above 1
the queue outlasts the compute. zero3: a block's all-gather / its forward compute (below 1 the
prefetch hides it; the embedding's, block 0's and the head's cannot hide). ``targets``
(benchmark figures, not tests): bucketed hides >= 80% of its all-reduce where its ratio < 1;
ZeRO-3 with one-layer prefetch hides >= 85% of its forward all-gathers. ``memory``: bytes per
rank by kind (``memory_by_kind``) beside ``predicted_memory``. Times are on the SIMULATED link
(``workbook.link``): a CPU in slow motion, labelled so.

    workbook bench dp_overlap --json dp_overlap.json --figure dp_overlap.html
"""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from workbook import data_parallel

VARIANTS = ("naive", "bucketed", "zero1", "zero2", "zero3", "no_comm")
STAGE = {**data_parallel.STAGE, "no_comm": 0}
LINKS = ("dgx-h100", "dgx-h100-ib")
FIELDS = ("step_ms", "link_ms", "exposed_ms", "skew_ms", "fwd_hidden_pct", "bwd_hidden_pct",
          "hidden_pct", "fwd_compute_ms", "bwd_compute_ms")
# Deep and narrow: ZeRO-3's embedding, block 0 and head gathers cannot hide (nothing computes
# before them), so many blocks must outweigh them (predicted ~90% hidden on dgx-h100); llama's 9
# tensors a block (gpt: 16) keep naive DP's per-tensor latency bearable; at 1024 tokens a rank a
# block's all-gather takes about 0.6-0.9 of its forward compute on dgx-h100.
DEFAULTS = dict(hidden=256, heads=4, ffn=1024, layers=20, batch=8, seq=256, vocab=256)
EXTRA = dict(style="llama", buckets="1MiB,4MiB,16MiB")


def add_arguments(parser) -> None:
    parser.add_argument("--nproc", type=int, default=2, help="data-parallel ranks (default 2)")
    parser.add_argument("--link", dest="links", nargs="+", default=list(LINKS), metavar="PRESET",
                        help="simulated link presets, a table each (default: %(default)s)")
    parser.add_argument("--impl", default="solutions", help="labs, solutions or a folder")
    parser.add_argument("--style", choices=["gpt", "llama"], default=EXTRA["style"])
    for name, value in DEFAULTS.items():
        parser.add_argument(f"--{name}", type=int, default=value, help=f"default {value}")
    parser.add_argument("--buckets", default=EXTRA["buckets"], help="bucket sizes (%(default)s)")
    parser.add_argument("--steps", type=int, default=2, help="measured steps a variant and link")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps a variant")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="subset of %(default)s")
    parser.add_argument("--trace-dir", default=None, help="keep the traces here")
    for name, what in (("json", "the results as JSON"), ("figure", "the figure (plotly HTML)")):
        parser.add_argument(f"--{name}", default=None, metavar="PATH", help=f"write {what}")


def size(text: str) -> int:
    """``"256KiB"``, ``"1M"``, ``"4096"`` -> bytes."""
    from workbook.measure.bench_cli import parse_size
    return parse_size(text)


def names(variants, buckets: str) -> list[str]:
    """``bucketed`` as one variant per bucket size: ``bucketed@1MiB``."""
    from workbook.measure.output import human
    return [f"bucketed@{human(size(b))}iB" if v == "bucketed" else v
            for v in variants for b in (buckets.split(",") if v == "bucketed" else [None])]


def make_trainer(lab, name: str, cfg, device=None):
    """The lab's trainer of variant ``name`` (``no_comm``: naive, its gradient sync skipped)."""
    if name.startswith("bucketed@"):
        return lab.BucketedDP(cfg, device, bucket_bytes=size(name.split("@")[1]))
    tr = lab.VARIANTS["naive" if name == "no_comm" else name](cfg, device)
    if name == "no_comm":
        tr.finish_gradient_sync = lambda: None
    return tr


def drain(tr) -> None:
    """Wait for the all-gathers a ZeRO-1/2 step leaves under way (layer 0's)."""
    for i in list(getattr(tr, "gathers", {})):
        tr.wait_gather(i)


# --------------------------------------------------------------------------- the prediction
def _play(program) -> tuple[float, float]:
    """One pass on one serial link: ``("c", s)`` computes s seconds, ``("i", s)`` issues an op
    of s seconds, ``("w", k)`` waits for op k (None: for all). Returns (link s, hidden s)."""
    t = free = 0.0
    ops, busy = [], []
    for kind, x in program:
        if kind == "c":
            busy.append((t, t + x))
            t += x
        elif kind == "i":
            free = max(t, free) + x
            ops.append((free - x, free))
        else:
            t = max(t, free if x is None else ops[x][1])
    return (sum(e - s for s, e in ops),
            sum(max(0.0, min(e, c1) - max(s, c0)) for s, e in ops for c0, c1 in busy))


def predict(name, tr, cfg, rows: int, fwd_s: float, bwd_s: float) -> tuple[dict, float | None]:
    """What the lab's schedule implies for trainer ``tr`` (module docstring), and its ratio."""
    from workbook import link
    lk, n, h, S, U = link.current_link(), tr.n, cfg.hidden, cfg.seq_len, len(tr.units)
    block = 2 * rows * S * (4 * h * h + (3 if cfg.style == "llama" else 2) * h * cfg.ffn_hidden) \
        + 4 * rows * S * S * h                                     # matmuls + attention
    w = [rows * S * h, *[block] * cfg.n_layers, rows * S * h, 2 * rows * S * h * cfg.vocab_size]
    f, b = ([s * x / sum(w) for x in w] for s in (fwd_s, bwd_s))
    t = lambda op, numel: lk.op_time(op, numel * 4, n)              # noqa: E731 (fp32)
    prog, ratio = {}, None
    if name == "naive":
        prog["backward"] = [("c", bwd_s)] + [x for p in tr.model.parameters()
                                             for x in (("i", t("all_reduce", p.numel())), ("w", None))]
    elif name.startswith("bucketed"):
        unit = {id(p): u for u, m in enumerate(tr.units) for p in m.parameters()}
        ready = [min(unit[id(p)] for p in bk.params) for bk in tr.buckets]
        ar = [t("all_reduce", bk.numel) for bk in tr.buckets]
        prog["backward"] = [x for u in reversed(range(U)) for x in [("c", b[u])] + [
            ("i", a) for a, r in zip(ar, ready) if r == u]] + [("w", None)]
        ratio = sum(ar) / bwd_s
    elif name.startswith("zero"):
        z3, ag = name == "zero3", [t("all_gather", fl.numel) for fl in tr.flats]
        fwd, bwd, k, kb = [("i", ag[0])] if z3 else [], [], {0: 0} if z3 else {}, {}
        for u in range(U):              # wait for layer u, prefetch u + 1, compute u
            fwd += [("w", k[u])] if u in k else []
            if u + 1 < U:
                k[u + 1] = sum(x[0] == "i" for x in fwd)
                fwd.append(("i", ag[u + 1]))
            fwd.append(("c", f[u]))
        for u in reversed(range(U)):    # zero3: wait for u, prefetch u - 1; then RS(u)
            bwd += [("w", kb[u])] if u in kb else []
            if z3 and u > 0:
                kb[u - 1] = sum(x[0] == "i" for x in bwd)
                bwd.append(("i", ag[u - 1]))
            bwd += [("c", b[u]), ("i", t("reduce_scatter", tr.flats[u].numel))]
        prog = {"forward": fwd, "backward": bwd + [("w", None)],
                **({} if z3 else {"optimizer": [("i", ag[0]), ("w", None)]})}
        ratio = ag[1] / f[1] if z3 else None
    played = {ph: _play(p) for ph, p in prog.items()}
    total, hid = (sum(x[i] for x in played.values()) for i in (0, 1))
    pct = {ph: 100 * played[ph][1] / played[ph][0] if ph in played else None
           for ph in ("forward", "backward")}
    return {"link_ms": total * 1e3, "exposed_ms": (total - hid) * 1e3, "fwd_hidden_pct": pct["forward"],
            "bwd_hidden_pct": pct["backward"], "hidden_pct": 100 * hid / total if total else None}, ratio


# --------------------------------------------------------------------------- inside a rank
def step_figures(t, ops, elapsed_ms: float) -> dict:
    """One profiled step's ``FIELDS`` from its trace and its link ops."""
    from workbook import trace
    from workbook.trace import intervals
    from workbook.trace.analyse import all_compute, phase_ranges
    o = {ph: trace.overlap(t, within=ph) for ph in ("forward", "backward")}
    whole, busy = trace.overlap(t), {ph: intervals.measure(intervals.intersect(
        all_compute(t), phase_ranges(t, ph)[0])) / 1e3 for ph in ("forward", "backward")}
    return {"step_ms": elapsed_ms, "link_ms": sum(r.link_ns for r in ops) / 1e6,
            "exposed_ms": whole.exposed_comm_us / 1e3, "skew_ms": whole.skew_us / 1e3,
            "fwd_hidden_pct": o["forward"].overlap_pct, "bwd_hidden_pct": o["backward"].overlap_pct,
            "hidden_pct": whole.overlap_pct, "fwd_compute_ms": busy["forward"],
            "bwd_compute_ms": busy["backward"]}


def _rank_bench(o: dict, root: str) -> dict:
    from workbook import link
    from workbook.data_parallel import memory_by_kind, predicted_memory
    from workbook.measure.profiled_step import profiled_step
    from workbook.measure.calibration import recalibrate
    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig, make_batch
    from workbook.runtime import ranks
    from workbook.trace.capture import hardware
    lab, rank, n, dev = load_lab("dp_overlap", o["impl"]), dist.get_rank(), dist.get_world_size(), ranks.device()
    cfg = ModelConfig(hidden=o["hidden"], heads=o["heads"], ffn_hidden=o["ffn"], n_layers=o["layers"],
                      seq_len=o["seq"], vocab_size=o["vocab"], style=o["style"], dtype="float32")
    batch, small = ([x.to(dev) for x in make_batch(cfg, rows, seed=0)] for rows in (o["batch"], n))
    run = [*o["names"], *(["no_comm"] if "no_comm" not in o["names"] else [])]   # the prediction's
    trainers = {v: make_trainer(lab, v, cfg, dev) for v in run}

    def step(v, k, data):
        trainers[v].train_step(*data, k)
        drain(trainers[v])

    link.set_link(None)
    for v in run:
        for k in range(o["warmup"]):
            step(v, k, small)
    units = [sum(p.numel() for p in u.parameters()) for u in trainers["no_comm"].units]
    out = {"hardware": hardware(), "links": {}, "memory": {v: {
        "measured": memory_by_kind(trainers[v]),
        "predicted": predicted_memory(units, n, STAGE[v.split("@")[0]], 4)} for v in o["names"]}}
    for preset in o["links"]:
        if recalibrate(preset) is None:       # the matmul rate now; "none": no link
            link.set_link(None)
        rows = {v: {f: [] for f in FIELDS} for v in run}
        for k in range(o["steps"]):           # variants take turns, so noise hits them alike
            for v in run:
                ms, ops, t = profiled_step(lambda: step(v, k, batch), Path(root) / preset / v / f"step{k}",
                                           rank, "dp_overlap")
                for key, value in step_figures(t, ops, ms).items():
                    rows[v][key].append(value)
        med = {v: {f: statistics.median(x) if None not in x else None for f, x in r.items()}
               for v, r in rows.items()}
        lk, nc = link.current_link(), med["no_comm"]
        pred = {v: predict(v, trainers[v], cfg, o["batch"] // n, nc["fwd_compute_ms"] / 1e3,
                            nc["bwd_compute_ms"] / 1e3) if lk else ({}, None) for v in o["names"]}
        out["links"][preset] = {"link_label": lk.label if lk else None,
                                "variants": {v: med[v] for v in o["names"]},
                                "predicted": {v: p for v, (p, _) in pred.items()},
                                "ratios": {v: r for v, (_, r) in pred.items() if r is not None}}
    return out


# --------------------------------------------------------------------------- the figures
def _combine(rows: list[dict]) -> dict:
    """The slowest rank's times, the ranks' mean shares."""
    def one(key, xs):
        xs = [x for x in xs if x is not None]
        return None if not xs else max(xs) if key.endswith("_ms") else sum(xs) / len(xs)
    return {v: {k: one(k, [r[v][k] for r in rows]) for k in rows[0][v]} for v in rows[0]}


def _targets(v: dict, pred: dict, ratios: dict) -> dict:
    """``{name: {want, got, predicted, met}}``; met None where a bucket's ratio is not below 1."""
    out = {}
    for x in (x for x in v if "@" in x or x == "zero3"):
        key, want, r = ("fwd_hidden_pct", 85, ratios.get(x)) if x == "zero3" else ("hidden_pct", 80, ratios.get(x))
        got, applies = v[x][key], x == "zero3" or (r is not None and r < 1)
        out[f"{x} {'forward ' if x == 'zero3' else ''}hidden %"] = {
            "want": f">= {want}% ({'layer' if x == 'zero3' else 'bucket'} ratio {_fmt(r, '{:.2f}')})",
            "got": got, "predicted": pred[x].get(key), "met": None if got is None or not applies else got >= want}
    return out


def measure(*, impl: str = "solutions", nproc: int = 2, links=LINKS, variants=None, steps: int = 2,
            warmup: int = 1, trace_dir=None, **shape) -> dict:
    """Run the benchmark on ``nproc`` fresh ranks; return what ``--json`` writes (module
    docstring). ``shape``: any of ``DEFAULTS``, ``style``, ``buckets``; a bad option is a one-line
    ``SystemExit``."""
    from workbook.runtime import launch
    from workbook.link.presets import preset_names
    variants, o, links = list(VARIANTS if variants is None else variants), {**DEFAULTS, **EXTRA}, list(links)
    problems = [f"unknown option(s) {sorted(set(shape) - set(o))}"] if set(shape) - set(o) else []
    o.update(shape)
    unknown, bad_links = sorted(set(variants) - set(VARIANTS)), [x for x in links if x not in preset_names()]
    try:
        bad_sizes = [b for b in o["buckets"].split(",") if size(b) < 1]
    except ValueError:
        bad_sizes = [o["buckets"]]
    problems += [msg for bad, msg in (
        (unknown, f"unknown variant(s) {unknown}: choose from {', '.join(VARIANTS)}"),
        (bad_links, f"unknown link preset(s) {bad_links}: choose from {', '.join(preset_names())}"),
        (not links, "name at least one --link preset"),
        (bad_sizes, f"--buckets {o['buckets']!r}: sizes such as 256KiB,1MiB,4096"),
        (nproc < 1, f"--nproc {nproc} must be at least 1"),
        (steps < 1 or warmup < 0, "--steps must be at least 1 and --warmup at least 0"),
        (o["hidden"] % o["heads"], f"--heads {o['heads']} must divide --hidden {o['hidden']}"),
        (o["batch"] % max(nproc, 1), f"--nproc {nproc} must divide --batch {o['batch']} (rows a rank)"),
    ) if bad]
    if problems:
        raise SystemExit("workbook bench dp_overlap: " + "; ".join(problems))
    o.update(impl=impl, steps=steps, warmup=warmup, links=links, names=names(variants, o["buckets"]))
    with tempfile.TemporaryDirectory(prefix="dp-overlap-bench-") as tmp:   # traces: ~10 MB a step
        results = launch.run(_rank_bench, nproc, o, str(trace_dir or tmp), link=links[0], timeout=3600)
    out = {}
    for preset in links:
        per = [r["links"][preset] for r in results]
        v, pred = (_combine([p[key] for p in per]) for key in ("variants", "predicted"))
        out[preset] = {"link_label": per[0]["link_label"], "variants": v, "predicted": pred,
                       "ratios": per[0]["ratios"], "targets": _targets(v, pred, per[0]["ratios"])}
    return {"nproc": nproc, "options": o, "links": out, "memory": results[0]["memory"],
            "hardware": results[0]["hardware"], "torch": torch.__version__}


def _fmt(x, spec="{:.0f}"):
    return "-" if x is None else spec.format(x)


def report(result: dict) -> str:
    """Per preset a table (each figure, its prediction in brackets) and the targets; memory."""
    from workbook.measure.output import where_measured
    o, first = result["options"], next(iter(result["links"].values()))
    lines = [f"dp_overlap benchmark, {where_measured(first['link_label'], 'no simulated link')}: "
             f"{result['nproc']} ranks on {result.get('hardware', '?')}, torch {result.get('torch')}",
             f"model: {o['style']}, hidden {o['hidden']}, ffn {o['ffn']}, heads {o['heads']}, {o['layers']} "
             f"layers, vocab {o['vocab']}, fp32, Adam; global batch {o['batch']} x seq {o['seq']}; median "
             f"of {o['steps']} steps; measured (predicted by the overlap arithmetic)"]
    for preset, r in result["links"].items():
        v, p, base = r["variants"], r["predicted"], r["variants"].get("no_comm", {}).get("step_ms")
        lines += ["", f"[{preset}] {where_measured(r['link_label'], 'no simulated link')}",
                  f"{'variant':<16}{'step ms':>8}{'x opt':>7}{'link ms':>14}{'exposed ms':>14}"
                  f"{'skew':>6}{'fwd hid%':>11}{'bwd hid%':>11}{'all hid%':>11}"]
        for name, m in v.items():
            pair = lambda k, w: f"{_fmt(m[k])} ({_fmt(p[name].get(k))})".rjust(w)  # noqa: E731
            lines.append(f"{name:<16}{m['step_ms']:>8.0f}{_fmt(base and m['step_ms'] / base, '{:.2f}'):>7}"
                         f"{pair('link_ms', 14)}{pair('exposed_ms', 14)}{_fmt(m['skew_ms']):>6}"
                         f"{pair('fwd_hidden_pct', 11)}{pair('bwd_hidden_pct', 11)}{pair('hidden_pct', 11)}")
        lines += ["targets (benchmark figures, not timed tests):"] + [
            f"  {name:<26}{t['want']:<30}{_fmt(t['got'], '{:.1f}%'):>7} (predicted "
            f"{_fmt(t['predicted'], '{:.1f}%')})  " + {True: "met", False: "NOT met",
                                                       None: "n/a: the comm exceeds the compute"}[t["met"]]
            for name, t in r["targets"].items()]
    lines += ["", "bucket ratio: its all-reduces / backward compute; layer ratio: one block's all-gather "
                  "/ its forward compute (below 1: can hide)",
              "memory per rank, MiB measured (predicted): parameters / gradients / optimizer state"]
    for name, m in result["memory"].items():
        lines.append(f"{name:<16}" + " / ".join(f"{m['measured'][k] / 2**20:.2f} ({m['predicted'][k] / 2**20:.2f})"
                                                 for k in ("parameters", "gradients", "optimizer")))
    return "\n".join(lines + ["simulated figures: a CPU in slow motion, calibrated to the preset's "
                              "compute/link ratio"])


def figure(result: dict):
    """Per preset, each variant's step: compute and the rest, exposed link time (stacked), and
    the predicted exposed time (a diamond)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    from workbook.measure.output import where_measured
    links = result["links"]
    fig = make_subplots(cols=len(links), subplot_titles=[where_measured(r["link_label"], p)
                                                         for p, r in links.items()])
    for col, r in enumerate(links.values(), 1):
        v, p = r["variants"], r["predicted"]
        for name, y, kind in (("compute and the rest", [m["step_ms"] - (m["exposed_ms"] or 0) for m in v.values()], go.Bar),
                              ("exposed link time", [m["exposed_ms"] for m in v.values()], go.Bar),
                              ("predicted exposed", [p[n].get("exposed_ms") for n in v], go.Scatter)):
            fig.add_trace(kind(name=name, x=list(v), y=y, showlegend=col == 1, legendgroup=name,
                               **({"mode": "markers", "marker_symbol": "diamond"} if kind is go.Scatter else {})), 1, col)
    fig.update_layout(barmode="stack", yaxis_title="step time (ms)", height=480, width=1200,
                      title=f"dp_overlap, {result['nproc']} ranks, SIMULATED links")
    return fig


def run_bench(args) -> dict:
    from workbook.measure.bench_cli import listed, measure_and_save
    return measure_and_save(args, measure, report, figure, links=args.links,
                            variants=listed(args.variants), steps=args.steps, warmup=args.warmup,
                            **{k: getattr(args, k) for k in (*DEFAULTS, *EXTRA)})
