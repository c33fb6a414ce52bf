"""``workbook bench pp_overlap``: pipeline parallelism's point-to-point traffic, blocking and
hidden, against the no-communication optimum, each figure beside the textbook bubble and what
``workbook.pipeline_parallel.simulate`` predicts.

Public functions (lesson 10 and ``workbook.pipeline_parallel.pp_overlap_report`` import them):

* ``measure(**options) -> dict`` runs the benchmark on fresh ranks (what ``--json`` writes);
  ``report(result) -> str`` the table; ``figure(result)`` the plotly figure;
  ``run_bench(args)`` all three for the command line; ``add_arguments(parser)`` its options;
* ``model_config(hidden, layers, seq, heads=None, vocab=256)`` the benchmark's model;
* ``make_runner(lab, variant, cfg, m, device)`` / ``stage_actions(lab, variant, p, m, stage)`` /
  ``all_schedules(lab, variant, p, m)``: a variant's executor and schedule, from the lab;
* ``step_figures(t, ops, elapsed_ms, actions, comm=True) -> dict``: one profiled step's
  ``FIELDS`` on one rank, from its trace and its link ops (``comm=False``: no_comm's step);
* ``combine(stages) -> dict``: the ranks' figures as one row of the table;
* ``predict(schedules, t_fwd, t_bwd, t_p2p) -> dict``: ``simulate``'s step, bubble, link time
  and steady-state hidden share for per-micro-batch times (any unit; ms here);
* ``p2p_hidden(schedules, line, t_p2p, phase="steady")``: on a simulated ``Timeline``, the share
  of the transfers issued in ``phase`` that fall under their stage's compute;
* ``hidden_ceiling(schedules, t_fwd, t_bwd, t_p2p) -> dict``: the most non-interleaved 1F1B
  can hide, two ways (below).

What runs. Rank s holds stage s of a GPT model (``--hidden``, ``--layers`` split over
``--nproc`` stages, ``--seq`` tokens, ``--rows`` rows a micro-batch, fp32); the batch is cut
into ``--micro-batches`` m. The lab's executors (``--impl``, default solutions) run one
training step (forward and backward, no optimizer) per variant: ``gpipe`` (GPipe schedule,
``BlockingExecutor``), ``1f1b`` (1F1B, ``BlockingExecutor``: a send and the next receive
posted together, then both waited for), ``1f1b_overlap`` (1F1B, ``OverlappedExecutor``:
receives posted an action ahead, sends in flight until ``finish()``) and ``no_comm`` (1F1B,
``OverlappedExecutor``, the link set to None: the tensors still cross loopback gloo, at about
the cost of a copy: the compute-only step). A warm-up step per variant without link; then per
``--link`` preset the ranks recalibrate it (``domino_measure.recalibrate``) and run
``--repeats`` profiled steps, the variants taking turns. Medians over the repeats per rank, then
one row over the ranks (``combine``):

* ``step_ms`` the slowest stage's wall time of a step; ``link_ms`` the modelled p2p time of the
  busiest stage (sum of its sends' and receives' ``link_ns`` from ``link.op_log()``);
* ``comm_ms`` / ``steady_comm_ms`` the link time on the stage's trace (the union of its link
  spans: a send and a receive travelling at once, on the full-duplex link, count once), over
  the step / issued in the steady state;
* ``exposed_ms`` the busiest stage's link time no compute ran beside, rank skew excused
  (``trace.overlap(t)``: ``exposed - skew``); ``skew_ms`` the excused part;
* ``hidden_pct`` of the steady state's p2p link time, skew excused (``trace.overlap(t,
  within="steady")``; the stages' link and exposed times added up, as the grader's
  ``_overlap`` does); ``step_hidden_pct`` the same over the whole step; GPipe has no steady
  state (every forward, then every backward), so only the latter;
* ``bubble`` the pipeline's idle share, ``1 - sum_s compute_s / (p * step)`` (``Timeline.bubble``'s
  definition), compute = the union of the stage's compute spans in its trace; ``stage_bubbles``
  ``1 - compute_s / step_s`` per stage;
* ``fwd_ms`` / ``bwd_ms`` per stage: the compute inside the ``F3`` / ``B3`` action ranges of the
  trace (``StageExecutor`` names them), the mean over the m micro-batches.

The prediction. ``t_fwd`` and ``t_bwd`` are ``no_comm``'s ``fwd_ms`` and ``bwd_ms`` (mean over
the stages: ``simulate`` takes one time per kind); ``t_p2p`` is the link's modelled time of one
activation ``[rows, seq, hidden]`` (``Link.op_time("send", ...)``). ``predict`` plays the lab's
schedules with them: ``simulate`` assumes sends never block and every receive is posted before
its data arrives, i.e. the overlapped executor; for ``gpipe`` and ``1f1b`` (blocking) it is
what the same schedule would take with overlapped p2p, and the gap to the measured figure is
what blocking costs. ``textbook_bubble`` is ``(p - 1) / (m + p - 1)`` (no transfer time).

The ceiling. Non-interleaved 1F1B cannot hide all its steady-state p2p: its steady state
waits for the transfers on its critical path (one per micro-batch on 2 stages, 2(p - 1)/p on p;
the gradient that the next backward needs is made by the neighbour's backward just before). ``hidden_ceiling`` gives, from ``simulate`` with the
measured times, ``steady_pct``: the share of the steady state's transfers (a send and its
receive each count, on their stage, placed at ``[end of the producing action, + t_p2p]`` as the
link places them) that fall under the stage's own compute (``p2p_hidden``; the figure printed);
and ``step_pct``: ``1 - (step(t_p2p) - step(0)) / (p2p time of the busiest stage)``, the share of
a stage's link time that does not lengthen the step. Both come out near 50% for 2 stages.

Targets (benchmark figures, not tests): 1F1B with overlapped p2p has a bubble within 10% of the
textbook one (``|bubble - textbook| <= 0.1 * textbook``), and hides at least 80% of its
steady-state p2p time (printed with the ceiling above). Times are on the SIMULATED link
(``workbook.link``): a CPU in slow motion, labelled so. With more stages than CPU cores
(``--nproc 4`` on 2 cores) the ranks share cores: the output says so.

    workbook bench pp_overlap --json pp_overlap.json --figure pp_overlap.html
"""
from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

import torch

from workbook.measure.bench_cli import UsageError, listed, measure_and_save

VARIANTS = ("gpipe", "1f1b", "1f1b_overlap", "no_comm")
SCHEDULE_OF = {"gpipe": ("gpipe", "blocking"), "1f1b": ("1f1b", "blocking"),
               "1f1b_overlap": ("1f1b", "overlapped"), "no_comm": ("1f1b", "overlapped")}
LINKS = ("dgx-h100", "dgx-h100-ib")
FIELDS = ("step_ms", "link_ms", "comm_ms", "exposed_ms", "skew_ms", "steady_comm_ms",
          "steady_exposed_ms", "hidden_pct", "step_hidden_pct", "compute_ms", "bubble", "fwd_ms", "bwd_ms")
# A micro-batch's forward on one stage (2 blocks of hidden 512 over 256 tokens) takes about
# 2x one activation's transfer on dgx-h100 (~0.5 MiB: mostly the preset's latency, scaled up
# by the slow-motion factor); on dgx-h100-ib about 1x.
DEFAULTS = dict(hidden=512, layers=4, seq=256, rows=1, micro_batches=8, heads=8, vocab=256)
TARGET_BUBBLE_REL = 0.10          # within 10% of the textbook bubble
TARGET_HIDDEN_PCT = 80.0          # of the steady state's p2p link time
PREFIX = "workbook bench pp_overlap: "


def add_arguments(parser) -> None:
    parser.add_argument("--nproc", type=int, default=2, help="pipeline stages, 2 to 4 (default 2)")
    parser.add_argument("--link", dest="links", nargs="+", default=list(LINKS), metavar="PRESET",
                        help="simulated link presets, a table each (default: %(default)s)")
    parser.add_argument("--impl", default="solutions", help="labs, solutions or a folder")
    for name, value in DEFAULTS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, default=value,
                            help=f"default {value}")
    parser.add_argument("--repeats", type=int, default=3, help="measured steps a variant and link "
                                                                "(median; default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps a variant")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="subset of %(default)s")
    parser.add_argument("--trace-dir", default=None, help="keep the traces here")
    for name, what in (("json", "the results as JSON"), ("figure", "the figure (plotly HTML)")):
        parser.add_argument(f"--{name}", default=None, metavar="PATH", help=f"write {what}")


def model_config(hidden: int, layers: int, seq: int, heads: int | None = None, vocab: int = 256):
    """The benchmark's model: GPT style, fp32, ffn 4 x hidden, no dropout."""
    from workbook.model import ModelConfig
    heads = heads or DEFAULTS["heads"]
    return ModelConfig(hidden=hidden, heads=heads, ffn_hidden=4 * hidden, n_layers=layers,
                       seq_len=seq, vocab_size=vocab, style="gpt", dtype="float32")


def make_runner(lab, variant: str, cfg, m: int, device=None):
    """The lab's executor for ``variant`` (``no_comm``: the overlapped one; the caller sets the
    link to None around its steps)."""
    return lab.EXECUTORS[SCHEDULE_OF[variant][1]](cfg, m, device)


def stage_actions(lab, variant: str, p: int, m: int, stage: int) -> list[tuple]:
    """Stage ``stage``'s actions under ``variant``'s schedule, from the lab."""
    return [tuple(a) for a in lab.SCHEDULES[SCHEDULE_OF[variant][0]](p, m, stage)]


def all_schedules(lab, variant: str, p: int, m: int) -> list[list[tuple]]:
    """Every stage's actions: what ``simulate`` plays."""
    return [stage_actions(lab, variant, p, m, s) for s in range(p)]


# --------------------------------------------------------------------------- the prediction
def _transfers(schedules, line, s: int) -> list[float]:
    """The start of each transfer stage ``s`` takes part in on ``line``: its sends (at the end
    of its own action) and its receives (at the end of the neighbour's producing action)."""
    from workbook.pipeline_parallel import F
    p, out = len(schedules), []
    ends = [{name: e for _, e, name in spans} for spans in line.spans]
    for kind, i in schedules[s]:
        name = f"{kind}{i}"
        dst, src = (s + 1, s - 1) if kind == F else (s - 1, s + 1)
        if 0 <= dst < p:
            out.append(ends[s][name])
        if 0 <= src < p:
            out.append(ends[src][name])
    return out


def p2p_hidden(schedules, line, t_p2p: float, phase: str | None = "steady") -> tuple:
    """``(hidden share 0..1 or None, link time)`` of the transfers that start inside stage s's
    ``phase`` window (from the end of the action before its first ``phase`` action to the end
    of its last one, as the executor's ``record_function`` ranges hold the waits; None: the whole
    step), each ``[start, start + t_p2p]`` measured against stage s's compute spans."""
    from workbook.pipeline_parallel import phases
    total = hidden = 0.0
    for s, acts in enumerate(schedules):
        spans = line.spans[s]
        idx = [k for k, ph in enumerate(phases(acts)) if phase is None or ph == phase]
        if not idx or t_p2p <= 0:
            continue
        lo = spans[idx[0] - 1][1] if idx[0] > 0 else -1.0
        hi = spans[idx[-1]][1]
        for t0 in _transfers(schedules, line, s):
            if lo < t0 <= hi:
                total += t_p2p
                hidden += sum(max(0.0, min(t0 + t_p2p, e) - max(t0, b)) for b, e, _ in spans)
    return (hidden / total if total else None), total


def hidden_ceiling(schedules, t_fwd: float, t_bwd: float, t_p2p: float) -> dict:
    """What ``simulate`` says the schedule can hide at best, in % (module docstring):
    ``steady_pct`` (steady-state transfers under their stage's compute) and ``step_pct``
    (``1 - (step(t_p2p) - step(0)) / busiest stage's p2p time``)."""
    from workbook.pipeline_parallel import simulate
    if t_p2p <= 0:
        return {"steady_pct": None, "step_pct": None}
    line, bare = simulate(schedules, t_fwd, t_bwd, t_p2p), simulate(schedules, t_fwd, t_bwd, 0.0)
    steady, _ = p2p_hidden(schedules, line, t_p2p)
    per_stage = max(len(_transfers(schedules, line, s)) for s in range(len(schedules))) * t_p2p
    return {"steady_pct": None if steady is None else 100 * steady,
            "step_pct": 100 * (1 - (line.step - bare.step) / per_stage) if per_stage else None}


def predict(schedules, t_fwd: float, t_bwd: float, t_p2p: float) -> dict:
    """``simulate``'s figures for ``schedules`` (one list of actions per stage) with these
    per-micro-batch times (ms in, ms out): ``step_ms``, ``bubble``, ``link_ms`` (the busiest
    stage's), ``hidden_pct`` (steady state; None without one) and ``step_hidden_pct``."""
    from workbook.pipeline_parallel import simulate
    line = simulate(schedules, t_fwd, t_bwd, t_p2p)
    steady, _ = p2p_hidden(schedules, line, t_p2p)
    whole, _ = p2p_hidden(schedules, line, t_p2p, phase=None)
    return {"step_ms": line.step, "bubble": line.bubble,
            "link_ms": max(len(_transfers(schedules, line, s)) for s in range(len(schedules))) * t_p2p,
            "hidden_pct": None if steady is None else 100 * steady,
            "step_hidden_pct": None if whole is None else 100 * whole}


# --------------------------------------------------------------------------- inside a rank
def step_figures(t, ops, elapsed_ms: float, actions, comm: bool = True) -> dict:
    """One profiled step's ``FIELDS`` on this rank (module docstring), from its trace ``t``
    and the link ops it issued (``ops``); ``actions`` is the stage's schedule. ``comm=False``
    (``no_comm``, the link set to None): the link figures are None (0 ms on the link), not
    read from the gloo spans of the loopback copies."""
    from workbook import trace
    from workbook.pipeline_parallel import F, phases
    from workbook.trace import intervals
    from workbook.trace.analyse import all_compute, phase_ranges
    comp = all_compute(t)
    per = {"F": [], "B": []}
    for kind, i in actions:
        per[kind].append(intervals.measure(intervals.intersect(comp, phase_ranges(t, f"{kind}{i}")[0])) / 1e3)
    whole = trace.overlap(t)
    steady = trace.overlap(t, within="steady") if "steady" in phases(actions) else None
    p2p = [r for r in ops if r.op in ("send", "recv")]
    compute_ms = intervals.measure(comp) / 1e3
    if not comm:
        whole = steady = None
    return {"step_ms": elapsed_ms, "link_ms": sum(r.link_ns for r in p2p) / 1e6,
            "exposed_ms": (whole.exposed_comm_us - whole.skew_us) / 1e3 if whole else None,
            "skew_ms": whole.skew_us / 1e3 if whole else None,
            "comm_ms": whole.comm_us / 1e3 if whole else None,
            "steady_comm_ms": steady.comm_us / 1e3 if steady else None,
            "steady_exposed_ms": (steady.exposed_comm_us - steady.skew_us) / 1e3 if steady else None,
            "hidden_pct": steady.overlap_pct_ex_skew if steady else None,
            "step_hidden_pct": whole.overlap_pct_ex_skew if whole else None,
            "compute_ms": compute_ms, "bubble": 1 - compute_ms / elapsed_ms if elapsed_ms else None,
            "fwd_ms": statistics.fmean(per[F]) if per[F] else None,
            "bwd_ms": statistics.fmean(per["B"]) if per["B"] else None}


def _rank_bench(o: dict, root: str) -> dict:
    import torch.distributed as dist

    from workbook import link
    from workbook.measure.profiled_step import profiled_step
    from workbook.measure.calibration import recalibrate
    from workbook.grading.labs import load_lab
    from workbook.model import make_batch
    from workbook.pipeline_parallel import activation_shape
    from workbook.runtime import ranks
    from workbook.trace.capture import hardware
    lab, rank, n, dev = load_lab("pp_overlap", o["impl"]), dist.get_rank(), dist.get_world_size(), ranks.device()
    m, cfg = o["micro_batches"], model_config(o["hidden"], o["layers"], o["seq"], o["heads"], o["vocab"])
    tokens, targets = (x.to(dev) for x in make_batch(cfg, o["rows"] * m, seed=0))
    run = [*o["variants"], *(["no_comm"] if "no_comm" not in o["variants"] else [])]  # the prediction's
    runners = {v: make_runner(lab, v, cfg, m, dev) for v in run}
    actions = {v: stage_actions(lab, v, n, m, rank) for v in run}
    act_bytes = 4 * torch.Size(activation_shape(cfg, o["rows"])).numel()       # fp32 [b, S, H]
    link.set_link(None)
    for v in run:                                    # allocate; nothing to wait for
        for _ in range(o["warmup"]):
            runners[v].step(tokens, targets, actions[v])
    out = {"hardware": hardware(), "links": {},
           "schedules": {v: all_schedules(lab, v, n, m) for v in run}}
    for preset in o["links"]:
        recalibrate(preset)                          # the matmul rate now; "none": no link
        lk = link.current_link() if preset != "none" else None
        rows = {v: {f: [] for f in FIELDS} for v in run}
        for k in range(o["repeats"]):                # variants take turns: noise hits them alike
            for v in run:
                link.set_link(None if v == "no_comm" else lk)
                ms, ops, t = profiled_step(lambda: runners[v].step(tokens, targets, actions[v]),
                                           Path(root) / preset / v / f"step{k}", rank, "pp_overlap")
                for key, value in step_figures(t, ops, ms, actions[v], v != "no_comm").items():
                    rows[v][key].append(value)
        link.set_link(lk)
        out["links"][preset] = {
            "link_label": lk.label if lk else None, "activation_bytes": act_bytes,
            "t_p2p_ms": lk.op_time("send", act_bytes, n) * 1e3 if lk else 0.0,
            "variants": {v: {f: statistics.median(x) if None not in x else None for f, x in r.items()}
                         for v, r in rows.items()}}
    return out


# --------------------------------------------------------------------------- the figures
def combine(stages: list[dict]) -> dict:
    """The stages' figures (``stages[s]``: stage s's ``step_figures``) as one row: the slowest
    stage's step, the busiest stage's link and exposed times, the job's hidden shares (link and
    exposed times added over the stages), the pipeline's bubble, and per-stage lists."""
    def total(key):
        xs = [r[key] for r in stages if r[key] is not None]
        return sum(xs) if xs else None

    def hidden(link_key, exposed_key):
        comm, exposed = total(link_key), total(exposed_key)
        return 100 * (1 - exposed / comm) if comm else None

    def most(key):
        xs = [r[key] for r in stages if r[key] is not None]
        return max(xs) if xs else None
    p, step = len(stages), max(r["step_ms"] for r in stages)
    return {"step_ms": step, "link_ms": most("link_ms"), "exposed_ms": most("exposed_ms"),
            "skew_ms": most("skew_ms"), "hidden_pct": hidden("steady_comm_ms", "steady_exposed_ms"),
            "step_hidden_pct": hidden("comm_ms", "exposed_ms"),
            "bubble": 1 - sum(r["compute_ms"] for r in stages) / (p * step),
            "stage_bubbles": [r["bubble"] for r in stages],
            "fwd_ms": [r["fwd_ms"] for r in stages], "bwd_ms": [r["bwd_ms"] for r in stages]}


def _targets(v: dict, p: dict, textbook: float, ceiling: dict) -> dict:
    out = {}
    if "1f1b_overlap" not in v:
        return out
    got = v["1f1b_overlap"]["bubble"]
    out["1F1B with overlapped p2p: measured bubble within 10% of (p-1)/(m+p-1)"] = {
        "want": f"{100 * textbook:.1f}% +- {100 * TARGET_BUBBLE_REL * textbook:.1f}",
        "got": 100 * got, "predicted": 100 * p["1f1b_overlap"]["bubble"],
        "met": abs(got - textbook) <= TARGET_BUBBLE_REL * textbook}
    got = v["1f1b_overlap"]["hidden_pct"]
    out["at least 80% of steady-state p2p time hidden"] = {
        "want": f">= {TARGET_HIDDEN_PCT:.0f}%", "got": got,
        "predicted": p["1f1b_overlap"]["hidden_pct"], "ceiling": ceiling,
        "met": None if got is None else got >= TARGET_HIDDEN_PCT}
    return out


def _check(o: dict, nproc: int, links: list, variants: list, repeats: int, warmup: int,
           unknown_options) -> None:
    from workbook.link.presets import preset_names
    unknown, bad_links = sorted(set(variants) - set(VARIANTS)), [x for x in links if x not in preset_names()]
    problems = [msg for bad, msg in (
        (unknown_options, f"unknown option(s) {sorted(unknown_options)}"),
        (unknown, f"unknown variant(s) {unknown}: choose from {', '.join(VARIANTS)}"),
        (not variants, "name at least one variant"),
        (bad_links, f"unknown link preset(s) {bad_links}: choose from {', '.join(preset_names())}"),
        (not links, "name at least one --link preset"),
        (not 2 <= nproc <= 4, f"--nproc {nproc}: 2 to 4 pipeline stages"),
        (o["layers"] < nproc, f"--layers {o['layers']} cannot fill {nproc} stages: at least one "
                              f"block a stage"),
        (o["micro_batches"] < 1, f"--micro-batches {o['micro_batches']} must be at least 1"),
        (min(o["hidden"], o["seq"], o["rows"], o["heads"], o["vocab"]) < 1,
         "--hidden, --seq, --rows, --heads and --vocab must be at least 1"),
        (o["heads"] >= 1 and o["hidden"] % o["heads"], f"--heads {o['heads']} must divide --hidden "
                                                       f"{o['hidden']}"),
        (repeats < 1 or warmup < 0, "--repeats must be at least 1 and --warmup at least 0"),
    ) if bad]
    if problems:
        raise UsageError(PREFIX + "; ".join(problems))


def measure(*, impl: str = "solutions", nproc: int = 2, links=LINKS, variants=None,
            repeats: int = 3, warmup: int = 1, trace_dir=None, **shape) -> dict:
    """Run the benchmark on ``nproc`` fresh ranks (stages); return what ``--json`` writes
    (module docstring). ``shape``: any of ``DEFAULTS``; a bad option raises ``UsageError``
    (a ``SystemExit``, status 2, one line)."""
    from workbook.runtime import launch
    variants, links, o = list(VARIANTS if variants is None else variants), list(links), dict(DEFAULTS)
    unknown_options = set(shape) - set(o)
    o.update({k: v for k, v in shape.items() if k in o})
    _check(o, nproc, links, variants, repeats, warmup, unknown_options)
    o.update(impl=impl, repeats=repeats, warmup=warmup, links=links, variants=variants)
    with tempfile.TemporaryDirectory(prefix="pp-overlap-bench-") as tmp:
        results = launch.run(_rank_bench, nproc, o, str(trace_dir or tmp), timeout=3600,
                             link=next((x for x in links if x != "none"), "none"))  # the link's backend
    from workbook.pipeline_parallel import bubble_fraction
    textbook = bubble_fraction(nproc, o["micro_batches"])
    schedules = results[0]["schedules"]
    out = {}
    for preset in links:
        per = [r["links"][preset] for r in results]
        rows = {v: combine([p["variants"][v] for p in per]) for v in per[0]["variants"]}
        nc, c = rows["no_comm"], per[0]["t_p2p_ms"]
        t_fwd, t_bwd = statistics.fmean(nc["fwd_ms"]), statistics.fmean(nc["bwd_ms"])
        pred = {v: predict(schedules[v], t_fwd, t_bwd, 0.0 if v == "no_comm" else c) for v in rows}
        ceiling = hidden_ceiling(schedules["1f1b_overlap" if "1f1b_overlap" in rows else "no_comm"],
                                 t_fwd, t_bwd, c)
        v = {x: rows[x] for x in variants}
        out[preset] = {"link_label": per[0]["link_label"], "activation_bytes": per[0]["activation_bytes"],
                       "t_fwd_ms": t_fwd, "t_bwd_ms": t_bwd, "t_p2p_ms": c,
                       "fwd_over_p2p": t_fwd / c if c else None, "textbook_bubble": textbook,
                       "variants": v, "predicted": {x: pred[x] for x in variants},
                       "ceiling": ceiling, "targets": _targets(v, pred, textbook, ceiling)}
    cores = os.cpu_count() or 1
    return {"nproc": nproc, "cores": cores, "oversubscribed": nproc > cores, "options": o,
            "links": out, "hardware": results[0]["hardware"], "torch": torch.__version__}


def _fmt(x, spec="{:.0f}"):
    return "-" if x is None else spec.format(x)


def _pct(x):
    return _fmt(None if x is None else 100 * x, "{:.1f}")


def report(result: dict) -> str:
    """Per preset a table (each figure, ``simulate``'s prediction in brackets), the textbook
    bubble, the targets and the ceiling."""
    from workbook.measure.output import human
    from workbook.measure.output import where_measured
    o, p, m = result["options"], result["nproc"], result["options"]["micro_batches"]
    label = next((r["link_label"] for r in result["links"].values() if r["link_label"]), None)
    lines = [f"pp_overlap benchmark, {where_measured(label, 'no simulated link')}: "
             f"{p} stages on {result.get('hardware', '?')}, torch {result.get('torch')}",
             f"model: gpt, hidden {o['hidden']}, ffn {4 * o['hidden']}, heads {o['heads']}, "
             f"{o['layers']} layers over {p} stages, vocab {o['vocab']}, fp32, forward + backward; "
             f"{m} micro-batches of {o['rows']} x {o['seq']} tokens; median of {o['repeats']} steps; "
             f"measured (simulate's prediction)"]
    if result.get("oversubscribed"):
        lines.append(f"note: {p} ranks on {result['cores']} CPU cores: oversubscribed, the stages "
                     f"share cores, so compute is slower and the ranks skewed")
    for preset, r in result["links"].items():
        v, pr = r["variants"], r["predicted"]
        lines += ["", f"[{preset}] {where_measured(r['link_label'], 'no simulated link')}",
                  f"per micro-batch and stage (no_comm's F/B ranges): forward {r['t_fwd_ms']:.1f} ms, "
                  f"backward {r['t_bwd_ms']:.1f} ms; one transfer ({human(r['activation_bytes'])}B) "
                  + (f"{r['t_p2p_ms']:.1f} ms: forward / transfer = {r['fwd_over_p2p']:.2f}"
                     if r["t_p2p_ms"] else "not modelled (no link)"),
                  f"{'variant':<14}{'step ms':>14}{'link ms':>12}{'exposed ms':>11}{'skew':>6}"
                  f"{'hid% steady':>14}{'hid% step':>13}{'bubble %':>15}{'book %':>8}   stage bubbles %"]
        for name, x in v.items():
            q = pr[name]

            def pair(key, width, fmt=_fmt):
                return f"{fmt(x[key])} ({fmt(q[key])})".rjust(width)
            lines.append(f"{name:<14}" + pair("step_ms", 14) + pair("link_ms", 12)
                         + f"{_fmt(x['exposed_ms']):>11}{_fmt(x['skew_ms']):>6}"
                         + pair("hidden_pct", 14) + pair("step_hidden_pct", 13)
                         + pair("bubble", 15, _pct) + f"{_pct(r['textbook_bubble']):>8}   "
                         + " / ".join(_pct(b) for b in x["stage_bubbles"]))
        lines.append(f"textbook bubble (p-1)/(m+p-1) = {p - 1}/{m + p - 1} = {_pct(r['textbook_bubble'])}%; "
                     f"simulate assumes sends that never block: for gpipe and 1f1b (blocking) its "
                     f"figure is the same schedule with overlapped p2p")
        lines.append("targets (benchmark figures, not timed tests):")
        for name, t in r["targets"].items():
            extra = ""
            if "ceiling" in t:
                c = t["ceiling"]
                extra = (f"; ceiling for non-interleaved 1F1B {_fmt(c['steady_pct'], '{:.0f}%')} (simulate: "
                         f"steady-state transfers under compute; 1 - extra step / stage p2p time: "
                         f"{_fmt(c['step_pct'], '{:.0f}%')})")
            lines.append(f"  {name:<72} want {t['want']}, got {_fmt(t['got'], '{:.1f}%')} (simulate "
                         f"{_fmt(t['predicted'], '{:.1f}%')}){extra}  "
                         + {True: "met", False: "NOT met", None: "n/a: no link"}[t["met"]])
    return "\n".join(lines + ["", "link ms: the busiest stage's modelled p2p time; exposed: what no "
                              "compute hid (skew excused); hid% steady: of the steady state's p2p "
                              "time (GPipe has none); bubble: 1 - compute / (p x step)",
                              "simulated figures: a CPU in slow motion, calibrated to the preset's "
                              "compute/link ratio"])


def figure(result: dict):
    """Per preset, each variant's step: its stages' mean compute and the idle rest (stacked),
    with simulate's predicted step (a diamond) and the textbook step (compute x (m+p-1)/m, a
    line marker)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    from workbook.measure.output import where_measured
    links, p, m = result["links"], result["nproc"], result["options"]["micro_batches"]
    fig = make_subplots(cols=len(links), subplot_titles=[where_measured(r["link_label"], k)
                                                         for k, r in links.items()])
    for col, r in enumerate(links.values(), 1):
        v, pr = r["variants"], r["predicted"]
        comp = [x["step_ms"] * (1 - x["bubble"]) for x in v.values()]
        for name, y, kind in (("compute (mean stage)", comp, go.Bar),
                              ("idle: bubble and exposed p2p", [x["step_ms"] - c for x, c in zip(v.values(), comp)], go.Bar),
                              ("simulate's step", [pr[n]["step_ms"] for n in v], go.Scatter),
                              ("textbook step", [c * (m + p - 1) / m for c in comp], go.Scatter)):
            marker = {"mode": "markers", "marker_symbol": "diamond" if name.startswith("sim") else "line-ew-open",
                      "marker_size": 14} if kind is go.Scatter else {}
            fig.add_trace(kind(name=name, x=list(v), y=y, showlegend=col == 1, legendgroup=name, **marker),
                          1, col)
    fig.update_layout(barmode="stack", yaxis_title="step time (ms)", height=480, width=1200,
                      title=f"pp_overlap, {p} stages, {m} micro-batches, SIMULATED links")
    return fig


def run_bench(args) -> dict:
    return measure_and_save(args, measure, report, figure, links=args.links,
                            variants=listed(args.variants), repeats=args.repeats,
                            warmup=args.warmup, **{k: getattr(args, k) for k in DEFAULTS})
