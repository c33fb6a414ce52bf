"""Figures of the pp_overlap lab: how much of a pipeline's point-to-point traffic hides, and how
far its bubble sits from the textbook's.

On 2 stages over the simulated dgx-h100 link, a GPT model (hidden ``HIDDEN``, ``LAYERS`` blocks
split over the stages, fp32) takes one profiled training step (forward and backward of ``M``
micro-batches of ``ROWS`` x ``SEQ`` tokens) under each variant of the lab: ``gpipe`` and
``1f1b`` (``BlockingExecutor``), ``1f1b_overlap`` (``OverlappedExecutor``), after one warm-up
step without link; ``no_comm`` (1F1B, the overlapped executor, the link set to None) gives the
compute per micro-batch. Per variant (``workbook.pipeline_parallel.pp_overlap_bench.step_figures`` and
``combine``):

* **step ms** of the slower stage; **link ms**, the modelled p2p time of one stage (one
  activation ``[ROWS, SEQ, HIDDEN]`` each way per micro-batch);
* **exposed ms**: the link time no compute ran beside (rank skew excused); **hidden %** of the
  steady state's p2p link time (both stages added up; GPipe has no steady state);
* **bubble**: ``1 - compute / (p x step)``, compute read from the trace, beside the textbook
  ``(p - 1) / (m + p - 1)``.

In brackets, what ``workbook.pipeline_parallel.simulate`` predicts with ``no_comm``'s forward and
backward compute per micro-batch (the ``F3`` / ``B3`` ranges of its trace) and the link's time
for one activation; it assumes sends that never block, so for the blocking variants it is the
same schedule with overlapped p2p. The last line gives the ceiling ``simulate`` implies for
non-interleaved 1F1B (``bench_pp_overlap.hidden_ceiling``): about half the steady state's p2p
time waits on the critical path. One step each: for medians, both links and other shapes,
``workbook bench pp_overlap``.

The prediction. Last, the learner's ``predict_step_ms`` (the lab's prediction task) with the
link this run used, the activation's shape and ``no_comm``'s compute, beside the model's value of
the same figure (``step_model``: ``simulate`` of the learner's 1F1B with the link's time for one
activation) and the measured step of ``1f1b_overlap``, on the simulated link
(``workbook.grading.predictions.comparison_lines``; a prediction not written yet shows ``-``).
``step_model`` also gives the values of the classic wrong derivations, which the grader
(``tests/grading/test_pp_overlap.py``) names when a prediction equals one of them.
"""
from __future__ import annotations

from workbook.measure.output import traces_line, where_measured

WORLD_SIZE = 2
LINK = "dgx-h100"
HIDDEN, LAYERS, SEQ, ROWS, M = 512, 4, 256, 1, 4
VARIANTS = ("gpipe", "1f1b", "1f1b_overlap")


def run(trace_dir=None, impl=None) -> dict:
    import torch
    import torch.distributed as dist

    from workbook import link
    from workbook.pipeline_parallel.pp_overlap_bench import (all_schedules, make_runner, model_config, stage_actions,
                                           step_figures)
    from workbook.measure.profiled_step import profiled_step, trace_folder
    from workbook.measure.calibration import recalibrate
    from workbook.grading.labs import load_lab
    from workbook.model import make_batch
    from workbook.pipeline_parallel import activation_shape
    from workbook.runtime import ranks
    lab = load_lab("pp_overlap", impl)
    rank, n, dev = dist.get_rank(), dist.get_world_size(), ranks.device()
    preset = link.current_link().preset if link.current_link() else None
    cfg = model_config(HIDDEN, max(LAYERS, n), SEQ)
    tokens, targets = (x.to(dev) for x in make_batch(cfg, ROWS * M, seed=0))
    order = ("no_comm", *VARIANTS)                       # no_comm first: the prediction's compute
    runners = {v: make_runner(lab, v, cfg, M, dev) for v in order}
    actions = {v: stage_actions(lab, v, n, M, rank) for v in order}
    link.set_link(None)                                  # warm-up: allocate, nothing to wait for
    runners["no_comm"].step(tokens, targets, actions["no_comm"])
    if preset:
        recalibrate(preset)                              # the matmul rate now
    lk = link.current_link()
    act_bytes = 4 * torch.Size(activation_shape(cfg, ROWS)).numel()
    out = {"rank": rank, "link": lk.label if lk else None, "trace_dir": trace_dir and str(trace_dir),
           "layers": cfg.n_layers, "activation_bytes": act_bytes, "link_model": lk,
           "activation_shape": tuple(activation_shape(cfg, ROWS)), "itemsize": 4,
           "t_p2p_ms": lk.op_time("send", act_bytes, n) * 1e3 if lk else 0.0,
           "schedules": {v: all_schedules(lab, v, n, M) for v in order} if rank == 0 else None,
           "variants": {}}
    with trace_folder(trace_dir, "pp_overlap") as root:       # None: a temporary one
        for v in order:
            link.set_link(None if v == "no_comm" else lk)
            ms, ops, t = profiled_step(lambda: runners[v].step(tokens, targets, actions[v]), root / v,
                                       rank, "pp_overlap")
            out["variants"][v] = step_figures(t, ops, ms, actions[v], comm=v != "no_comm")
    link.set_link(lk)
    return out


def transfer_ms(link, shape, itemsize: int) -> float:
    """The link's time in ms for one activation of ``shape`` (elements of ``itemsize`` bytes)
    sent to a neighbour: the alpha-beta cost of ``Link.op_time``."""
    import math
    return 1e3 * link.op_time("send", math.prod(shape) * itemsize, 2)


def step_model(schedules, link, shape, itemsize: int, t_fwd_ms: float,
               t_bwd_ms: float) -> tuple[float, dict]:
    """The model's step in ms of ``schedules`` (every stage's actions, 1F1B) run with
    overlapped p2p on ``link``: ``simulate`` with the forward and backward compute of one
    micro-batch and ``transfer_ms`` of one activation ``shape``. Returns ``(model, mistakes)``:
    ``mistakes`` maps each classic wrong derivation (as the learner's message words it) to the
    value it gives, for ``workbook.grading.predictions.judge_prediction``."""
    import math

    from workbook.pipeline_parallel import simulate
    p, m = len(schedules), len(schedules[0]) // 2
    alpha_ms = 1e3 * link.latency_s
    c = transfer_ms(link, shape, itemsize)

    def play(c_ms: float) -> float:
        return simulate(schedules, t_fwd_ms, t_bwd_ms, c_ms).step
    model = play(c)
    book = (m + p - 1) * (t_fwd_ms + t_bwd_ms)
    mistakes = {
        "leave the transfers out: (m + p - 1)(t_f + t_b) is the textbook step, without the p2p "
        "that lies on the critical path": book,
        "leave the link's latency (alpha) out of each transfer's time": play(c - alpha_ms),
        "leave the bandwidth term (bytes / bandwidth) out of each transfer's time: only the "
        "latency": play(alpha_ms),
        "count the activation's elements as bytes (its itemsize left out)":
            play(alpha_ms + 1e3 * math.prod(shape) / link.bandwidth_Bps),
        "use m instead of m + p - 1: the fill and the drain of the pipeline left out":
            model - (p - 1) * (t_fwd_ms + t_bwd_ms),
        "count only the 2(p - 1) transfers of the fill and the drain, as if every steady-state "
        "transfer hid (GPipe's case; in 1F1B the round trip keeps some on the critical path)":
            book + 2 * (p - 1) * c,
        "put all 2m transfers of a stage on the critical path, as if nothing hid":
            book + 2 * m * c,
        "give seconds, not milliseconds": model / 1e3,
    }
    return model, mistakes


def prediction_lines(results: list[dict], t_fwd: float, t_bwd: float, measured_ms,
                     predict=None) -> list[str]:
    """The table: the learner's ``predict_step_ms`` (``predict``; by default the lab's, from the
    implementation under test), the model, the measured step, in seconds. A prediction that
    raises (not written yet) shows ``-``."""
    from workbook.grading.predictions import comparison_lines
    if predict is None:
        from workbook.grading.labs import load_lab

        def predict(*args):
            return load_lab("pp_overlap").predict_step_ms(*args)
    first, p = results[0], len(results)
    lk = first.get("link_model")
    if lk is None:
        return ["prediction: no simulated link on this run, nothing to predict"]
    shape, itemsize = first["activation_shape"], first["itemsize"]
    model, _ = step_model(first["schedules"]["1f1b_overlap"], lk, shape, itemsize, t_fwd, t_bwd)
    try:
        predicted = float(predict(lk, p, M, shape, itemsize, t_fwd, t_bwd))
    except Exception:                            # noqa: BLE001 - a stub or a bug shows as "-"
        predicted = None
    def sec(ms):                                 # a step is seconds long: 7.22, not 7.22e+03 ms
        return None if ms is None else ms / 1e3
    return ([f"prediction (predict_step_ms, with this run's link and no_comm's compute; measured "
             f"on the SIMULATED link):"]
            + comparison_lines([("1F1B overlapped step", sec(predicted), sec(model),
                                 sec(measured_ms))], unit="s"))


def _fmt(x, spec="{:.0f}") -> str:
    return "-" if x is None else spec.format(x)


def _pct(x) -> str:
    return _fmt(None if x is None else 100 * x, "{:.1f}")


def describe(results: list[dict]) -> str:
    import statistics

    from workbook.pipeline_parallel.pp_overlap_bench import combine, hidden_ceiling, predict
    from workbook.pipeline_parallel import bubble_fraction
    first, p = results[0], len(results)
    rows = {v: combine([r["variants"][v] for r in results]) for v in first["variants"]}
    nc, c = rows["no_comm"], first["t_p2p_ms"]
    t_fwd, t_bwd = statistics.fmean(nc["fwd_ms"]), statistics.fmean(nc["bwd_ms"])
    schedules, book = first["schedules"], bubble_fraction(p, M)
    pred = {v: predict(schedules[v], t_fwd, t_bwd, 0.0 if v == "no_comm" else c) for v in rows}
    ceiling = hidden_ceiling(schedules["1f1b_overlap"], t_fwd, t_bwd, c)
    lines = [f"pp_overlap figures: gpt, hidden {HIDDEN}, {first['layers']} blocks over {p} stages, "
             f"{M} micro-batches of {ROWS}x{SEQ} tokens, fp32; {where_measured(first['link'])}",
             f"one profiled step each; measured (simulate's prediction); per micro-batch and stage: "
             f"forward {t_fwd:.0f} ms, backward {t_bwd:.0f} ms, one transfer {c:.0f} ms"
             + (f" (forward / transfer = {t_fwd / c:.1f})" if c else ""),
             f"{'variant':<14}{'step ms':>14}{'link ms':>9}{'exposed ms':>11}{'hid% steady':>13}"
             f"{'bubble %':>15}{'book %':>8}"]
    for v in (*VARIANTS, "no_comm"):
        x, q = rows[v], pred[v]
        lines.append(f"{v:<14}" + f"{_fmt(x['step_ms'])} ({_fmt(q['step_ms'])})".rjust(14)
                     + f"{_fmt(x['link_ms']):>9}{_fmt(x['exposed_ms']):>11}"
                     + f"{_fmt(x['hidden_pct'])} ({_fmt(q['hidden_pct'])})".rjust(13)
                     + f"{_pct(x['bubble'])} ({_pct(q['bubble'])})".rjust(15) + f"{_pct(book):>8}")
    lines += [f"book: (p-1)/(m+p-1); simulate assumes sends that never block (the blocking variants' "
              f"figure is their schedule with overlapped p2p); non-interleaved 1F1B can hide at most "
              f"about {_fmt(ceiling['steady_pct'])}% of its steady-state p2p time (simulate)",
              "medians, both links, other shapes: workbook bench pp_overlap"]
    if first.get("trace_dir"):
        lines.append(traces_line(first["trace_dir"], ("no_comm", *VARIANTS), "variant"))
    lines += prediction_lines(results, t_fwd, t_bwd, rows["1f1b_overlap"]["step_ms"])
    return "\n".join(lines)
