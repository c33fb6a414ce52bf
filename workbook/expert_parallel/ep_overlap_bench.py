"""``workbook bench ep_overlap``: how much of an MoE layer's all-to-all each variant of lab
``ep_overlap`` hides, on one node and across two, against the no-communication optimum.

Public functions (the report and lesson 13 may import them):

* ``measure(**options) -> dict`` runs the benchmark on fresh ranks (what ``--json`` writes);
  ``report(result) -> str`` the table and ``figure(result)`` the plotly figure;
  ``run_bench(args)`` all three for the command line; ``add_arguments(parser)`` its options;
  ``load_ep_lab(impl)`` the lab under test; ``_rank_bench(options, trace_dir)`` the rank side;
* ``step_figures(t, ops, elapsed_ms, mid_ns, loss, counts_bytes, rank) -> dict``: one profiled
  step on one rank, from its trace and its link ops; ``combine(ranks) -> dict``: the ranks as one row.

The targets, the table and the figure are in ``ep_overlap_figures``.

What runs. Each rank holds its part of one MoE layer (``local_moe``: the router, ``--experts``
/ p experts of inner width ``--expert-hidden``, a shared expert of ``--shared-hidden``; GPT
style, fp32, no capacity limit, so every variant computes the same numbers) and ``--tokens`` of
the batch's tokens (``[T, --hidden]``). One training step is the layer's forward (a range
``forward``) and its backward from a fixed output gradient (``backward``); no optimizer. The
variants, from the lab (``--impl``, default solutions): ``ep_moe`` (no overlap),
``shared_overlap`` (``ep_moe_shared_overlap``: the shared expert while the dispatch travels),
``two_batch`` (``TwoBatchMoE``, ``two_batch_schedule``'s order: one micro-batch computes while
the other's tokens travel; DeepSeek-V3, arXiv 2412.19437, section 3.2), ``two_batch_deferred``
(the same, the experts' weight gradients deferred), ``deferred_wgrad``
(``ep_moe_deferred_wgrad``: the weight gradients while the dispatch's backward travels; Megatron's
``delay_wgrad_compute``) and ``no_comm``: ``ep_moe`` with the link set to None (the rows still
cross loopback gloo, at about the cost of a copy): the optimum each step is divided by. A
warm-up step per variant without link; then per ``--link`` the ranks recalibrate it and run
``--repeats`` profiled steps, the variants taking turns. ``--link PRESET`` puts every rank on
one node; ``PRESET:Nnodes`` spreads them over N nodes joined by the preset's network
(``workbook.link.topology``: one network card per rank, dgx-h100's 50 GB/s per GPU against its
900 GB/s NVLink). Medians over the repeats per rank, then one row over the ranks:

* ``step_ms`` the slowest rank's wall time; ``over_no_comm`` = step / no_comm's step;
  ``exposed_over_no_comm`` = 1 + exposed / no_comm's step: the step's ratio if the variant
  computed exactly as fast as no_comm, what remains when load slows one variant's compute more
  than another's (every step's compute shares the two cores with whatever else runs);
* per pass (``fwd_`` / ``bwd_``): ``a2a_ms`` the busiest rank's modelled all-to-all time issued
  in the pass (tokens and the count exchanges), ``counts_ms`` the count exchanges' share of it,
  ``exposed_ms`` the busiest rank's all-to-all time no compute ran beside, rank skew excused
  (``trace.overlap``), ``hidden_pct`` the job's hidden share (the ranks' all-to-all and exposed
  times added up); ``exposed_ms`` the two passes' sum;
* ``loss`` the sum over the ranks of ``sum(y * g)``, ``a2a_bytes`` the bytes the busiest rank
  sent to other ranks (its own rows stay home), ``a2a_count`` its all-to-alls.

Times on the SIMULATED link (``workbook.link``): a CPU in slow motion, calibrated to the
preset's compute / link ratio, labelled so. Targets (issue 31; figures, never tests): on
dgx-h100 with 2 ranks, two micro-batches hide >= 70% of the forward's and >= 60% of the
backward's all-to-all time, and their step is at most 1.15 x the no-communication optimum;
across 2 nodes, the figure and why it falls (docs/bench-ep-overlap.md).

    workbook bench ep_overlap --json ep_overlap.json --figure ep_overlap.html
    python -m workbook.expert_parallel.ep_overlap_bench --repeats 3 --link dgx-h100
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from workbook.expert_parallel.ep_overlap_figures import FIELDS, PASSES, combine  # noqa: F401
from workbook.measure.bench_cli import UsageError, listed, measure_and_save, run_as_command

#: variant -> the lab's layer it runs
CALL = {"ep_moe": "ep_moe", "shared_overlap": "ep_moe_shared_overlap",
        "two_batch": "TwoBatchMoE", "two_batch_deferred": "TwoBatchMoE(deferred_wgrad=True)",
        "deferred_wgrad": "ep_moe_deferred_wgrad", "no_comm": "ep_moe, no link"}
VARIANTS = tuple(CALL)
LINKS = ("dgx-h100", "dgx-h100:2nodes")
# 2 experts of 2048 on each of 2 ranks, k = 2: the experts' forward of one micro-batch (about
# 2 GFLOP) lasts about one token exchange on dgx-h100, whose 2 us latency is ~30 ms in slow motion
DEFAULTS = dict(tokens=512, hidden=512, experts=4, top_k=2, expert_hidden=2048,
                shared_hidden=2048)
QUICK = dict(tokens=16, hidden=32, experts=4, top_k=2, expert_hidden=32, shared_hidden=32)
PREFIX = "workbook bench ep_overlap: "


def add_arguments(parser) -> None:
    parser.add_argument("--nproc", type=int, default=2, help="ranks, 2 to 4 (default 2)")
    parser.add_argument("--link", dest="links", nargs="+", default=list(LINKS), metavar="LINK",
                        help="simulated links, a table each: PRESET (one node) or PRESET:Nnodes "
                             "(the ranks over N nodes; default: %(default)s)")
    parser.add_argument("--impl", default="solutions", help="labs, solutions or a folder")
    for name, value in DEFAULTS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, default=value,
                            help=f"default {value}" + (" (per rank)" if name == "tokens" else ""))
    parser.add_argument("--capacity-factor", type=float, default=None,
                        help="each expert keeps at most ceil(c k T / E) tokens of a group, the "
                             "rest dropped (default: no limit; the two micro-batches are a "
                             "group each, so their loss differs)")
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny shapes, for a smoke test: {QUICK}")
    parser.add_argument("--repeats", type=int, default=2,
                        help="measured steps a variant and link (median; default 2)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps a variant")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="subset of %(default)s")
    parser.add_argument("--trace-dir", default=None, help="keep the traces here")
    for name, what in (("json", "the results as JSON"), ("figure", "the figure (plotly HTML)")):
        parser.add_argument(f"--{name}", default=None, metavar="PATH", help=f"write {what}")


def load_ep_lab(impl: str | None = "solutions"):
    """Lab ``ep_overlap`` from ``impl`` (labs, solutions or a folder)."""
    from workbook.grading.labs import load_lab
    return load_lab("ep_overlap", impl)


def parse_link(spec: str) -> tuple[str, int]:
    """``"dgx-h100"`` -> ``("dgx-h100", 1)``; ``"dgx-h100:2nodes"`` -> ``("dgx-h100", 2)``."""
    preset, _, nodes = spec.partition(":")
    if not nodes:
        return preset, 1
    if not nodes.endswith("nodes") or not nodes[:-5].isdigit():
        raise ValueError(f"--link {spec!r}: write PRESET or PRESET:Nnodes (dgx-h100:2nodes)")
    return preset, int(nodes[:-5])


def layer_config(o: dict):
    """``(ModelConfig, MoEConfig)`` of the benchmark's layer: GPT, fp32, no capacity limit."""
    from workbook.model import ModelConfig, MoEConfig
    cfg = ModelConfig(style="gpt", dtype="float32", hidden=o["hidden"], heads=1,
                      ffn_hidden=o["shared_hidden"])                 # the shared expert's width
    return cfg, MoEConfig(num_experts=o["experts"], top_k=o["top_k"], shared_expert=True,
                          expert_hidden=o["expert_hidden"],
                          capacity_factor=o.get("capacity_factor"))


def layer_fn(lab, variant: str, layer):
    """The variant's layer as a function of this rank's tokens."""
    if variant in ("ep_moe", "no_comm"):
        return lambda x: lab.ep_moe(layer, x)
    if variant == "shared_overlap":
        return lambda x: lab.ep_moe_shared_overlap(layer, x)
    if variant == "deferred_wgrad":
        return lambda x: lab.ep_moe_deferred_wgrad(layer, x)
    return lab.TwoBatchMoE(layer, None, deferred_wgrad=variant == "two_batch_deferred")


# --------------------------------------------------------------------------- inside a rank
def step_figures(t, ops, elapsed_ms: float, mid_ns: int, loss: float, counts_bytes: int,
                 rank: int) -> dict:
    """One profiled step's ``FIELDS`` on this rank (module docstring) from its trace ``t`` and
    the link ops it issued (``mid_ns``: when the backward began, on the ops' clock)."""
    from workbook import trace
    a2a = [r for r in ops if r.op == "all_to_all"]
    sent = sum(sum(b for d, b in enumerate(r.split_bytes[rank]) if d != rank)
               for r in a2a if r.split_bytes)                          # to other ranks only
    out = {"step_ms": elapsed_ms, "loss": loss, "a2a_bytes": sent,
           "a2a_count": len(a2a), "exposed_ms": 0.0}
    for p, phase in zip(PASSES, ("forward", "backward")):
        mine = [r for r in a2a if (r.issued_ns < mid_ns) == (p == "fwd")]
        o = trace.overlap(t, within=phase) if a2a else None
        out.update({f"{p}_a2a_ms": sum(r.link_ns for r in mine) / 1e6,
                    f"{p}_counts_ms": sum(r.link_ns for r in mine if r.size_bytes == counts_bytes
                                          and r.recv_bytes == counts_bytes) / 1e6,
                    f"{p}_comm_ms": o.comm_us / 1e3 if o else None,
                    f"{p}_exposed_ms": (o.exposed_comm_us - o.skew_us) / 1e3 if o else None,
                    f"{p}_skew_ms": o.skew_us / 1e3 if o else None})
        out["exposed_ms"] = None if o is None else out["exposed_ms"] + out[f"{p}_exposed_ms"]
    return out


def _rank_bench(o: dict, root: str) -> dict:
    """On every rank: the variants of ``o["run"]`` on each of ``o["links"]`` (module
    docstring); per link and variant, the medians of ``step_figures`` over the repeats. ``o``
    holds ``DEFAULTS``' keys, ``impl``, ``run`` (variant names; ``combine`` and the ratios want
    ``no_comm`` among them), ``links`` (``PRESET`` or ``PRESET:Nnodes``), ``repeats`` and
    ``warmup``; the traces go under ``root`` (a folder per link, variant and step)."""
    import torch
    import torch.distributed as dist

    from workbook import link
    from workbook.expert_parallel import local_moe, rank_rows
    from workbook.measure.calibration import recalibrate
    from workbook.measure.profiled_step import profiled_step
    from workbook.trace.capture import hardware
    lab, rank, p = load_ep_lab(o["impl"]), dist.get_rank(), dist.get_world_size()
    cfg, moe = layer_config(o)
    layer = local_moe(cfg, moe, rank, p)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(p * o["tokens"], o["hidden"], generator=gen)        # [p T, H], the batch
    g = torch.randn(p * o["tokens"], o["hidden"], generator=gen)        # the output's gradient
    rows = rank_rows(x.shape[0], rank, p)
    x, g = x[rows].contiguous(), g[rows].contiguous()                   # [T, H] this rank's
    counts_bytes = 8 * o["experts"]                                     # E int64
    mid = [0]

    def step(name):
        fn, xr = layer_fn(lab, name, layer), x.clone().requires_grad_()
        with torch.profiler.record_function("forward"):
            y = fn(xr)
        mid[0] = time.perf_counter_ns()
        with torch.profiler.record_function("backward"):
            y.backward(g)
        return float((y.detach() * g).sum())

    run = o["run"]
    link.set_link(None)
    for name in run:                                 # allocate; nothing to wait for
        for _ in range(o["warmup"]):
            step(name)
            layer.zero_grad(set_to_none=True)
    out = {"hardware": hardware(), "links": {}}
    for spec in o["links"]:
        preset, nodes = parse_link(spec)
        rate = recalibrate(preset)                   # the matmul rate now
        lk = link.make_link(preset, rate, ranks_per_node=p // nodes if nodes > 1 else 0)
        rows_of = {name: {f: [] for f in FIELDS} for name in run}
        for k in range(o["repeats"]):                # variants take turns: noise hits them alike
            for name in run:
                link.set_link(None if name == "no_comm" else lk)
                loss = []
                ms, ops, t = profiled_step(lambda: loss.append(step(name)),
                                           Path(root) / spec.replace(":", "-") / name / f"step{k}",
                                           rank, "ep_overlap")
                layer.zero_grad(set_to_none=True)
                for key, value in step_figures(t, ops, ms, mid[0], loss[0], counts_bytes,
                                                          rank).items():
                    rows_of[name][key].append(value)
        link.set_link(lk)
        out["links"][spec] = {
            "preset": preset, "nodes": nodes, "link_label": lk.label, "link": lk.describe(),
            "variants": {name: {f: statistics.median(x) if None not in x else None
                                for f, x in r.items()} for name, r in rows_of.items()}}
    link.set_link(None)
    return out


def _check(o: dict, nproc: int, links: list, variants: list, repeats: int, warmup: int,
           unknown_options, capacity_factor=None) -> None:
    from workbook.link.presets import PRESETS
    unknown = sorted(set(variants) - set(VARIANTS))
    bad_links = []
    for spec in links:
        try:
            preset, nodes = parse_link(spec)
        except ValueError as err:
            bad_links.append(str(err))
            continue
        if preset not in PRESETS:
            bad_links.append(f"unknown link preset {preset!r}: choose from {', '.join(PRESETS)}")
        elif nodes > 1 and PRESETS[preset].nic_GBps is None:
            bad_links.append(f"--link {spec}: {preset} is flat (no network between nodes), so "
                             f"nodes change nothing; use {preset} alone")
        elif nodes > 1 and (nodes > nproc or nproc % nodes):
            bad_links.append(f"--link {spec}: {nproc} ranks do not split into {nodes} equal nodes")
    E, k = o["experts"], o["top_k"]
    problems = [msg for bad, msg in (
        (unknown_options, f"unknown option(s) {sorted(unknown_options)}"),
        (unknown, f"unknown variant(s) {unknown}: choose from {', '.join(VARIANTS)}"),
        (not variants, "name at least one variant"),
        (bad_links, "; ".join(bad_links)),
        (not links, "name at least one --link"),
        (not 2 <= nproc <= 4, f"--nproc {nproc}: 2 to 4 ranks"),
        (min(o.values()) < 1, "--tokens, --hidden, --experts, --top-k, --expert-hidden and "
                              "--shared-hidden must be at least 1"),
        (E >= 1 and E % nproc, f"--experts {E} is not divisible by --nproc {nproc}: choose a "
                               f"multiple of {nproc}"),
        (k > E, f"--top-k {k} is larger than --experts {E}: a token cannot choose more experts "
                f"than there are"),
        (o["tokens"] % 2, f"--tokens {o['tokens']} must be even (two micro-batches per rank)"),
        (repeats < 1 or warmup < 0, "--repeats must be at least 1 and --warmup at least 0"),
        (capacity_factor is not None and not capacity_factor > 0,
         f"--capacity-factor {capacity_factor}: must be a number > 0 (leave it out for no "
         f"capacity limit)"),
    ) if bad]
    if problems:
        raise UsageError(PREFIX + "; ".join(problems))


def measure(*, impl: str = "solutions", nproc: int = 2, links=LINKS, variants=None,
            repeats: int = 2, warmup: int = 1, trace_dir=None, pool: bool = False,
            quick: bool = False, capacity_factor: float | None = None, **shape) -> dict:
    """Run the benchmark on ``nproc`` fresh ranks (``pool``: the package's warm ones, for its
    tests); return what ``--json`` writes (module docstring). ``shape``: any of ``DEFAULTS``
    (``quick``: ``QUICK`` under them); a bad option raises ``UsageError`` (a ``SystemExit``,
    status 2, one line)."""
    import torch

    from workbook.expert_parallel.ep_overlap_figures import targets
    from workbook.runtime import launch
    variants, links = list(VARIANTS if variants is None else variants), list(links)
    o = dict(QUICK if quick else DEFAULTS)
    unknown_options = set(shape) - set(o)
    o.update({k: v for k, v in shape.items() if k in o})
    _check(o, nproc, links, variants, repeats, warmup, unknown_options, capacity_factor)
    run = [*variants, *(["no_comm"] if "no_comm" not in variants else [])]   # the optimum's
    o.update(impl=impl, repeats=repeats, warmup=warmup, links=links, variants=variants, run=run,
             capacity_factor=capacity_factor)
    try:                                             # before any rank starts
        load_ep_lab(impl)
    except (FileNotFoundError, ValueError, ImportError) as err:   # ImportError: it does not import
        raise UsageError(PREFIX + " ".join(str(err).split())) from None
    with tempfile.TemporaryDirectory(prefix="ep-overlap-bench-") as tmp:
        results = launch.run(_rank_bench, nproc, o, str(trace_dir or tmp), timeout=3600,
                             link=parse_link(links[0])[0], pool=pool)
    out = {}
    for spec in links:
        per = [r["links"][spec] for r in results]
        rows = {name: combine([q["variants"][name] for q in per]) for name in run}
        opt = rows["no_comm"]["step_ms"]
        for row in rows.values():
            row["over_no_comm"] = row["step_ms"] / opt
            row["exposed_over_no_comm"] = 1 + (row["exposed_ms"] or 0.0) / opt
        out[spec] = {"preset": per[0]["preset"], "nodes": per[0]["nodes"],
                     "link_label": per[0]["link_label"], "link": per[0]["link"],
                     "no_comm_step_ms": rows["no_comm"]["step_ms"],
                     "variants": {name: rows[name] for name in variants}}
        out[spec]["targets"] = targets(spec, out[spec], nproc)
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {"nproc": nproc, "cores": cores, "oversubscribed": nproc > cores, "load_avg": load,
            "options": o, "links": out, "hardware": results[0]["hardware"],
            "torch": torch.__version__}


def report(result: dict) -> str:
    from workbook.expert_parallel.ep_overlap_figures import bench_table
    return bench_table(result)


def figure(result: dict):
    from workbook.expert_parallel.ep_overlap_figures import bench_figure
    return bench_figure(result)


def run_bench(args) -> dict:
    return measure_and_save(args, measure, report, figure, links=args.links,
                            variants=listed(args.variants), repeats=args.repeats,
                            warmup=args.warmup, quick=args.quick,
                            capacity_factor=args.capacity_factor,
                            **{k: getattr(args, k) for k in DEFAULTS
                               if not args.quick or getattr(args, k) != DEFAULTS[k]})


def main(argv=None) -> None:
    run_as_command(add_arguments, run_bench, "MoE expert parallelism on the simulated link: "
                   "the all-to-all hidden behind the shared expert, a second micro-batch and "
                   "deferred weight gradients, vs no communication",
                   argv, prog="workbook bench ep_overlap")


if __name__ == "__main__":
    main()
