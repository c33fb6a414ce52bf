"""Figures of the domino lab: how much all-reduce time Domino hides, and what that buys.

On 2 ranks over the simulated dgx-h100 link, one model (GPT, hidden 768, 2 layers, batch
8 x 256, fp32: ``workbook bench domino``'s, at half its batch) trains with vanilla TP (every all-reduce waited on at once) and
with Domino (p = 4 batch chunks, intra- and inter-layer overlap):

* **hidden % (HTA)**: the share of a pass's communication time during which the rank computed
  (Holistic Trace Analysis' comm/comp overlap), from one profiled step of each;
* **hidden % without skew**: the same, counting as hidden the exposed time in which the other
  rank had not issued that all-reduce yet (``Metrics.overlap_pct_ex_skew``): the schedule's
  own share, whatever the ranks' speeds; the grader judges this one;
* **speed-up**: vanilla TP's step time over Domino's (slowest rank, the fastest of ``STEPS``
  unprofiled steps each, taking turns: the least disturbed on a shared CPU). The paper reports up to 1.3x for GPT on DGX-H100.

* **your prediction**: the lab's ``predict_exposed_ms`` for this run's Domino step, beside the
  model (the lesson's planner replaying the lab's own ``schedule``: ``domino_plan.exposed_ms``)
  and the measurement (the profiled step's exposed communication, mean over ranks, not counting
  the time a late peer held it up); an unwritten prediction or schedule shows ``-``.

The profiled steps go into one trace per rank, each a step of its own (``traced_step``:
``ProfilerStep#0`` vanilla TP, ``ProfilerStep#1`` Domino) around ``record_function`` ranges
``"vanilla TP step"`` and ``"Domino step"``: ``workbook trace summary DIR --step 1`` gives
Domino's figures alone, and the trace report draws where one step ends and the next begins.
The **step hidden (HTA)** column is the whole step's figure, the one ``--step N`` reads.
"""
from __future__ import annotations

import time

WORLD_SIZE = 2
LINK = "dgx-h100"
HIDDEN, HEADS, BATCH, SEQ, VOCAB, P, STEPS = 768, 12, 8, 256, 1024, 4, 2
STEPS_NAMED = {"vanilla_tp": "vanilla TP", "domino": "Domino"}


def run(trace_dir=None, impl=None, *, model: dict | None = None, batch: int = BATCH,
        steps: int = STEPS) -> dict:
    """On every rank: the comparison (module docstring). ``model`` (``MODEL``'s keys), ``batch``
    and ``steps`` (timed steps per build, at least 1) change the run's size; the figures say
    what ran."""
    import torch.distributed as dist
    from torch.profiler import record_function

    from workbook import link, trace
    from workbook.tensor_parallel.block_bench import inputs
    from workbook.measure.calibration import recalibrate
    from workbook.measure.profiled_step import trace_folder
    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig
    from workbook.runtime.ranks import device
    from workbook.tensor_parallel.layer_stack import TPStack, vanilla_tp_forward
    from workbook.trace.capture import rank_trace, traced_step
    lab = load_lab("domino", impl)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_flops = recalibrate()
    model = dict(MODEL if model is None else model)
    cfg = ModelConfig(**model, dtype="float32")
    x, targets = inputs(cfg, batch)
    m = TPStack(cfg, rank, world, device=device())          # the batch is on it too

    def step(variant, k):
        name = STEPS_NAMED[variant]
        reg = lab.HandleRegistry()
        with record_function(f"{name} step"):
            with record_function(f"{name} forward"):
                if variant == "domino":
                    loss, _ = lab.domino_forward(m, x, targets, P, reg, step=k)
                else:
                    loss, _ = vanilla_tp_forward(m, x, targets, k)
            with record_function(f"{name} backward"):
                loss.backward()
        reg.check_empty(f"the end of the {name} step")
        m.zero_grad()

    times = {v: [] for v in STEPS_NAMED}
    for k in range(steps + 1):                       # step 0 warms up; the variants take turns
        for variant in STEPS_NAMED:
            dist.barrier()
            t0 = time.perf_counter()
            step(variant, k)
            if k:
                times[variant].append((time.perf_counter() - t0) * 1e3)
    out = {"rank": rank, "link": link.current_link().label if link.current_link() else "no link model",
           "step_ms": {v: min(t) for v, t in times.items()},
           "trace_dir": trace_dir and str(trace_dir), "model": model, "batch": batch,
           "steps": steps}
    with trace_folder(trace_dir, "domino") as folder:          # None: a temporary one
        dist.barrier()
        with rank_trace(folder, lab="domino"):
            for k, variant in enumerate(STEPS_NAMED):              # ProfilerStep#k: one build
                dist.barrier()                                     # between steps: in neither
                with traced_step(k):
                    step(variant, steps + 1)
        t = trace.load_trace(folder / f"rank{rank}.trace.json")
        for variant, name in STEPS_NAMED.items():
            for phase in ("forward", "backward", "step"):
                o = trace.overlap(t, within=f"{name} {phase}")
                out[f"{variant}_{phase}"] = {"comm_ms": o.comm_us / 1e3,
                                             "hidden_ms": o.overlap_us / 1e3,
                                             "skew_ms": o.skew_us / 1e3}
    out["prediction"] = _prediction(lab, link.current_link(), world, model, batch)
    out["local_flops"] = local_flops
    return out


MODEL = dict(hidden=HIDDEN, heads=HEADS, ffn_hidden=4 * HIDDEN, n_layers=2, seq_len=SEQ,
             vocab_size=VOCAB)


def _prediction(lab, lk, world: int, model: dict = MODEL, batch: int = BATCH) -> dict:
    """The lab's predicted exposed ms of this run's Domino step, the model's (the planner on the
    lab's own schedule), and whether the setting is compute-bound; None where one is missing."""
    from workbook.tensor_parallel import domino_plan
    out = {"predicted": None, "model": None, "compute_bound": None}
    if lk is None:
        return out
    settings = dict(model=model, batch=batch, p=P, flops_rate=lk.local_flops, lk=lk, ranks=world)
    shortest, one = domino_plan.chunk_seconds(**settings)
    out["compute_bound"], out["shortest_ms"], out["all_reduce_ms"] = shortest > one, shortest * 1e3, one * 1e3
    for key, figure in (("predicted", lambda: lab.predict_exposed_ms(lk, model, batch, P, world, True)),
                        ("model", lambda: domino_plan.exposed_ms(lab.schedule, **settings))):
        try:
            value = figure()
            out[key] = float(value) if isinstance(value, (int, float)) else None
        except Exception:                            # noqa: BLE001 - not written yet, or broken: "-"
            out[key] = None
    return out


def _pct(results, key, with_skew: bool) -> str:
    """The share of the job's communication (all ranks together) that was hidden."""
    comm = sum(r[key]["comm_ms"] for r in results)
    hidden = sum(r[key]["hidden_ms"] + (r[key]["skew_ms"] if with_skew else 0) for r in results)
    return f"{100 * hidden / comm:.0f}%" if comm else "-"


def _prediction_lines(results: list[dict]) -> list[str]:
    """Prediction / model / measured exposed communication of the Domino step."""
    from workbook.grading.predictions import comparison_lines
    pred = results[0].get("prediction") or {}
    measured = [r["domino_forward"]["comm_ms"] - r["domino_forward"]["hidden_ms"]
                - r["domino_forward"]["skew_ms"] + r["domino_backward"]["comm_ms"]
                - r["domino_backward"]["hidden_ms"] - r["domino_backward"]["skew_ms"] for r in results]
    where = "on the SIMULATED link" if pred.get("compute_bound") is not None else \
        "no link model: nothing to predict from"
    lines = [f"exposed communication of the Domino step (p={P}, {len(results)} ranks; measured: "
             f"the profiled step, mean over ranks, late peers not counted, {where})"]
    lines += comparison_lines([("Domino step, exposed", pred.get("predicted"), pred.get("model"),
                                max(0.0, sum(measured) / len(measured)))])
    if pred.get("compute_bound") is False:
        lines.append(f"  (this run is not compute-bound: one chunk's all-reduce takes "
                     f"{pred['all_reduce_ms']:.0f} ms, the shortest chunk's compute of a stage "
                     f"{pred['shortest_ms']:.0f} ms; the model also counts the link time that "
                     f"queues behind short computes, which the graded settings leave out)")
    return lines


def describe(results: list[dict]) -> str:
    from workbook.measure.output import where_measured
    first = results[0]
    model, batch, steps = first.get("model", MODEL), first.get("batch", BATCH), \
        first.get("steps", STEPS)
    slow = {v: max(r["step_ms"][v] for r in results) for v in STEPS_NAMED}
    lines = [f"domino figures: {len(results)} ranks, GPT hidden {model['hidden']}, "
             f"{model['n_layers']} layers, batch {batch} x {model['seq_len']}, fp32, Domino p={P}; "
             + where_measured(first["link"]),
             f"{'':<12}{'step ms':>9}{'fwd hidden (HTA)':>18}{'fwd w/o skew':>14}"
             f"{'bwd hidden (HTA)':>18}{'bwd w/o skew':>14}{'step hidden (HTA)':>19}"]
    for v, name in STEPS_NAMED.items():
        lines.append(f"{name:<12}{slow[v]:>9.0f}{_pct(results, f'{v}_forward', False):>18}"
                     f"{_pct(results, f'{v}_forward', True):>14}"
                     f"{_pct(results, f'{v}_backward', False):>18}"
                     f"{_pct(results, f'{v}_backward', True):>14}"
                     f"{_pct(results, f'{v}_step', False):>19}")
    comm = max(r["vanilla_tp_forward"]["comm_ms"] + r["vanilla_tp_backward"]["comm_ms"]
               for r in results)
    lines.append(f"speed-up of Domino over vanilla TP: {slow['vanilla_tp'] / slow['domino']:.2f}x "
                 f"(step time, slowest rank, fastest of {steps}; vanilla TP spends {comm:.0f} ms "
                 f"per step in all-reduces; simulated, not measured hardware)")
    lines.append("hidden %: share of the pass's (the step's) all-reduce time the ranks computed "
                 "through, all ranks together; w/o skew also counts the time a late peer held it up")
    lines += _prediction_lines(results)
    if first.get("trace_dir"):
        from workbook.measure.output import steps_line
        lines.append(steps_line(first["trace_dir"], STEPS_NAMED.values()))
    return "\n".join(lines)
