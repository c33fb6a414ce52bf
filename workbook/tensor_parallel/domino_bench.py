"""``workbook bench domino``: vanilla TP, Domino and the no-communication optimum on one model.

Every variant trains the same model (same weights, batch and link) on the same ranks, one after
the other; each step runs inside the profiler (``workbook.trace.capture.rank_trace``), with the
forward and backward passes in ``record_function`` ranges, so that overlap is read from the
trace exactly as the grader reads it:

* ``vanilla_tp``   Megatron TP: every all-reduce waited on at once;
* ``sp``           sequence-parallel TP (Korthikanti et al., 2022): the same weights, norms and
                   residuals on sequence shards, an all-gather into and a reduce-scatter out of
                   every sublayer (the ``sp`` lab's conjugate ops) -- the same bytes as vanilla,
                   also waited on at once;
* ``domino_intra`` Domino with the batch cut into ``p`` chunks, waiting at each layer boundary;
* ``domino``       Domino, intra- and inter-layer;
* ``no_comm``      the same compute with every collective skipped (wrong numbers, right
                   time): the optimum a perfect overlap would reach. Both schedules run without
                   collectives, vanilla TP's whole batch (``comm=False``) and Domino's chunks (a
                   registry that starts nothing: ``workbook.tensor_parallel.domino_measure``; on a CPU the
                   chunks' smaller working set can be faster), and the faster one is the optimum.

Per variant (medians over the measured steps, slowest rank): step time, modelled link time
(``comm_ms``), communication the compute did not hide (``exposed_comm_ms``, from the trace) and
the share hidden in the forward and the backward pass. The communication fraction is
``f = comm / (comm + no-comm step)`` with vanilla TP's modelled link time; hiding all of it
would make vanilla TP ``1 / (1 - f)`` times faster, and no schedule beats the optimum itself
(``vanilla / no_comm``, which also counts the chunks' faster compute). Vanilla TP's waiting is split into the modelled link time
and the real gloo time the link cannot explain (rank skew on shared cores): per op,
``arrival - issued`` against the modelled time.

On CPU ranks the figures are on the simulated link (``workbook.link``, ``dgx-h100`` unless
``--link`` says otherwise): a CPU in slow motion, labelled so. On GPUs (``--backend nccl`` or
``cuda``, or by default where there is a GPU per rank) nothing is simulated unless ``--link``
asks for it: step times are real (the GPU synchronized around each step), ``comm_ms`` is the
time NCCL kernels ran, the overlaps are NCCL kernels under compute kernels on other streams, and
the table names the GPU model.

With ``--nnodes N`` the ranks form N simulated nodes (``launch.run(..., nnodes=N)``): tensor
parallelism then spans nodes, its all-reduces costed on NVLink inside each node and one network
card per rank between them (``workbook.link.topology``), the Domino paper's multi-node setting
(TP across two DGX-H100s, section 5).

    workbook bench domino --link dgx-h100 --json domino.json
    workbook bench domino --nproc 4 --nnodes 2                # TP = 4 over 2 nodes of 2
    workbook bench domino --backend nccl --nproc 2          # real GPUs, real figures
"""
from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from workbook.tensor_parallel import layer_stack
from workbook.tensor_parallel.block_bench import GatherSequenceSplitBackward, add_model_arguments
from workbook.runtime.gpu import add_backend_argument
from workbook.tensor_parallel.mappings import row_parallel_name

VARIANTS = ("vanilla_tp", "sp", "domino_intra", "domino", "no_comm")
# The default model sits at a communication fraction of about 30% on the dgx-h100 preset (see
# the README): narrow enough that TP's all-reduces matter, 256-token rows so that each of
# Domino's chunks is mostly bytes rather than link latency.
DEFAULTS = dict(hidden=768, heads=12, ffn=3072, layers=2, batch=16, seq=256, vocab=1024, p=4)


def add_arguments(parser) -> None:
    add_model_arguments(parser, DEFAULTS, VARIANTS, steps=3)
    parser.set_defaults(link=None)
    parser._option_string_actions["--link"].help = (
        "simulated link preset (default: dgx-h100 on CPU ranks, none on GPUs)")
    add_backend_argument(parser)
    parser.add_argument("--lookahead", type=int, default=1, help="Domino's prepare-ahead (default 1)")
    parser.add_argument("--nnodes", type=int, default=1,
                        help="simulated nodes the ranks are split into, NVLink inside and the "
                             "preset's network between (default 1)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")


def resolve(backend: str | None, link: str | None, nproc: int):
    """``(layout, link)``: where the ranks run (``workbook.runtime.gpu.Layout``) and the link preset.
    Without ``--link``: ``dgx-h100`` for CPU ranks (a CPU needs a modelled link to show any
    overlap), none on GPUs (the real interconnect is what is measured)."""
    from workbook.runtime.ranks import rank_layout
    if link is None:
        layout = rank_layout(backend, nproc, "none")
        return layout, "none" if layout.on_gpu else "dgx-h100"
    return rank_layout(backend, nproc, link), link


# --------------------------------------------------------------------------- inside a rank
def _rank_bench(opts: dict, trace_root: str) -> dict:
    from workbook import link
    from workbook.runtime import launch
    from workbook.tensor_parallel.block_bench import inputs
    from workbook.measure.profiled_step import overlap_fields, profiled_step
    from workbook.tensor_parallel.variant_step import training_step
    from workbook.trace.capture import hardware
    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig
    from workbook.tensor_parallel.layer_stack import TPStack
    lab = load_lab("domino", opts["impl"])
    sp = load_lab("sp", opts["impl"]) if "sp" in opts["variants"] else None
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ModelConfig(hidden=opts["hidden"], heads=opts["heads"], ffn_hidden=opts["ffn"],
                      n_layers=opts["layers"], seq_len=opts["seq"], vocab_size=opts["vocab"],
                      style=opts["style"], dtype="float32")
    dev = launch.device()
    x, targets = inputs(cfg, opts["batch"], device=dev)
    m = TPStack(cfg, rank, world, device=dev)
    gpu = dev.type == "cuda"
    out = {"rank": rank, "link": link.current_link().describe() if link.current_link() else None,
           "hardware": hardware(), "variants": {}}
    variants = [v for v in opts["variants"] if v != "no_comm"]
    if "no_comm" in opts["variants"]:       # the optimum: the faster no-communication schedule
        variants += ["no_comm", "no_comm_domino"]

    def step(variant, k):
        if variant == "sp":
            with torch.profiler.record_function("forward"):
                loss = _sp_forward(sp, m, x, targets, k)
            with torch.profiler.record_function("backward"):
                loss.backward()
                _all_reduce_sequence_parallel_grads(m)
            m.zero_grad()
        else:
            training_step(lab, m, x, targets, variant, p=opts["p"], step=k,
                          lookahead=opts["lookahead"])

    for variant in variants:
        for k in range(opts["warmup"]):
            step(variant, k)
    rows = {v: {f: [] for f in ("step_ms", "comm_ms", "exposed_comm_ms", "overlap_fwd_pct",
                                "overlap_bwd_pct", "gloo_arrival_ms", "beyond_modelled_ms")}
            for v in variants}
    for k in range(opts["steps"]):          # variants take turns, so noise hits them alike
        for variant in variants:
            elapsed, ops, t = profiled_step(lambda: step(variant, k),
                                            Path(trace_root) / variant / f"step{k}", rank, "domino")
            figures = _gpu_figures(elapsed, t) if gpu else {
                "step_ms": elapsed, "comm_ms": sum(o.link_ns for o in ops) / 1e6,
                "gloo_arrival_ms": sum(max(0, o.arrival_ns - o.issued_ns) for o in ops) / 1e6,
                "beyond_modelled_ms": sum(max(0, o.arrival_ns - o.end_ns) for o in ops) / 1e6,
                **overlap_fields(t, ops)}
            for key, value in figures.items():
                rows[variant][key].append(value)
    for variant, r in rows.items():
        out["variants"][variant] = {f: (statistics.median(v) if v and None not in v else None)
                                    for f, v in r.items()}
    return out


def _gpu_figures(elapsed_ms: float, t) -> dict:
    """One step's figures on a GPU, from its trace: ``comm_ms`` is the time NCCL kernels ran
    (their union), the overlaps NCCL kernels under compute kernels, per pass. Nothing is modelled,
    so the CPU-only fields (gloo arrival, beyond the modelled end) are None."""
    from workbook import trace
    o = trace.overlap(t)
    return {"step_ms": elapsed_ms, "comm_ms": o.comm_us / 1e3,
            "exposed_comm_ms": o.exposed_comm_us / 1e3,
            "overlap_fwd_pct": trace.overlap_pct(t, within="forward") if o.comm_us else None,
            "overlap_bwd_pct": trace.overlap_pct(t, within="backward") if o.comm_us else None,
            "gloo_arrival_ms": None, "beyond_modelled_ms": None}


# --------------------------------------------------------------------------- sequence-parallel TP
def _sp_forward(sp, m, x, targets, step: int):
    """Sequence-parallel TP on the Domino stack's weights and compute functions.

    Between sublayers each rank holds its sequence shard ``[B, S/t, H]`` (norm, bias, dropout
    and residual run there); ``sp.gather_from_sequence_parallel_region`` enters the sublayer
    (all-gather forward, reduce-scatter backward) and ``reduce_scatter_to_...`` leaves it
    (reduce-scatter forward, all-gather backward). The replicated LM head sees the whole
    sequence, gathered once at the end (its gradient is already whole: backward keeps this
    rank's slice, Megatron's ``tensor_parallel_output_grad=False``)."""
    B, S = x.shape[:2]
    seq = slice(*sp.sequence_range(S))
    xs = x[:, seq]                                                            # [B, S/t, H]
    for stage in layer_stack.stages(m.cfg.n_layers)[:-1]:
        layer, sub = stage
        h = sp.gather_from_sequence_parallel_region(layer_stack.pre_norm(m, stage, xs))  # [B, S, H]
        partial = layer_stack.compute_B(m, layer, sub, layer_stack.compute_A(m, layer, sub, h))
        y = sp.reduce_scatter_to_sequence_parallel_region(partial)            # [B, S/t, H]
        bias = m.optional(f"blocks.{layer}.{row_parallel_name(m.cfg, sub)}.bias")
        if bias is not None:
            y = y + bias
        if m.cfg.dropout > 0:
            y = y * m.mask(f"blocks.{layer}.{sub}.dropout", (B, S, y.shape[-1]), step)[:, seq]
        xs = xs + y
    full = GatherSequenceSplitBackward.apply(xs)                             # [B, S, H]
    return layer_stack.head_loss(m, full, targets, targets.numel())


def _all_reduce_sequence_parallel_grads(m) -> None:
    """The blocks' norm weights and row-parallel biases saw only this rank's positions: sum
    their gradients (one flat all-reduce of a few kB per step)."""
    from workbook.tensor_parallel.sequence_parallel import all_reduce_grads
    row_biases = (".attn.wo.bias", ".mlp.fc2.bias", ".mlp.w_down.bias")
    all_reduce_grads([t.grad for name, t in m.params.items() if t.grad is not None
                      and name.startswith("blocks.") and (".norm" in name or name.endswith(row_biases))])


# --------------------------------------------------------------------------- the table
def _combine(results: list[dict]) -> dict:
    """Slowest rank's step and exposed time; the mean of the ranks' overlaps."""
    merged = {}
    for v in results[0]["variants"]:
        rows = [r["variants"][v] for r in results]
        merged[v] = {
            "step_ms": max(r["step_ms"] for r in rows),
            "comm_ms": max(r["comm_ms"] for r in rows),
            "exposed_comm_ms": max(r["exposed_comm_ms"] for r in rows),
            "overlap_fwd_pct": _mean([r["overlap_fwd_pct"] for r in rows]),
            "overlap_bwd_pct": _mean([r["overlap_bwd_pct"] for r in rows]),
            "gloo_arrival_ms": _max([r["gloo_arrival_ms"] for r in rows]),
            "beyond_modelled_ms": _max([r["beyond_modelled_ms"] for r in rows])}
    from workbook.tensor_parallel.block_bench import fold_optimum
    schedules = fold_optimum(merged)
    if schedules is not None:
        merged["no_comm"]["schedules_ms"] = schedules
    return merged


def _max(xs):
    xs = [x for x in xs if x is not None]
    return max(xs) if xs else None


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _fmt(x, spec="{:.0f}"):
    return "-" if x is None else spec.format(x)


def report(result: dict) -> str:
    v, o = result["variants"], result["options"]
    simulated = result["link"] not in (None, "none")
    on_gpu = result.get("backend", "gloo") != "gloo"
    where = (f"simulated link {result['link']} ({result['link_label']})" if simulated else
             f"{result.get('hardware', 'unknown hardware')} ({result.get('backend', '?')}), real "
             f"figures, no simulated link")
    comm = ("modelled link time" if simulated else "NCCL kernel time" if result.get("backend") ==
            "nccl" else "gloo's collective time" if on_gpu else "link time")
    nnodes = result.get("nnodes", 1)
    nodes = (f" on {nnodes} simulated nodes of {result['nproc'] // nnodes}" if nnodes > 1 else "")
    lines = [f"Domino benchmark: {result['nproc']} ranks{nodes}, {where}",
             f"model: {o['style']}, hidden {o['hidden']}, ffn {o['ffn']}, heads {o['heads']}, "
             f"{o['layers']} layers, batch {o['batch']} x seq {o['seq']}, vocab {o['vocab']}, fp32; "
             f"Domino p={o['p']} chunks, lookahead {o['lookahead']}; {o['steps']} measured steps",
             "",
             f"{'variant':<14}{'step ms':>9}{'comm ms':>9}{'exposed':>9}{'fwd hid%':>10}"
             f"{'bwd hid%':>10}{'x no-comm':>11}{'speed-up':>10}"]
    base = v.get("no_comm", {}).get("step_ms")
    van = v.get("vanilla_tp", {}).get("step_ms")
    for name in VARIANTS:
        if name not in v:
            continue
        r = v[name]
        ms = "{:.2f}" if on_gpu else "{:.0f}"          # a GPU step takes milliseconds
        lines.append(f"{name:<14}{_fmt(r['step_ms'], ms):>9}{_fmt(r['comm_ms'], ms):>9}"
                     f"{_fmt(r['exposed_comm_ms'], ms):>9}{_fmt(r['overlap_fwd_pct'], '{:.1f}'):>10}"
                     f"{_fmt(r['overlap_bwd_pct'], '{:.1f}'):>10}"
                     f"{_fmt(r['step_ms'] / base if base else None, '{:.2f}x'):>11}"
                     f"{_fmt(van / r['step_ms'] if van else None, '{:.2f}x'):>10}")
    if "schedules_ms" in v.get("no_comm", {}):
        lines.append("no_comm: the faster of " + ", ".join(
            f"{k} {ms:.0f} ms" for k, ms in v["no_comm"]["schedules_ms"].items()))
    f = result.get("comm_fraction_pct")
    if f is not None:
        ceiling = 1 / (1 - f / 100)
        lines += ["", f"communication fraction f = comm / (comm + no-comm step) = {f:.1f}% "
                      f"(vanilla TP's {comm})",
                  f"1/(1-f) = {ceiling:.2f}x: the speed-up of hiding every byte, were vanilla TP's "
                  f"compute as fast as the optimum's"]
        if van and base:
            best = van / base                  # what reaching the optimum would give
            lines.append(f"vanilla TP / optimum = {best:.2f}x: communication explains 1/(1-f) = "
                         f"{ceiling:.2f}x, the rest ({best / ceiling:.2f}x) is compute that the "
                         f"optimum's schedule does faster (on a CPU, Domino's smaller chunks) and "
                         f"rank skew")
            if "domino" in v:
                s = van / v["domino"]["step_ms"]
                fair = (base + v["vanilla_tp"]["comm_ms"]) / v["domino"]["step_ms"]
                lines.append(f"Domino: {s:.2f}x over vanilla TP, {100 * s / best:.0f}% of the best "
                             f"possible {best:.2f}x; like for like (vanilla TP's link time added "
                             f"to the optimum's compute): {fair:.2f}x")
    if "vanilla_tp" in v and v["vanilla_tp"]["gloo_arrival_ms"] is not None:
        r = v["vanilla_tp"]
        lines.append(f"vanilla TP waits: {r['comm_ms']:.0f} ms modelled link time per step; the "
                     f"real gloo ops took {r['gloo_arrival_ms']:.0f} ms from issue to arrival, "
                     f"{r['beyond_modelled_ms']:.0f} ms of it beyond the modelled end (skew, CPU)")
    if nnodes > 1:
        lines.append(f"tensor parallelism spans {nnodes} nodes: its all-reduces cross the "
                     f"network (one card per rank; hierarchical where a node holds several ranks)"
                     if result.get("topology") else
                     f"{result['link']} is a flat link: every pair of ranks at one rate, so the "
                     f"{nnodes} nodes change nothing (dgx-h100 has a network between nodes)")
    if simulated:
        lines.append("simulated figures: a CPU in slow motion, calibrated to the preset's "
                     "compute/link ratio")
    elif not on_gpu:
        lines.append("no simulated link: loopback gloo on CPU makes communication almost free "
                     "(--link dgx-h100 models one)")
    else:
        lines.append(f"measured on {result.get('hardware')}: comm = NCCL kernels, hidden = NCCL "
                     f"kernels under compute kernels on other streams (read from the traces)"
                     if result.get("backend") == "nccl" else
                     f"measured on {result.get('hardware')} with gloo-cuda: comm = gloo's "
                     f"collectives on the host (CUDA tensors copied through host memory)")
        if result.get("ranks_per_gpu", 1) > 1:
            copies = ("NCCL's copies stay inside it" if result.get("backend") == "nccl" else
                      "gloo's copies go through this host's memory")
            lines.append(f"{result['ranks_per_gpu']} ranks share each GPU: their kernels compete "
                         f"for one GPU, and {copies} (no interconnect)")
    return "\n".join(lines)


def run_bench(args) -> dict:
    from workbook.runtime import launch
    opts = {k: getattr(args, k) for k in (*DEFAULTS, "style", "lookahead", "steps", "warmup", "impl")}
    opts["variants"] = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(opts["variants"]) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variant(s) {sorted(unknown)}: choose from {', '.join(VARIANTS)}")
    nnodes = getattr(args, "nnodes", 1)          # callers building args by hand may leave it out
    problems = [msg for bad, msg in (
        (args.batch % args.p, f"--p {args.p} must divide --batch {args.batch}"),
        (not 0 <= args.lookahead < args.p, f"--lookahead {args.lookahead} must be below --p {args.p}"),
        (args.hidden % args.heads, f"--heads {args.heads} must divide --hidden {args.hidden}"),
        (args.heads % args.nproc, f"--nproc {args.nproc} must divide --heads {args.heads}"),
        (nnodes < 1 or args.nproc % nnodes,
         f"--nnodes {nnodes} must divide --nproc {args.nproc} (nodes of equal size)"),
        (args.ffn % args.nproc, f"--nproc {args.nproc} must divide --ffn {args.ffn}"),
        ("sp" in opts["variants"] and args.seq % args.nproc,
         f"--nproc {args.nproc} must divide --seq {args.seq} (the sp variant shards the sequence)"),
    ) if bad]
    if problems:
        raise SystemExit("workbook bench domino: " + "; ".join(problems))
    layout, link = resolve(getattr(args, "backend", None), args.link, args.nproc)
    root = args.trace_dir or tempfile.mkdtemp(prefix="domino-bench-")
    results = launch.run(_rank_bench, args.nproc, opts, root, backend=layout.backend, link=link,
                         timeout=1800, nnodes=nnodes)
    variants = _combine(results)
    link_info = results[0]["link"] or {}
    result = {"link": link, "nproc": args.nproc, "nnodes": nnodes, "options": opts,
              "topology": bool(link_info.get("ranks_per_node")), "link_info": link_info,
              "backend": layout.backend,
              "hardware": results[0]["hardware"], "ranks_per_gpu": layout.ranks_per_gpu,
              "link_label": f"calibrated to {link_info.get('local_gflops', 0):.0f} GFLOP/s local"
              if link_info else "none", "variants": variants, "comm_fraction_pct": None}
    if "vanilla_tp" in variants and "no_comm" in variants:
        c, b = variants["vanilla_tp"]["comm_ms"], variants["no_comm"]["step_ms"]
        result["comm_fraction_pct"] = 100 * c / (c + b)
    print(report(result))
    if args.json:
        keys = ("step_ms", "comm_ms", "exposed_comm_ms", "overlap_fwd_pct", "overlap_bwd_pct")
        Path(args.json).write_text(json.dumps({
            "link": link, "nproc": args.nproc, "nnodes": nnodes, "backend": layout.backend,
            "hardware": result["hardware"], "simulated": link != "none",
            "comm_fraction_pct": result["comm_fraction_pct"],
            "variants": {k: {f: r[f] for f in keys} for k, r in variants.items()}}, indent=2))
    return result


def main(argv=None) -> None:
    from workbook.measure.bench_cli import run_as_command
    run_as_command(add_arguments, run_bench, "Domino vs vanilla TP vs no communication", argv)


if __name__ == "__main__":
    main()
