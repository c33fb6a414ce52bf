"""``workbook bench pp_schedules``: how much bubble and point-to-point time each pipeline schedule
of lab ``pp_schedules`` leaves, measured on ranks, beside its formula and ``simulate_chunked``.

Public functions (the report and lesson 12 import them):

* ``measure(**options) -> dict`` runs the benchmark on fresh ranks (what ``--json`` writes);
  ``report(result) -> str`` the table and ``figure(result)`` the plotly figure;
  ``run_bench(args)`` all three for the command line; ``add_arguments(parser)`` its options;
  ``load_schedules_lab(impl)`` the lab under test;
* ``step_figures(t, ops, elapsed_ms, actions, comm=True) -> dict``: one profiled step on one
  rank, from its trace and its link ops; ``combine(ranks) -> dict``: the ranks as one row.

The paper side (``simulate_chunked`` and the formulas with the measured costs), the targets, the
table and the figure are in ``pp_schedules_figures``.

What runs. Rank r holds ``v`` chunks of a GPT model (``--hidden``, ``--layers`` blocks cut into
``p * v`` stages, ``--seq`` tokens, ``--rows`` rows a micro-batch, fp32); the batch is cut into
``--micro-batches`` m. The lab's ``OverlappedChunkedExecutor`` (``--impl``, default solutions:
each receive posted an action early, sends waited for at the end) runs one training step
(forward and backward, no optimizer) per variant: ``1f1b`` (``interleaved_1f1b`` with v = 1,
lab 10's 1F1B), ``interleaved_v2`` and ``interleaved_v4`` (Narayanan et al. 2021, arXiv
2104.04473), ``zb_h1`` and ``zbv`` (Qi et al. 2023, arXiv 2401.10241: the backward split into
B and W), and ``no_comm``: ZBV with the link set to None (the tensors still cross loopback gloo,
at about the cost of a copy), the schedule with the least bubble on paper and no link time: the
no-communication optimum every step is divided by. Every variant runs the same model, so a
chunk of v = 4 holds a quarter of what a v = 1 stage holds. A warm-up step per variant without
link; then per ``--link`` preset the ranks recalibrate it and run ``--repeats`` profiled steps,
the variants taking turns. Medians over the repeats per rank, then one row over the ranks:

* ``step_ms`` the slowest rank's wall time; ``over_no_comm`` = step / no_comm's step;
* ``link_ms`` the busiest rank's modelled p2p time (its sends' and receives' ``link_ns``);
  ``exposed_ms`` its link time no compute ran beside, rank skew excused (``trace.overlap``);
* ``hidden_pct``: of the steady state's p2p link time (the ``steady`` ranges: after a rank's
  first B, up to its last F), skew excused, the ranks' link and exposed times added up;
* ``bubble``: ``1 - sum_r compute_r / (p * step)`` (``Timeline.bubble``'s definition), compute
  the union of the rank's compute spans in its trace; ``rank_bubbles`` per rank;
* ``t_f_ms`` / ``t_b_ms`` / ``t_w_ms``: one chunk action's compute (inside its ``F3.c1``
  range), the mean over ranks, chunks and micro-batches; an unsplit schedule's B holds its W;
* ``formula``: the schedule's bubble from its formula (``pp_schedules_lesson.formula_bubble``)
  with these costs: ``(p - 1) / (v m + p - 1)`` for 1F1B and interleaved whatever the costs;
  ``textbook``: the same with equal costs; ``paper``: ``simulate_chunked`` with these costs and
  the link's time for one activation (sends that never block, receives posted early: this
  executor), its bubble, step and hidden share (``paper_hidden``); ``paper_bare_ms`` its step
  with no transfer time (ZBV's target on paper: ``paper`` step / ``paper_bare_ms``);
* ``link`` (per preset): the calibrated ``Link``'s fields (``Link(**link)`` rebuilds it: what
  lesson 12's prediction and ``pp_schedules_report`` hand to ``predict_step_ms``);
* ``peak_in_flight``: per rank the most chunk-activations alive at once (+1 at F, -1 at W or an
  unsplit B), from the schedule; ``peak_stages`` the same in whole stages (/ v).

Times on the SIMULATED link (``workbook.link``): a CPU in slow motion, calibrated to the
preset's compute / link ratio, labelled so. Targets (issue 30; figures, never tests): on
dgx-h100, interleaved v = 2 hides >= 80% of its steady-state p2p and its bubble is within 10%
of (p - 1)/(v m + p - 1); ZB-H1's bubble is at most a third of 1F1B's with the same peak; ZBV's
step is at most 1.10 x the no-communication optimum.

    workbook bench pp_schedules --json pp_schedules.json --figure pp_schedules.html
    python -m workbook.pipeline_parallel.pp_schedules_bench --repeats 3
"""
from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

from workbook.measure.bench_cli import UsageError, listed, measure_and_save, run_as_command

#: variant -> (the lab's schedule, chunks per rank v)
SCHEDULE_OF = {"1f1b": ("interleaved_1f1b", 1), "interleaved_v2": ("interleaved_1f1b", 2),
               "interleaved_v4": ("interleaved_1f1b", 4), "zb_h1": ("zb_h1", 1),
               "zbv": ("zbv", 2), "no_comm": ("zbv", 2)}
VARIANTS = tuple(SCHEDULE_OF)
LINKS = ("dgx-h100", "dgx-h100-ib")
FIELDS = ("step_ms", "link_ms", "comm_ms", "exposed_ms", "skew_ms", "steady_comm_ms",
          "steady_exposed_ms", "hidden_pct", "compute_ms", "bubble", "t_f_ms", "t_b_ms", "t_w_ms")
# 8 blocks of hidden 512 over 256 tokens: a v = 2 chunk (2 blocks) forwards a micro-batch in
# about 2x one activation's transfer on dgx-h100, a v = 4 chunk in about 1x
DEFAULTS = dict(hidden=512, layers=8, seq=256, rows=1, micro_batches=8, heads=8, vocab=256)
PREFIX = "workbook bench pp_schedules: "


def add_arguments(parser) -> None:
    parser.add_argument("--nproc", type=int, default=2, help="ranks, 2 to 4 (default 2)")
    parser.add_argument("--link", dest="links", nargs="+", default=list(LINKS), metavar="PRESET",
                        help="simulated link presets, a table each (default: %(default)s)")
    parser.add_argument("--impl", default="solutions", help="labs, solutions or a folder")
    for name, value in DEFAULTS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, default=value,
                            help=f"default {value}")
    parser.add_argument("--repeats", type=int, default=3,
                        help="measured steps a variant and link (median; default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps a variant")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="subset of %(default)s")
    parser.add_argument("--trace-dir", default=None, help="keep the traces here")
    for name, what in (("json", "the results as JSON"), ("figure", "the figure (plotly HTML)")):
        parser.add_argument(f"--{name}", default=None, metavar="PATH", help=f"write {what}")


def load_schedules_lab(impl: str | None = "solutions"):
    """Lab ``pp_schedules`` from ``impl`` (labs, solutions or a folder)."""
    from workbook.grading.labs import load_lab
    return load_lab("pp_schedules", impl)


def model_config(hidden: int, layers: int, seq: int, heads: int, vocab: int):
    """The benchmark's model: GPT style, fp32, ffn 4 x hidden, no dropout."""
    from workbook.model import ModelConfig
    return ModelConfig(hidden=hidden, heads=heads, ffn_hidden=4 * hidden, n_layers=layers,
                       seq_len=seq, vocab_size=vocab, style="gpt", dtype="float32")


def variant_schedules(lab, variant: str, p: int, m: int) -> tuple[list, int, str]:
    """``(every rank's actions, v, placement)`` of ``variant``, from the lab."""
    name, v = SCHEDULE_OF[variant]
    fn, placement = lab.SCHEDULES[name]
    return [[tuple(a) for a in fn(p, v, m, r)] for r in range(p)], v, placement


# --------------------------------------------------------------------------- inside a rank
def step_figures(t, ops, elapsed_ms: float, actions, comm: bool = True) -> dict:
    """One profiled step's ``FIELDS`` on this rank (module docstring) from its trace ``t`` and
    the link ops it issued; ``actions`` its schedule. ``comm=False`` (``no_comm``): the link
    figures are None, not read from the loopback copies' gloo spans."""
    from workbook import trace
    from workbook.pipeline_parallel import ChunkAction, action_name, phases
    from workbook.trace import intervals
    from workbook.trace.analyse import all_compute, phase_ranges
    comp = all_compute(t)
    per: dict = {"F": [], "B": [], "W": []}
    acts = [ChunkAction(*a) for a in actions]
    for a in acts:
        inside = intervals.intersect(comp, phase_ranges(t, action_name(a))[0])
        per[a.kind].append(intervals.measure(inside) / 1e3)
    steady_phase = "steady" in phases([(a.kind, a.micro_batch) for a in acts])
    whole = trace.overlap(t) if comm else None
    steady = trace.overlap(t, within="steady") if comm and steady_phase else None
    compute_ms = intervals.measure(comp) / 1e3

    def ms(metrics, key, minus_skew=False):
        if metrics is None:
            return None
        return (getattr(metrics, key) - (metrics.skew_us if minus_skew else 0)) / 1e3
    return {"step_ms": elapsed_ms,
            "link_ms": sum(r.link_ns for r in ops if r.op in ("send", "recv")) / 1e6,
            "comm_ms": ms(whole, "comm_us"), "exposed_ms": ms(whole, "exposed_comm_us", True),
            "skew_ms": ms(whole, "skew_us"), "steady_comm_ms": ms(steady, "comm_us"),
            "steady_exposed_ms": ms(steady, "exposed_comm_us", True),
            "hidden_pct": steady.overlap_pct_ex_skew if steady else None,
            "compute_ms": compute_ms, "bubble": 1 - compute_ms / elapsed_ms if elapsed_ms else None,
            **{f"t_{k.lower()}_ms": statistics.fmean(x) if x else None for k, x in per.items()}}


def _rank_bench(o: dict, root: str) -> dict:
    import dataclasses

    import torch
    import torch.distributed as dist

    from workbook import link
    from workbook.measure.calibration import recalibrate
    from workbook.measure.profiled_step import profiled_step
    from workbook.model import make_batch
    from workbook.pipeline_parallel import activation_shape
    from workbook.runtime import ranks
    from workbook.trace.capture import hardware
    lab, rank, p, dev = load_schedules_lab(o["impl"]), dist.get_rank(), dist.get_world_size(), ranks.device()
    m, cfg = o["micro_batches"], model_config(o["hidden"], o["layers"], o["seq"], o["heads"], o["vocab"])
    tokens, targets = (x.to(dev) for x in make_batch(cfg, o["rows"] * m, seed=0))
    run, runners, schedules = o["run"], {}, {}
    for name in run:
        schedules[name], v, placement = variant_schedules(lab, name, p, m)
        runners[name] = lab.OverlappedChunkedExecutor(cfg, m, v, placement, dev)
    link.set_link(None)
    for name in run:                                 # allocate; nothing to wait for
        for _ in range(o["warmup"]):
            runners[name].step(tokens, targets, schedules[name])
    act_bytes = 4 * torch.Size(activation_shape(cfg, o["rows"])).numel()     # fp32 [b, S, H]
    out = {"hardware": hardware(), "links": {}}
    for preset in o["links"]:
        recalibrate(preset)                          # the matmul rate now
        lk = link.current_link()
        rows = {name: {f: [] for f in FIELDS} for name in run}
        for k in range(o["repeats"]):                # variants take turns: noise hits them alike
            for name in run:
                link.set_link(None if name == "no_comm" else lk)
                ms, ops, t = profiled_step(
                    lambda: runners[name].step(tokens, targets, schedules[name]),
                    Path(root) / preset / name / f"step{k}", rank, "pp_schedules")
                for key, value in step_figures(t, ops, ms, schedules[name][rank],
                                               name != "no_comm").items():
                    rows[name][key].append(value)
        link.set_link(lk)
        out["links"][preset] = {
            "link_label": lk.label, "activation_bytes": act_bytes, "link": dataclasses.asdict(lk),
            "t_p2p_ms": lk.op_time("send", act_bytes, p) * 1e3,
            "variants": {name: {f: statistics.median(x) if None not in x else None
                                for f, x in r.items()} for name, r in rows.items()}}
    return out


# --------------------------------------------------------------------------- the figures
def combine(ranks: list[dict]) -> dict:
    """The ranks' ``step_figures`` as one row: the slowest rank's step, the busiest rank's link
    and exposed times, the job's steady hidden share (link and exposed times added over the
    ranks), the pipeline's bubble, the mean per-action costs, and per-rank bubbles."""
    def values(key):
        return [r[key] for r in ranks if r[key] is not None]

    def most(key):
        return max(values(key)) if values(key) else None
    p, step = len(ranks), max(r["step_ms"] for r in ranks)
    comm, exposed = sum(values("steady_comm_ms")), sum(values("steady_exposed_ms"))
    return {"step_ms": step, "link_ms": most("link_ms"), "exposed_ms": most("exposed_ms"),
            "skew_ms": most("skew_ms"), "hidden_pct": 100 * (1 - exposed / comm) if comm else None,
            "bubble": 1 - sum(r["compute_ms"] for r in ranks) / (p * step),
            "rank_bubbles": [r["bubble"] for r in ranks],
            **{k: statistics.fmean(values(k)) if values(k) else None
               for k in ("t_f_ms", "t_b_ms", "t_w_ms")}}


def _check(o: dict, nproc: int, links: list, variants: list, repeats: int, warmup: int,
           unknown_options) -> None:
    from workbook.link.presets import preset_names
    from workbook.pipeline_parallel import ScheduleError, check_interleaved_shape
    unknown, bad_links = sorted(set(variants) - set(VARIANTS)), [x for x in links if x not in preset_names()]
    stages = nproc * max((SCHEDULE_OF[x][1] for x in variants if x in SCHEDULE_OF), default=1)
    megatron = None                                  # m a multiple of p, for interleaved
    if o["micro_batches"] >= 1 and any(x.startswith("interleaved") for x in variants):
        try:
            check_interleaved_shape(nproc, 2, o["micro_batches"])
        except ScheduleError as err:
            megatron = str(err)
    problems = [msg for bad, msg in (
        (unknown_options, f"unknown option(s) {sorted(unknown_options)}"),
        (unknown, f"unknown variant(s) {unknown}: choose from {', '.join(VARIANTS)}"),
        (not variants, "name at least one variant"),
        (bad_links or "none" in links, f"unknown link preset(s) {bad_links or ['none']}: choose "
                                       f"from {', '.join(x for x in preset_names() if x != 'none')}"),
        (not links, "name at least one --link preset"),
        (not 2 <= nproc <= 4, f"--nproc {nproc}: 2 to 4 ranks"),
        (o["layers"] < stages, f"--layers {o['layers']} cannot fill {stages} stages ({nproc} "
                               f"ranks x the most chunks a variant holds): at least one block a stage"),
        (o["micro_batches"] < 1, f"--micro-batches {o['micro_batches']} must be at least 1"),
        (megatron, megatron),
        (min(o["hidden"], o["seq"], o["rows"], o["heads"], o["vocab"]) < 1,
         "--hidden, --seq, --rows, --heads and --vocab must be at least 1"),
        (o["heads"] >= 1 and o["hidden"] % o["heads"], f"--heads {o['heads']} must divide --hidden "
                                                       f"{o['hidden']}"),
        (repeats < 1 or warmup < 0, "--repeats must be at least 1 and --warmup at least 0"),
    ) if bad]
    if problems:
        raise UsageError(PREFIX + "; ".join(problems))


def options(*, impl: str = "solutions", nproc: int = 2, links=LINKS, variants=None,
            repeats: int = 3, warmup: int = 1, **shape) -> dict:
    """The options the ranks run (``_rank_bench``'s ``o``: ``DEFAULTS`` with ``shape``, the
    variants and the optimum's ``no_comm`` to ``run``), checked: a bad option raises
    ``UsageError`` (a ``SystemExit``, status 2, one line), before any rank starts."""
    variants, links, o = list(VARIANTS if variants is None else variants), list(links), dict(DEFAULTS)
    unknown_options = set(shape) - set(o)
    o.update({k: v for k, v in shape.items() if k in o})
    _check(o, nproc, links, variants, repeats, warmup, unknown_options)
    run = [*variants, *(["no_comm"] if "no_comm" not in variants else [])]   # the optimum's
    o.update(impl=impl, repeats=repeats, warmup=warmup, links=links, variants=variants, run=run)
    try:                                             # before any rank starts
        load_schedules_lab(impl)
    except (FileNotFoundError, ValueError) as err:
        raise UsageError(PREFIX + str(err)) from None
    return o


def measure(*, nproc: int = 2, trace_dir=None, pool: bool = False, **kwargs) -> dict:
    """Run the benchmark on ``nproc`` fresh ranks (``pool``: the package's warm ones, for its
    tests); return what ``--json`` writes (module docstring). ``kwargs``: ``options``' (``impl``,
    ``links``, ``variants``, ``repeats``, ``warmup``, any of ``DEFAULTS``)."""
    from workbook.runtime import launch
    o = options(nproc=nproc, **kwargs)
    with tempfile.TemporaryDirectory(prefix="pp-schedules-bench-") as tmp:
        results = launch.run(_rank_bench, nproc, o, str(trace_dir or tmp), timeout=3600,
                             link=o["links"][0], pool=pool)
    return summarize(results, o)


def summarize(results: list[dict], o: dict) -> dict:
    """What ``--json`` writes, from every rank's ``_rank_bench(o, ...)`` (or a result that holds
    it, as ``pp_schedules_report.run``'s does): per link the variants' rows (``combine``) with
    their paper side and the targets, the options, the schedules played."""
    import torch

    from workbook.pipeline_parallel.pp_schedules_figures import paper_rows, targets
    lab, nproc, m, run = load_schedules_lab(o["impl"]), len(results), o["micro_batches"], o["run"]
    schedules = {name: variant_schedules(lab, name, nproc, m) for name in run}
    out = {}
    for preset in o["links"]:
        per = [r["links"][preset] for r in results]
        rows = {name: combine([q["variants"][name] for q in per]) for name in run}
        paper_rows(rows, schedules, nproc, m, per[0]["t_p2p_ms"])
        mine = {name: rows[name] for name in o["variants"]}
        out[preset] = {"link_label": per[0]["link_label"], "link": per[0]["link"],
                       "activation_bytes": per[0]["activation_bytes"],
                       "t_p2p_ms": per[0]["t_p2p_ms"], "no_comm_step_ms": rows["no_comm"]["step_ms"],
                       "variants": mine, "targets": targets(mine)}
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {"nproc": nproc, "cores": cores, "oversubscribed": nproc > cores, "load_avg": load,
            "options": o, "links": out, "hardware": results[0]["hardware"],
            "torch": torch.__version__,
            "schedules": {name: s[0] for name, s in schedules.items()}}


def report(result: dict) -> str:
    from workbook.pipeline_parallel.pp_schedules_figures import bench_table
    return bench_table(result)


def figure(result: dict):
    from workbook.pipeline_parallel.pp_schedules_figures import bench_figure
    return bench_figure(result)


def run_bench(args) -> dict:
    return measure_and_save(args, measure, report, figure, links=args.links,
                            variants=listed(args.variants), repeats=args.repeats,
                            warmup=args.warmup, **{k: getattr(args, k) for k in DEFAULTS})


def main(argv=None) -> None:
    run_as_command(add_arguments, run_bench, "pipeline schedules (1F1B, interleaved, ZB-H1, ZBV) "
                   "on the simulated link: bubble and p2p, measured vs formula vs simulate_chunked",
                   argv, prog="workbook bench pp_schedules")


if __name__ == "__main__":
    main()
