"""The ``workbook plan`` command: its options, and the prediction or the search as text or JSON.

    workbook plan --model llama3-405b --seq 8192 --nodes 1024 --peak-tflops 989 \\
        --tp 8 --pp 16 --virtual-stages 4 --global-batch-tokens 16M --fit-tflops 430
    workbook plan --layers 32 --hidden 4096 --ffn 14336 --heads 32 --vocab 128256 --seq 8192 \\
        --nodes 4 --global-batch 512 --search

Exit status: 0 the split fits in memory (``--search``: at least one split fits); 1 it does not
(how much over, and which term dominates); 2 a usage error or a broken rule, in one line.
"""
from __future__ import annotations

import argparse
import json

from workbook.capstone.plan_shapes import (MODELS, OVERLAPS, RECOMPUTE, Cluster, Model, PlanError,
                                           Split, micro_batches, parse_count, parse_overlaps)
from workbook.link.presets import PRESETS
from workbook.runtime.options import positive_count

MODEL_FIELDS = ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def typed(parse):
    """``parse`` as an ``argparse`` type: its ``PlanError`` becomes argparse's one-line error."""
    def convert(text: str):
        try:
            return parse(text)
        except PlanError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = parse.__name__
    return convert


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``workbook plan`` (cli.py's parser block calls this)."""
    m = p.add_argument_group("model (a --model preset, each field overridable)")
    m.add_argument("--model", choices=sorted(MODELS), default=None)
    for name in MODEL_FIELDS:
        m.add_argument(f"--{name.replace('_', '-')}", type=positive_count, default=None)
    m.add_argument("--seq", type=typed(parse_count), required=True, help="sequence length, tokens")
    c = p.add_argument_group("cluster")
    c.add_argument("--link", default="dgx-h100", help=f"link preset: {', '.join(PRESETS)}")
    c.add_argument("--nodes", type=positive_count, default=1)
    c.add_argument("--gpus-per-node", type=positive_count, default=None,
                   help="default: the preset's")
    c.add_argument("--peak-tflops", type=positive_float, default=None,
                   help="dense bf16 peak of one GPU (default: the preset's)")
    c.add_argument("--efficiency", type=positive_float, default=1.0,
                   help="share of the peak the GEMMs reach (default 1: fit one with --fit-tflops)")
    c.add_argument("--fit-tflops", type=positive_float, default=None, metavar="T",
                   help="fit the efficiency so that this split predicts T TFLOP/s per GPU")
    c.add_argument("--gpu-memory-gb", type=positive_float, default=80.0)
    s = p.add_argument_group("split")
    for name in ("tp", "cp", "pp"):
        s.add_argument(f"--{name}", type=positive_count, default=1)
    s.add_argument("--dp", type=positive_count, default=None, help="default: the GPUs left")
    s.add_argument("--micro-batch", type=positive_count, default=1, help="sequences")
    s.add_argument("--global-batch", type=positive_count, default=None, help="sequences")
    s.add_argument("--global-batch-tokens", type=typed(parse_count), default=None,
                   help="tokens (16M = 2^24), a multiple of --seq")
    s.add_argument("--virtual-stages", type=positive_count, default=1)
    s.add_argument("--overlap", type=typed(parse_overlaps), default=frozenset(OVERLAPS),
                   help=f"overlaps on: all (default), none, or a list of {','.join(OVERLAPS)}")
    s.add_argument("--zero", type=int, default=1, choices=(0, 1, 2, 3))
    s.add_argument("--recompute", choices=RECOMPUTE, default="none")
    s.add_argument("--embedding-as-layer", action="store_true",
                   help="the input embedding takes a layer's place in the pipeline split")
    s.add_argument("--loss-as-layer", action="store_true",
                   help="the output head and loss take a layer's place in the pipeline split")
    p.add_argument("--search", action="store_true", help="rank every split that fits in memory")
    p.add_argument("--top", type=positive_count, default=10, help="--search: rows shown")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def build(args) -> tuple[Model, Cluster, Split]:
    """The model, cluster and split the options describe (``PlanError`` for what is missing)."""
    if args.link not in PRESETS:
        raise PlanError(f"--link must be a real link preset: choose one of {', '.join(PRESETS)}")
    fields = dict(MODELS.get(args.model, {}))
    fields.update({k: getattr(args, k) for k in MODEL_FIELDS if getattr(args, k) is not None})
    missing = [f"--{k.replace('_', '-')}" for k in MODEL_FIELDS
               if k not in fields and k != "kv_heads"]
    if missing:
        raise PlanError(f"the model needs {', '.join(missing)} (or --model "
                        f"{'|'.join(sorted(MODELS))})")
    model = Model(seq=args.seq, **fields)
    preset = PRESETS[args.link]
    cluster = Cluster(args.link, args.nodes, args.gpus_per_node or preset.gpus_per_node,
                      args.peak_tflops or preset.peak_tflops, args.efficiency, args.gpu_memory_gb)
    batch = args.global_batch
    if args.global_batch_tokens is not None:
        if args.global_batch is not None:
            raise PlanError("give the global batch once: --global-batch or --global-batch-tokens")
        if args.global_batch_tokens % model.seq:
            raise PlanError(f"--global-batch-tokens {args.global_batch_tokens} is not a whole "
                            f"number of {model.seq}-token sequences: it must be a multiple of "
                            f"--seq")
        batch = args.global_batch_tokens // model.seq
    split = Split(args.tp, args.cp, args.pp, args.dp or 0, args.micro_batch, batch or 0,
                  args.virtual_stages, args.overlap, args.zero, args.recompute,
                  args.embedding_as_layer, args.loss_as_layer)
    return model, cluster, split


def run(args) -> int:
    from dataclasses import replace

    from workbook.capstone.plan import fit_efficiency, predict
    from workbook.capstone.plan_flops import total_params
    model, cluster, split = build(args)
    if args.fit_tflops is not None:
        if args.search:
            raise PlanError("--fit-tflops fits one split: run it without --search, then pass "
                            "--efficiency to the search")
        fitted = fit_efficiency(model, cluster, split, args.fit_tflops)
        cluster = replace(cluster, efficiency=fitted)
    head = {"model": {"seq": model.seq, "params": total_params(model),
                      **{k: getattr(model, k) for k in MODEL_FIELDS}},
            "cluster": {"link": cluster.link, "nodes": cluster.nodes, "gpus": cluster.gpus,
                        "gpus_per_node": cluster.gpus_per_node, "peak_tflops": cluster.peak_tflops,
                        "efficiency": cluster.efficiency, "gpu_memory_gb": cluster.gpu_memory_gb,
                        "fitted": args.fit_tflops is not None}}
    if args.search:
        return run_search(args, model, cluster, split, head)
    pred = predict(model, cluster, split)
    if args.json:
        print(json.dumps({**head, **pred.to_json()}, indent=2))
    else:
        print(describe(model, cluster, args))
        print(table(pred, cluster))
    return 0 if pred.memory.fits else 1


def describe(model: Model, cluster: Cluster, args) -> str:
    from workbook.capstone.plan_flops import total_params
    p = PRESETS[cluster.link]
    wires = f"{p.bandwidth_GBps:g} GB/s in a node" + (
        f", {p.nic_GBps:g} GB/s per GPU between nodes" if p.nic_GBps else ", flat")
    fitted = f" (fitted to {args.fit_tflops:g} TFLOP/s)" if args.fit_tflops else ""
    return (f"model: {model.layers} layers, hidden {model.hidden}, FFN {model.ffn}, {model.heads} "
            f"heads ({model.kv} KV), vocab {model.vocab}, seq {model.seq}: "
            f"{total_params(model) / 1e9:.1f} B parameters\n"
            f"cluster: {cluster.nodes} x {cluster.gpus_per_node} GPUs, {cluster.link} ({wires}); "
            f"peak {cluster.peak_tflops:g} TFLOP/s x efficiency {cluster.efficiency:.3f}{fitted}")


def table(pred, cluster: Cluster) -> str:
    from workbook.capstone.plan import bubble_fraction
    s, m = pred.split, micro_batches(pred.split)
    off = sorted(set(OVERLAPS) - s.overlaps)
    lines = [f"split: {s.describe()}, {s.global_batch} sequences per step ({m} micro-batches per "
             f"replica, bubble {bubble_fraction(s.pp, m, s.virtual):.1%}); ZeRO-{s.zero}, "
             f"recompute {s.recompute}; overlaps on: {','.join(sorted(s.overlaps)) or 'none'}"
             + (f" (off: {','.join(off)})" if off else ""),
             f"step {pred.step_s:.3f} s   {pred.tflops:.0f} TFLOP/s per GPU   MFU {pred.mfu:.1%}",
             f"  {'part':<12}{'s':>8}{'share':>8}{'comm s':>9}{'hidden':>8}"]
    for part, t in pred.parts.items():
        comm = pred.comm.get(part)
        extra = "" if comm is None else (f"{comm:>9.3f}" + (f"{1 - t / comm:>8.0%}" if comm else
                                                            f"{'-':>8}"))
        name = part if part in ("compute", "bubble") else f"{part} exposed"
        lines.append(f"  {name:<12}{t:>8.3f}{t / pred.step_s:>8.1%}{extra}")
    terms = " + ".join(f"{k} {v / 1e9:.1f}" for k, v in pred.memory.terms.items())
    lines.append(f"memory per GPU: {terms} GB; {pred.memory.verdict()}")
    return "\n".join(lines)


def run_search(args, model: Model, cluster: Cluster, split: Split, head: dict) -> int:
    from workbook.capstone.plan_search import search
    if not split.global_batch:
        raise PlanError("--search compares splits on one batch: give --global-batch or "
                        "--global-batch-tokens")
    found = search(model, cluster, split)
    top, big = found.fitting[:args.top], found.too_big[:min(args.top, 5)]
    if args.json:
        print(json.dumps({**head, "skipped": found.skipped, "fitting": len(found.fitting),
                          "too_big": len(found.too_big), "ranked": [p.to_json() for p in top],
                          "closest_too_big": [p.to_json() for p in big]}, indent=2))
        return 0 if found.fitting else 1
    print(describe(model, cluster, args))
    print(f"search: {len(found.fitting) + len(found.too_big)} splits of {cluster.gpus} GPUs obey "
          f"the rules ({found.skipped} do not); {len(found.fitting)} fit in "
          f"{cluster.gpu_memory_gb:g} GB, {len(found.too_big)} do not")
    if top:
        print(f"{'rank':>4}  {'split':<28}{'TFLOP/s':>8}{'MFU':>7}{'step s':>9}{'GB':>7}  "
              f"largest exposed part")
    for i, p in enumerate(top, 1):
        worst = max((k for k in p.parts if k != "compute"), key=p.parts.get)
        print(f"{i:>4}  {p.split.describe():<28}{p.tflops:>8.0f}{p.mfu:>7.1%}{p.step_s:>9.3f}"
              f"{p.memory.total / 1e9:>7.1f}  {worst} {p.parts[worst]:.3f} s")
    if big:
        print("closest that do not fit:")
        for p in big:
            print(f"      {p.split.describe():<28}{p.memory.verdict()}")
    return 0 if found.fitting else 1
