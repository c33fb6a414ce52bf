"""``workbook bench tp_overlap``: sequence-parallel TP with its communication inside the GEMMs,
against plain SP, Domino and the no-communication optimum, on one model.

Every variant trains the same model on the same ranks, weights, batch and link: ``layers``
blocks, then the replicated final norm, LM head and loss of ``workbook.tensor_parallel.layer_stack``. The lab's
variants run ``OverlapBlock`` s on sequence shards ``[B, S/n, H]`` (the reference's weights, as
the TPStack's), gather the sequence for the head, and after backward sum the sequence-parallel
gradients (``sync_sequence_parallel_grads``, in the backward phase):

* ``sp``             plain sequence-parallel TP: every all-gather and reduce-scatter waited on;
* ``bulk``           backward only: dgrad GEMM hides the input's all-gather (one more than sp:
                     only the shard is kept), wgrad GEMM hides dgrad's reduce-scatter;
* ``pipelined``      forward only: all-gather + GEMM and GEMM + reduce-scatter as ring exchanges
                     (n - 1 p2p steps, each behind one shard's GEMM; also the row dgrad);
* ``pipelined+bulk`` both (NeMo's ``tp_comm_overlap``);
* ``chunked+bulk``   as pipelined+bulk, the forward reduce-scatter as ``--chunks`` async pieces;
* ``domino``         the ``domino`` lab on a ``TPStack`` of the same shapes (``--p`` chunks);
* ``no_comm``        the optimum: the faster of vanilla TP with every collective skipped and
                     Domino's chunks with a registry that starts nothing (``domino_measure``).

Measured as ``workbook bench domino`` measures: after a warm-up the ranks recalibrate the link
(``workbook.measure.calibration.recalibrate``); each step runs in ``rank_trace`` with
``record_function`` ranges ``forward`` and ``backward``; variants take turns, step after step;
medians over the steps, then the slowest rank (overlaps: the ranks' mean). Every rank's model
and batch sit on its device (``model_on_rank``). Per variant:

* ``step_ms``          wall time of one training step;
* ``comm_ms``          modelled link time: how long the link was busy (the union of the ops'
                       modelled spans; a ring step's send and receive travel together, full duplex);
* ``exposed_comm_ms``  link time no compute ran beside (``trace.overlap(t).exposed_comm_us``);
* ``overlap_fwd_pct`` / ``overlap_bwd_pct``  share of the link time hidden, per phase.

``f = comm / (comm + no-comm step)`` with plain SP's link time; hiding every byte of it gives at
most ``ceiling = 1 / (1 - f)``. ``targets``: the issue's figures for pipelined+bulk (forward
hidden >= (n-1)/n x 90%, backward >= 85%, step <= 1.15x no_comm, >= 1.2x faster than sp, at
f = 25-40%), each with ``want``, ``got`` and ``met``; they are benchmark figures, not tests.
Figures are on the simulated link (``workbook.link``): a CPU in slow motion, labelled so.

    workbook bench tp_overlap --link dgx-h100 --json tp_overlap.json --figure tp_overlap.html
"""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

LAB_VARIANTS = ("sp", "bulk", "pipelined", "pipelined+bulk", "chunked+bulk")
VARIANTS = (*LAB_VARIANTS, "domino", "no_comm")
FIELDS = ("step_ms", "comm_ms", "exposed_comm_ms", "overlap_fwd_pct", "overlap_bwd_pct")
# bench_domino's shapes, for a like-for-like comparison: plain SP at a communication fraction of
# about 30% on dgx-h100 with 2 ranks (README); 2048-row shards, so that a ring step's bytes, not
# the preset's per-op latency, set its time.
DEFAULTS = dict(hidden=768, heads=12, ffn=3072, layers=2, batch=16, seq=256, vocab=1024, p=4)
EXTRA = dict(style="gpt", chunks=2)         # options that are not shapes of the model
NO_LINK = "no simulated link (plain gloo)"


def add_arguments(parser) -> None:
    from workbook.tensor_parallel.block_bench import add_model_arguments
    add_model_arguments(parser, DEFAULTS, VARIANTS, steps=2)
    parser.add_argument("--chunks", type=int, default=2, help="chunked+bulk's pieces (default 2)")
    for name, what in (("json", "the results as JSON"), ("figure", "the figure (plotly HTML)")):
        parser.add_argument(f"--{name}", default=None, metavar="PATH", help=f"write {what}")


# --------------------------------------------------------------------------- inside a rank
def _busy_ms(ops) -> float:
    """How long the link carried something: the union of the ops' modelled spans."""
    total, end = 0, 0
    for s, e in sorted((o.start_ns, o.end_ns) for o in ops):
        total += max(0, e - max(s, end))
        end = max(end, e)
    return total / 1e6


def lab_step(lab, blocks, m, xs, targets, step: int = 0):
    """One step of a ``tp_overlap`` variant: ``blocks`` on this rank's sequence shard ``xs``
    ``[B, S/n, H]``, the sequence gathered for the TPStack ``m``'s replicated head and loss;
    backward, then the sequence-parallel gradients summed. Returns the loss."""
    from workbook.tensor_parallel import layer_stack
    from workbook.tensor_parallel.block_bench import GatherSequenceSplitBackward
    with torch.profiler.record_function("forward"):
        h = xs
        for block in blocks:
            h = block(h, step)                                                # [B, S/n, H]
        full = GatherSequenceSplitBackward.apply(h)                          # [B, S, H]
        loss = layer_stack.head_loss(m, full, targets, targets.numel())
    with torch.profiler.record_function("backward"):
        loss.backward()
        lab.sync_sequence_parallel_grads(blocks)
    return loss.detach()


def model_on_rank(opts: dict, lab, device):
    """This rank's model and batch for the benchmark, all on ``device`` (the rank's: a GPU rank's
    collectives take no CPU tensor): ``(cfg, x, xs, targets, m, blocks)``: the batch ``x``
    ``[B, S, H]`` and ``targets``, this rank's sequence shard ``xs`` ``[B, S/n, H]``, the
    ``TPStack`` ``m`` (the head; Domino's stack), and per lab variant its ``OverlapBlock`` s
    (``lab``: the tp_overlap lab, or None when no lab variant runs)."""
    from dataclasses import replace

    from workbook.model import ModelConfig
    from workbook.tensor_parallel import layer_stack
    from workbook.tensor_parallel.block_bench import inputs
    from workbook.tensor_parallel.mappings import sequence_range
    cfg = ModelConfig(hidden=opts["hidden"], heads=opts["heads"], ffn_hidden=opts["ffn"],
                      n_layers=opts["layers"], seq_len=opts["seq"], vocab_size=opts["vocab"],
                      style=opts["style"], dtype="float32")
    x, targets = inputs(cfg, opts["batch"], device=device)
    xs = x[:, slice(*sequence_range(cfg.seq_len))].contiguous()              # [B, S/n, H]
    m = layer_stack.TPStack(cfg, dist.get_rank(), dist.get_world_size(), device=device)
    blocks = {v: torch.nn.ModuleList(
        lab.OverlapBlock(cfg, i, device, replace(lab.VARIANTS[v], chunks=opts["chunks"]))
        for i in range(cfg.n_layers)) for v in opts["variants"] if v in LAB_VARIANTS}
    return cfg, x, xs, targets, m, blocks


def _rank_bench(opts: dict, trace_root: str) -> dict:
    from workbook import link
    from workbook.measure.profiled_step import overlap_fields, profiled_step
    from workbook.measure.calibration import recalibrate
    from workbook.tensor_parallel.variant_step import training_step
    from workbook.grading.labs import load_lab
    from workbook.runtime import ranks
    from workbook.trace.capture import hardware
    rank = dist.get_rank()
    lab = load_lab("tp_overlap", opts["impl"]) if set(LAB_VARIANTS) & set(opts["variants"]) else None
    domino = load_lab("domino", opts["impl"]) if {"domino", "no_comm"} & set(opts["variants"]) else None
    _, x, xs, targets, m, blocks = model_on_rank(opts, lab, ranks.device())
    variants = [v for v in opts["variants"] if v != "no_comm"]
    if "no_comm" in opts["variants"]:       # the optimum: the faster no-communication schedule
        variants += ["no_comm", "no_comm_domino"]

    def step(variant, k):
        if variant in blocks:
            lab_step(lab, blocks[variant], m, xs, targets, k)
            blocks[variant].zero_grad(set_to_none=True)
            m.zero_grad()
        else:
            training_step(domino, m, x, targets, variant, p=opts["p"], step=k)

    for variant in variants:
        for k in range(opts["warmup"]):
            step(variant, k)
    recalibrate()                           # a busy machine slows compute, not the link
    rows = {v: {f: [] for f in FIELDS} for v in variants}
    for k in range(opts["steps"]):          # variants take turns, so noise hits them alike
        for variant in variants:
            elapsed, ops, t = profiled_step(lambda: step(variant, k),
                                            Path(trace_root) / variant / f"step{k}", rank, "tp_overlap")
            figures = {"step_ms": elapsed, "comm_ms": _busy_ms(ops), **overlap_fields(t, ops)}
            for key, value in figures.items():
                rows[variant][key].append(value)
    lk = link.current_link()
    return {"rank": rank, "link_label": lk.label if lk else None, "hardware": hardware(), "variants": {
        v: {f: (statistics.median(xs) if xs and None not in xs else None) for f, xs in r.items()}
        for v, r in rows.items()}}


# --------------------------------------------------------------------------- the figures
def _combine(results: list[dict]):
    """Slowest rank's times, the ranks' mean overlaps; no_comm: the faster schedule."""
    def mean(xs):
        xs = [x for x in xs if x is not None]
        return sum(xs) / len(xs) if xs else None
    merged = {v: {f: (max if f.endswith("_ms") else mean)([r["variants"][v][f] for r in results])
                  for f in FIELDS} for v in results[0]["variants"]}
    from workbook.tensor_parallel.block_bench import fold_optimum
    return merged, fold_optimum(merged)


def _targets(v: dict, n: int, f) -> dict:
    """The issue's targets for ``pipelined+bulk``: ``{name: {want, got, met}}`` (met: None
    where there is no target, only a figure to read beside them)."""
    pb, sp, nc, dom = (v.get(k) for k in ("pipelined+bulk", "sp", "no_comm", "domino"))
    if pb is None:
        return {}
    fwd = (n - 1) / n * 90
    rows = [("forward hidden %", f">= {fwd:.0f}% ((n-1)/n x 90%)", pb["overlap_fwd_pct"], lambda g: g >= fwd),
            ("backward hidden %", ">= 85%", pb["overlap_bwd_pct"], lambda g: g >= 85)]
    if nc:
        rows.append(("step / no_comm", "<= 1.15x", pb["step_ms"] / nc["step_ms"], lambda g: g <= 1.15))
    if pb["exposed_comm_ms"] is not None:
        rows.append(("step / (step - exposed)", "(same step: no noise)",
                     pb["step_ms"] / (pb["step_ms"] - pb["exposed_comm_ms"]), None))
    if sp:
        rows.append(("speed-up over sp", ">= 1.2x", sp["step_ms"] / pb["step_ms"], lambda g: g >= 1.2))
    if f is not None:
        rows.append(("comm fraction f %", "25-40% (the setting)", f, lambda g: 25 <= g <= 40))
    if dom:
        rows.append(("domino / pipelined+bulk", "(like for like)", dom["step_ms"] / pb["step_ms"], None))
    return {name: {"want": want, "got": got, "met": None if ok is None or got is None else bool(ok(got))}
            for name, want, got, ok in rows}


def measure(*, impl: str = "solutions", nproc: int = 2, link: str = "dgx-h100", variants=None,
            steps: int = 1, warmup: int = 1, trace_dir=None, **shape) -> dict:
    """Run the benchmark on ``nproc`` fresh ranks; return what ``--json`` writes (see the module
    docstring). ``shape``: any of ``DEFAULTS``, ``style`` and ``chunks``; a bad option is a
    one-line ``SystemExit``."""
    from workbook.runtime import launch
    from workbook.link.presets import preset_names
    variants, o = list(VARIANTS if variants is None else variants), {**DEFAULTS, **EXTRA}
    problems = [f"unknown option(s) {sorted(set(shape) - set(o))}"] if set(shape) - set(o) else []
    o.update(shape)
    unknown, n, S = sorted(set(variants) - set(VARIANTS)), max(nproc, 1), o["seq"]
    problems += [msg for bad, msg in (
        (unknown, f"unknown variant(s) {unknown}: choose from {', '.join(VARIANTS)}"),
        (link not in preset_names(),
         f"unknown link preset {link!r}: choose one of {', '.join(preset_names())}"),
        (nproc < 1, f"--nproc {nproc} must be at least 1"),
        (steps < 1 or warmup < 0, "--steps must be at least 1 and --warmup at least 0"),
        (o["batch"] % o["p"], f"--p {o['p']} must divide --batch {o['batch']}"),
        (o["hidden"] % o["heads"], f"--heads {o['heads']} must divide --hidden {o['hidden']}"),
        (o["heads"] % n, f"--nproc {n} must divide --heads {o['heads']}"),
        (o["ffn"] % n, f"--nproc {n} must divide --ffn {o['ffn']}"),
        (S % n, f"--nproc {n} must divide --seq {S} (sequence shards)"),
        ("chunked+bulk" in variants and (S // n) % o["chunks"],
         f"--chunks {o['chunks']} must divide the {S // n} positions of a shard (--seq / --nproc)"),
    ) if bad]
    if problems:
        raise SystemExit("workbook bench tp_overlap: " + "; ".join(problems))
    o.update(impl=impl, steps=steps, warmup=warmup, variants=variants)
    root = trace_dir or tempfile.mkdtemp(prefix="tp-overlap-bench-")
    results = launch.run(_rank_bench, nproc, o, str(root), link=link, timeout=1800)
    v, schedules = _combine(results)
    f = ceiling = None
    if "sp" in v and "no_comm" in v:
        c, b = v["sp"]["comm_ms"], v["no_comm"]["step_ms"]
        f, ceiling = 100 * c / (c + b), (c + b) / b                          # ceiling = 1 / (1 - f)
    return {"link": link, "nproc": nproc, "options": o, "comm_fraction_pct": f, "ceiling": ceiling,
            "variants": v, "no_comm_schedules_ms": schedules, "link_label": results[0]["link_label"],
            "hardware": results[0]["hardware"], "torch": torch.__version__,
            "targets": _targets(v, nproc, f)}


def _fmt(x, spec="{:.0f}"):
    return "-" if x is None else spec.format(x)


def report(result: dict) -> str:
    """The table: per variant its figures, then the ceiling and the targets (met / not met)."""
    from workbook.measure.output import where_measured
    v, o = result["variants"], result["options"]
    lines = [f"tp_overlap benchmark, {where_measured(result['link_label'], NO_LINK)}: "
             f"{result['nproc']} ranks on {result.get('hardware', '?')}, torch {result.get('torch')}",
             f"model: {o['style']}, hidden {o['hidden']}, ffn {o['ffn']}, heads {o['heads']}, "
             f"{o['layers']} layers, batch {o['batch']} x seq {o['seq']}, vocab {o['vocab']}, fp32; "
             f"Domino p={o['p']}, chunked+bulk {o['chunks']} pieces; median of {o['steps']} steps",
             "", f"{'variant':<16}{'step ms':>9}{'link ms':>9}{'exposed':>9}{'fwd hid%':>10}"
             f"{'bwd hid%':>10}{'x no-comm':>11}{'vs sp':>8}"]
    base, sp = (v.get(k, {}).get("step_ms") for k in ("no_comm", "sp"))
    for name in (n for n in VARIANTS if n in v):
        r = v[name]
        lines.append(f"{name:<16}{_fmt(r['step_ms']):>9}{_fmt(r['comm_ms']):>9}"
                     f"{_fmt(r['exposed_comm_ms']):>9}{_fmt(r['overlap_fwd_pct'], '{:.1f}'):>10}"
                     f"{_fmt(r['overlap_bwd_pct'], '{:.1f}'):>10}"
                     f"{_fmt(r['step_ms'] / base if base else None, '{:.2f}x'):>11}"
                     f"{_fmt(sp / r['step_ms'] if sp else None, '{:.2f}x'):>8}")
    if result.get("no_comm_schedules_ms"):
        lines.append("no_comm: the faster of " + ", ".join(
            f"{k} {ms:.0f} ms" for k, ms in result["no_comm_schedules_ms"].items()))
    if result["ceiling"] is not None:
        lines += ["", f"communication fraction f = comm / (comm + no-comm step) = "
                      f"{result['comm_fraction_pct']:.1f}% (plain SP's link time); ceiling "
                      f"1/(1-f) = {result['ceiling']:.2f}x over sp, were sp's compute the optimum's"]
    if result["targets"]:
        lines += ["", "targets for pipelined+bulk (benchmark figures, not timed tests):"]
        for name, t in result["targets"].items():
            got = _fmt(t["got"], "{:.1f}%" if "%" in name else "{:.2f}x")
            lines.append(f"  {name:<26}{t['want']:<28}{got:>9}  "
                         + {True: "met", False: "NOT met", None: ""}[t["met"]])
    if "domino" in v and "pipelined+bulk" in v:
        d, pb = v["domino"], v["pipelined+bulk"]
        lines.append(f"like for like (same model, weights, batch, ranks and link): Domino "
                     f"{d['step_ms']:.0f} ms, {_fmt(d['exposed_comm_ms'])} ms exposed; "
                     f"pipelined+bulk {pb['step_ms']:.0f} ms, {_fmt(pb['exposed_comm_ms'])} ms exposed")
    lines.append("simulated figures: a CPU in slow motion, calibrated to the preset's compute/link "
                 "ratio" if result["link_label"] else "no simulated link: plain gloo on this CPU")
    return "\n".join(lines)


def figure(result: dict):
    """Per variant, the step split into compute and exposed communication; the optimum's line."""
    import plotly.graph_objects as go
    from workbook.measure.output import where_measured
    v = result["variants"]
    names = [n for n in VARIANTS if n in v]
    exposed = [v[n]["exposed_comm_ms"] or 0 for n in names]
    fig = go.Figure([go.Bar(name="compute (and the rest)", x=names,
                            y=[v[n]["step_ms"] - e for n, e in zip(names, exposed)]),
                     go.Bar(name="exposed communication", x=names, y=exposed)])
    if "no_comm" in v:
        fig.add_hline(y=v["no_comm"]["step_ms"], line_dash="dot",
                      annotation_text="no-communication optimum")
    f = result["comm_fraction_pct"]
    fig.update_layout(barmode="stack", yaxis_title="step time (ms)", height=480, width=900,
                      title=f"tp_overlap, {result['nproc']} ranks, "
                            f"{where_measured(result['link_label'], NO_LINK)}"
                            + (f"; plain SP's comm fraction {f:.0f}%" if f is not None else ""))
    return fig


def run_bench(args) -> dict:
    from workbook.measure.bench_cli import listed, measure_and_save
    return measure_and_save(args, measure, report, figure, link=args.link,
                            variants=listed(args.variants), steps=args.steps, warmup=args.warmup,
                            **{k: getattr(args, k) for k in (*DEFAULTS, *EXTRA)})


def main(argv=None) -> None:
    from workbook.measure.bench_cli import run_as_command
    run_as_command(add_arguments, run_bench, "sequence-parallel TP overlap vs plain SP and Domino",
                   argv)


if __name__ == "__main__":
    main()
