"""Autograder for lab 9, ``dp_overlap``: the numbers, the traffic, the memory, the overlap.

Buckets (instant, no ranks): ``make_buckets`` on the model's parameters and on made-up sizes.

Prediction (instant, no ranks): ``predict_exposed_ms`` on three settings (links, bucket caps, rank
counts, models) against the link model of the same figure (``dp_overlap_report.exposed_tail``),
a known wrong derivation named (``workbook.grading.predictions.judge_prediction``).

Numerics (fp64, 2 and 4 ranks, GPT and Llama): each variant trains the reference model for
``STEPS`` Adam steps on its rows of the global batch; the gradient the optimizer reads on the
first step must be the average over ranks (for ZeRO: this rank's shard of it), and after the
last step every parameter must equal single-device training on the whole batch.

Traffic (2 and 3 ranks, from the trace of one steady-state step): which collectives each pass
ran, how many and how many bytes, against the lesson's formulas. Memory (from the numerics run):
what a rank holds between steps, measured from its storages (``memory_by_kind``), equals the
ZeRO table (``predicted_memory``).

Overlap (fp32, 2 ranks, simulated ``dgx-h100`` link), through the shared timing policy
(``workbook.grading.timing``): structure first (when each bucket's all-reduce was issued against
when its gradients were ready; all-gathers waited on right after they started), then the share of
the link time hidden behind compute, read from the trace, rank skew excused, near misses measured
again. The structure is program order (``CountGemms``), the same at any width: it is judged first
on the same step of a model of hidden size 64 with the same 7 layers (on the untimed link, in
about a second), before the wide model is measured, and the measured run judges it again.

Numbers first: a variant's traffic and overlap earn nothing while that variant's numerics fail
(``workbook.grading.checks.numbers_first``; the numerics run is read again, not repeated), and
only its own: ZeRO-2's overlap waits on ZeRO-2's numbers, not on naive DP's.
"""
from __future__ import annotations

import functools
import os
import time

import pytest
import torch

from workbook.data_parallel import STAGE
from workbook.grading.checks import how_far, numbers_first
from workbook.grading.engine import graded_size, on_ranks, simulated_link, world_sizes
from workbook.grading.model_checks import rank_error, ranks_label, raise_if_failed, to_cpu
from workbook.grading.overlap_run import profile_lab_step
from workbook.grading.trace_checks import OverlapCheck, trace_root_fixture
from workbook.grading.traffic_link import untimed_link
from workbook.link.program_order import waited_at_once

LAB = "dp_overlap"
TIMEOUT_S = 60.0
LINK = "dgx-h100"
STEPS = 3
ROWS = 2                          # rows of the global batch per rank
BUCKET_BYTES = 32 << 10           # several buckets on the graded model (fc1/fc2 get their own)
NAMES = {"naive": "NaiveDP", "bucketed": "BucketedDP", "zero1": "ShardedTrainer(stage=1)",
         "zero2": "ShardedTrainer(stage=2)", "zero3": "Zero3"}
TOL = dict(rtol=1e-9, atol=1e-12)
EXPOSED_GATHERS = 3           # per pass, gathers nothing can hide: forward, the embedding's (the
                              # first), block 0's (prefetched behind the embedding, a table
                              # lookup) and the head's (behind the final norm); backward, the last
                              # block's (behind the final norm's backward)
EXPOSED_SCATTERS = 2          # backward, those no GEMM can hide: the embedding's (its gradients
                              # are the last made) and block 0's (only the embedding's backward,
                              # a scatter-add, runs after it)
THRESHOLDS = {"bucketed": {"backward": 40.0}, "zero2": {"forward": 30.0, "backward": 50.0},
              "zero3": {"forward": 30.0, "backward": 50.0}}   # below the reference's lowest
                              # figure under load and on one core by a measured margin (README)


def _configs():
    from workbook.model import ModelConfig
    return [("gpt fp64", ModelConfig(dtype="float64", n_layers=2)),
            ("llama fp64", ModelConfig(style="llama", dtype="float64", n_layers=2))]


def _make(lab, variant: str, cfg, dev):
    if variant == "bucketed":
        return lab.BucketedDP(cfg, dev, bucket_bytes=BUCKET_BYTES)
    return lab.VARIANTS[variant](cfg, dev)


# --------------------------------------------------------------------------- rank side
def _train(lab, variant: str, cfg, n: int, dev) -> dict:
    """STEPS steps of one variant; the first step's optimizer inputs, the final parameters and
    the memory held between steps."""
    from workbook.data_parallel import memory_by_kind
    from workbook.model import make_batch
    trainer = _make(lab, variant, cfg, dev)
    seen = {}
    step_fn = trainer.optimizer.step

    def spy(*args, **kwargs):                        # what the optimizer reads, on step 0 only
        if not seen:
            seen["grads"] = [p.grad.detach().clone() if p.grad is not None else None
                             for g in trainer.optimizer.param_groups for p in g["params"]]
        return step_fn(*args, **kwargs)

    trainer.optimizer.step = spy
    losses = []
    for step in range(STEPS):
        tokens, targets = make_batch(cfg, ROWS * n, seed=100 + step)
        losses.append(float(trainer.train_step(tokens.to(dev), targets.to(dev), step)))
    memory = memory_by_kind(trainer)
    full = trainer.full_parameters() if hasattr(trainer, "full_parameters") else None
    if full is None:
        from workbook.model import params_by_name
        full = params_by_name(trainer.model)
    units = [[name for name, _ in unit.named_parameters(prefix=unit.name)]
             for unit in trainer.units]
    return {"grads": seen.get("grads"), "params": full, "memory": memory, "losses": losses,
            "units": units, "element_bytes": next(trainer.model.parameters()).element_size()}


def _run_numerics(variant: str) -> dict:
    """One variant on every config (a run of its own: a hang in one variant is not blamed on
    another's test)."""
    import torch.distributed as dist
    from workbook.grading.labs import load_lab
    from workbook.runtime.launch import device
    lab, n, dev = load_lab(LAB), dist.get_world_size(), device()
    out = {}
    for tag, cfg in _configs():
        try:
            out[(variant, tag)] = _train(lab, variant, cfg, n, dev)
        except Exception as exc:                 # noqa: BLE001 - graded by that variant's test
            out[(variant, tag)] = rank_error(exc)
    return to_cpu(out)


def _run_traffic(trace_dir: str, variant: str) -> dict:
    """One steady-state step (the third) of ``variant``, in its own trace."""
    import torch.distributed as dist
    from workbook import trace
    from workbook.grading.labs import load_lab
    from workbook.runtime.launch import device
    from workbook.model import ModelConfig, make_batch
    from workbook.trace.capture import rank_trace
    lab, rank, n, dev = load_lab(LAB), dist.get_rank(), dist.get_world_size(), device()
    cfg = ModelConfig(n_layers=2) if n != 3 else ModelConfig.odd_shapes(n_layers=2)
    with untimed_link():          # counted, not timed: no slow-motion transfers
        try:
            trainer = _make(lab, variant, cfg, dev)
            for step in range(3):
                tokens, targets = make_batch(cfg, ROWS * n, seed=step)
                if step < 2:
                    trainer.train_step(tokens.to(dev), targets.to(dev), step)
                    continue
                dist.barrier()
                folder = os.path.join(trace_dir, variant)
                with rank_trace(folder, lab=LAB):
                    trainer.train_step(tokens.to(dev), targets.to(dev), step)
        except Exception as exc:                         # noqa: BLE001 - graded by its test
            return {variant: rank_error(exc)}
    t = trace.load_trace(os.path.join(folder, f"rank{rank}.trace.json"))
    return {variant: {
        "phases": {p: trace.collectives(t, within=p) for p in ("forward", "backward", "optimizer")},
        "params": [p.numel() for p in trainer.model.parameters()],
        "units": [sum(p.numel() for p in u.parameters()) for u in trainer.units],
        "buckets": len(getattr(trainer, "buckets", ())),
        "element_bytes": next(trainer.model.parameters()).element_size()}}


OVERLAP_MODEL = dict(hidden=256, heads=4, ffn_hidden=1024, n_layers=4, seq_len=256,
                     vocab_size=256, dtype="float32")       # compute that can cover the traffic
OVERLAP_ROWS, OVERLAP_BUCKET_BYTES = 8, 1 << 20             # per rank; a bucket of its step
STRUCTURE_MODEL = dict(n_layers=4, dtype="float32")         # hidden 64: the same 7 layers, the
STRUCTURE_ROWS, STRUCTURE_BUCKET_BYTES = 2, 64 << 10        # same program order; several buckets


def _prepare(lab, variant: str, model: dict, rows: int, bucket_bytes: int):
    """``variant`` on ``ModelConfig(**model)`` after two warm-up steps on ``rows`` rows a rank,
    instrumented: ``(trainer, the third batch, ready, marks)``; ``ready`` gets the time each
    gradient is made, ``marks`` when the backward pass and the optimizer step begin."""
    import torch.distributed as dist
    from workbook.model import ModelConfig, make_batch
    from workbook.runtime.launch import device
    n, dev = dist.get_world_size(), device()
    cfg = ModelConfig(**model)
    batches = [[b.to(dev) for b in make_batch(cfg, rows * n, seed=s)] for s in range(3)]
    ready, marks = [], {}
    trainer = _make(lab, variant, cfg, dev) if variant != "bucketed" else \
        lab.BucketedDP(cfg, dev, bucket_bytes=bucket_bytes)
    for step in range(2):
        trainer.train_step(*batches[step], step)
    for p in trainer.model.parameters():             # when each gradient is made: a tensor hook
        p.register_hook(lambda g: ready.append(time.perf_counter_ns()))  # runs before the
                                                     # accumulation, and so before the lab's hooks
    trainer.model.register_forward_hook(
        lambda *_: marks.setdefault("backward", time.perf_counter_ns()) and None)
    optimizer_step = trainer.optimizer_step

    def timed_step():
        marks["optimizer"] = time.perf_counter_ns()
        optimizer_step()
    trainer.optimizer_step = timed_step
    return trainer, batches[2], ready, marks


def _op_structure(ops, ready: list, marks: dict) -> tuple[dict, dict]:
    """What ``_structure`` reads of the link ops ``ops`` of one step: the all-reduced bytes issued
    after the last gradient was ready (and the largest, and all of them), and per pass (its ops,
    ``{"mine": ...}``) the gathers and reduce-scatters waited on at once (no GEMM in between)."""
    last_ready = max(ready) if ready else 0
    result = {"late_bytes": sum(r.size_bytes for r in ops if r.op == "all_reduce"
                                and r.issued_ns > last_ready),
              "largest": max([r.size_bytes for r in ops if r.op == "all_reduce"], default=0),
              "all_reduce_bytes": sum(r.size_bytes for r in ops if r.op == "all_reduce")}
    phases = {}
    for phase in ("forward", "backward"):
        mine = [r for r in ops if _phase(r.issued_ns, marks) == phase]
        phases[phase] = mine
        result[phase] = {
            "at_once": sum(r.op == "all_gather" and waited_at_once(r) for r in mine),
            "gathers": sum(r.op == "all_gather" for r in mine),
            "scatters_at_once": sum(r.op == "reduce_scatter" and waited_at_once(r) for r in mine),
            "scatters": sum(r.op == "reduce_scatter" for r in mine)}
    return result, phases


def _overlap(trace_dir: str, variant: str) -> dict:
    """One profiled step (after two warm-up steps) on a model whose compute can cover the
    traffic; the link's ops per pass, and when each gradient became ready."""
    state = {}

    def prepare(lab):
        state["run"] = _prepare(lab, variant, OVERLAP_MODEL, OVERLAP_ROWS, OVERLAP_BUCKET_BYTES)
        return state["run"][0]

    def step(lab, trainer):
        trainer.train_step(*state["run"][1], 2)
    run = profile_lab_step(LAB, LINK, trace_dir, prepare, step)
    if isinstance(run, dict):
        return run
    _, _, ready, marks = state["run"]
    counts, phases = _op_structure(run.link_ops, ready, marks)
    result = {**run.head(), **counts}
    for phase, mine in phases.items():
        result[phase] = {**run.figures(phase, mine), **counts[phase]}
    return result


def _structure_run(variant: str) -> dict:
    """On every rank: the overlap run's step of ``variant`` on a model of hidden size 64 (the
    same 7 layers), its GEMMs counted, on the simulated link at full speed (``untimed_link``:
    the structure is counted, not timed): what ``_structure`` reads, as ``_overlap`` gives it.
    Program order does not depend on the model's width, so a structural mistake is named here
    in about a second, before the measured run trains the wide model."""
    import torch.distributed as dist

    from workbook import link
    from workbook.grading.labs import load_lab
    from workbook.link.program_order import CountGemms
    rank = dist.get_rank()
    result = {"rank": rank, "link": link.current_link().label}
    try:
        lab = load_lab(LAB)
        with untimed_link():
            trainer, batch, ready, marks = _prepare(lab, variant, STRUCTURE_MODEL, STRUCTURE_ROWS,
                                                    STRUCTURE_BUCKET_BYTES)
            dist.barrier()
            before = len(link.op_log())
            with CountGemms():
                trainer.train_step(*batch, 2)
            ops = [r for r in link.op_log()[before:] if r.op != "barrier"]
    except NotImplementedError as exc:
        return {"rank": rank, "not_implemented": str(exc)}
    except Exception as exc:             # noqa: BLE001 - reported by the judge
        return {"rank": rank, **rank_error(exc)}
    counts, phases = _op_structure(ops, ready, marks)
    result.update(counts)
    for phase, mine in phases.items():
        result[phase]["never_waited"] = sorted({r.op for r in mine if not r.first_wait_ns})
    return result


def _phase(issued_ns: int, marks: dict) -> str:
    """The pass an op was issued in: forward until the model's output exists, then backward
    (with the gradient sync) until the optimizer step begins."""
    if issued_ns < marks.get("backward", 0):
        return "forward"
    return "backward" if issued_ns < marks.get("optimizer", float("inf")) else "optimizer"


# --------------------------------------------------------------------------- test side
#: per variant, the learner's method the given code calls first in a step (a stub raises there)
FIRST_TASK = {"naive": ("NaiveDP", "finish_gradient_sync"),
              "zero1": ("ShardedTrainer", "before_forward"),
              "zero2": ("ShardedTrainer", "before_forward"), "zero3": ("Zero3", "before_forward")}


def _numerics(n: int, variant: str) -> list:
    """Every rank's run of ``variant`` (``_run_numerics``); an untouched stub of its first task
    is told here, before any rank builds a model and its optimizer (``raise_if_stub``)."""
    if variant in FIRST_TASK:
        from workbook.grading.labs import load_lab
        from workbook.grading.stubs import raise_if_stub
        cls, method = FIRST_TASK[variant]
        raise_if_stub(getattr(getattr(load_lab(LAB), cls), method))
    return on_ranks(n, _run_numerics, variant, timeout=TIMEOUT_S, key=("numerics", variant))


_REFERENCE: dict = {}


def _reference(tag: str, cfg, n: int):
    """Single-device training on the whole batch: the first step's gradients (by name) and the
    parameters after ``STEPS`` steps."""
    if (tag, n) not in _REFERENCE:
        from workbook.data_parallel import train_reference
        from workbook.grading.threads import one_thread
        from workbook.model import grads_by_name, make_batch, params_by_name
        batches = [make_batch(cfg, ROWS * n, seed=100 + step) for step in range(STEPS)]
        with one_thread():                                          # a tiny model (threads.py)
            first = grads_by_name(train_reference(cfg, batches[:1]))   # .grad outlives the step
            _REFERENCE[(tag, n)] = (first, params_by_name(train_reference(cfg, batches)))
    return _REFERENCE[(tag, n)]


def _expected_optimizer_inputs(variant: str, res: dict, grads: dict, rank: int, n: int) -> list:
    """What the optimizer must read on rank ``rank``: every averaged gradient (DP), or this
    rank's shard of each layer's flat, padded, averaged gradient (ZeRO)."""
    if STAGE[variant] == 0:
        return [grads[name] for unit in res["units"] for name in unit]
    out = []
    for unit in res["units"]:
        flat = torch.cat([grads[name].reshape(-1) for name in unit])
        flat = torch.cat([flat, flat.new_zeros(-len(flat) % n)])
        out.append(flat.chunk(n)[rank])
    return out


def _scale(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got * want).sum() / (want * want).sum()) if want.abs().sum() else float("nan")


def _check_variant(variant: str, n: int) -> None:
    n = graded_size(n, 2, 4)
    per_rank = _numerics(n, variant)
    for tag, cfg in _configs():
        where = f"{NAMES[variant]} ({tag}) on {ranks_label(n)}"
        for rank, res in enumerate(per_rank):
            entry = res[(variant, tag)]
            raise_if_failed(entry, rank, n, where)
            grads, params = _reference(tag, cfg, n)     # (cached) only once a rank has results:
            got = entry["grads"]                        # a stub's verdict needs no training
            if got is None:
                raise AssertionError(f"rank {rank}: {where}: the optimizer never stepped "
                                     f"(call self.optimizer.step() in optimizer_step)")
            want = _expected_optimizer_inputs(variant, entry, grads, rank, n)
            names = [nm for unit in entry["units"] for nm in unit] if STAGE[variant] == 0 else \
                [f"layer {i} ({unit[0].rsplit('.', 2)[0]})" for i, unit in enumerate(entry["units"])]
            if len(got) != len(want):
                raise AssertionError(f"rank {rank}: {where}: the optimizer holds {len(got)} "
                                     f"tensors, expected {len(want)} ("
                                     + ("every parameter" if STAGE[variant] == 0 else
                                        "one shard per layer") + ")")
            for name, g, w in zip(names, got, want):
                if g is None or g.shape != w.shape or not torch.allclose(g, w, **TOL):
                    raise AssertionError(_gradient_message(rank, where, name, g, w, n, variant))
            for name, value in params.items():
                diff = how_far(entry["params"].get(name), value, **TOL)
                if diff:
                    raise AssertionError(
                        f"rank {rank}: {where}: after {STEPS} Adam steps {name} is {diff} from "
                        f"single-device training on the whole batch, though the first step's "
                        f"gradients were right: " + (
                            "check that each rank's Adam updates its own shard "
                            "(flat.data[flat.shard]) and that the all-gather brings every "
                            "rank's shard back to its place before the next forward pass"
                            if STAGE[variant] else "check what the optimizer steps"))


def _gradient_message(rank, where, name, got, want, n, variant) -> str:
    head = f"rank {rank}: {where}: on the first step the optimizer read a gradient of {name} "
    if got is None:
        return head + "that was None: every gradient must be in place when optimizer_step runs"
    if got.shape != want.shape:
        return head + f"of shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    s = _scale(got, want)
    if not torch.allclose(got, s * want, **TOL):
        s = float("nan")                             # not a multiple of the average
    if abs(s - 1 / n) < 1e-6:
        seen = f"equal to 1/{n} of the average: it was divided by n twice"
        fix = "divide either before the collective or after it, once"
    elif abs(s - n) < 1e-6:
        seen = f"{n} times the average: the sum over ranks, never divided by n"
        fix = "divide by n once, before or after the collective"
    else:
        seen = ("that is not the average of the ranks' gradients (the single-device gradient "
                "of the whole batch)")
        fix = "every gradient the optimizer reads must be the average over ranks"
    early = ("a bucket divided and all-reduced before all of its gradients were accumulated "
             "does this: start a bucket's all-reduce only when none of its gradients is missing")
    if variant == "bucketed" and abs(s - n) < 1e-6:
        fix = f"{fix}; if you do, {early}"
    elif variant == "bucketed" and s != s:
        fix = (f"{early}; so do gradients that are no longer views into their bucket's flat "
               f"buffer (zero the buffer in place before a step, never drop the gradients)")
    elif variant != "naive" and s != s:
        fix = ("start a layer's reduce-scatter only once all of its gradients are accumulated, "
               "and hand Adam the shard the reduce-scatter filled")
    return head + f"{seen}; {fix}"


@pytest.mark.points(2)
@pytest.mark.tasks("make_buckets")
def test_make_buckets():
    """Buckets in reverse order of use, none past the cap unless a lone parameter is larger."""
    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig, ReferenceModel
    lab = load_lab(LAB)
    cases = [("made-up sizes", [torch.nn.Parameter(torch.zeros(k)) for k in (3, 5, 2, 9, 1, 4)], 32),
             ("the reference model", list(ReferenceModel(ModelConfig(n_layers=2)).parameters()),
              BUCKET_BYTES)]
    for label, params, cap in cases:
        got = lab.make_buckets(params, cap)
        flat = [p for bucket in got for p in bucket]
        where = f"make_buckets on {label} (cap {cap} bytes)"
        if [id(p) for p in flat] != [id(p) for p in reversed(params)]:
            raise AssertionError(f"{where}: the buckets, read in order, must hold every parameter "
                                 f"once, in reverse order of use (backward makes the last "
                                 f"layer's gradients first)")
        for i, bucket in enumerate(got):
            size = sum(p.numel() * p.element_size() for p in bucket)
            if not bucket or (size > cap and len(bucket) > 1):
                raise AssertionError(f"{where}: bucket {i} holds {size} bytes in {len(bucket)} "
                                     f"parameters; a bucket stays within the cap unless one "
                                     f"parameter alone is larger")
            if i + 1 < len(got):
                nxt = got[i + 1][0]
                if size + nxt.numel() * nxt.element_size() <= cap:
                    raise AssertionError(f"{where}: bucket {i} closed at {size} bytes although "
                                         f"the next parameter would still fit under the cap")


PREDICTION_SETTINGS = (        # (model, bucket cap, ranks, link preset): n = 3 and 4 tell the
    # bus bytes from the payload (equal at n = 2); gpt's two embedding tables (token, position)
    # at a small cap fill two exposed buckets, llama's one table shares the last bucket; tables
    # of 0.25-2 MiB make the bandwidth term weigh as much as the latency
    (dict(style="gpt", hidden=128, vocab_size=4096), 32 << 10, 2, "dgx-h100"),
    (dict(style="llama", hidden=128, vocab_size=4096), 3 << 20, 4, "dgx-h100-ib"),
    (dict(style="gpt", hidden=64, vocab_size=1024), 8 << 10, 3, "pcie-h100"))
LOCAL_FLOPS = 5e10                           # a fixed calibration: the same link on every run


def _bucket_params(params, cap: int) -> list[list]:
    """The parameters, last first, in buckets of at most ``cap`` bytes (the grader's own
    bucketing: the prediction is graded whatever the lab's make_buckets does)."""
    buckets, size = [[]], 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if buckets[-1] and size + nbytes > cap:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes
    return buckets


def _prediction_settings():
    """Per graded setting: (link, buckets, the first layer's parameters, n, a label)."""
    from workbook.data_parallel import layer_units
    from workbook.link.cost_model import make_link
    from workbook.model import ModelConfig, ReferenceModel
    for shape, cap, n, preset in PREDICTION_SETTINGS:
        units = layer_units(ReferenceModel(ModelConfig(n_layers=2, **shape)))
        buckets = _bucket_params([p for u in units for p in u.parameters()], cap)
        lk = make_link(preset, local_flops=LOCAL_FLOPS)
        yield lk, buckets, list(units[0].parameters()), n, (
            f"on {n} ranks, {lk.label} (alpha {lk.latency_s * 1e3:.3g} ms, "
            f"{lk.bandwidth_Bps / 1e6:.3g} MB/s), {shape['style']} model in {len(buckets)} "
            f"buckets of at most {cap >> 10} KiB")


def _prediction_problem(predict) -> str | None:
    """The first setting on which ``predict`` (the lab's ``predict_exposed_ms``) misses the
    model, with the message naming the wrong term; None when it is right on all of them."""
    from workbook.data_parallel.dp_overlap_report import TAIL_TERMS, TAIL_WHAT, exposed_tail, \
        tail_buckets
    from workbook.grading.predictions import judge_prediction
    for lk, buckets, first, n, label in _prediction_settings():
        want, mistakes = exposed_tail(lk, *tail_buckets(buckets, first), n)
        got = predict(lk, [list(b) for b in buckets], list(first), n)
        message = judge_prediction(got, want, mistakes, what=TAIL_WHAT, terms=TAIL_TERMS)
        if message:
            return f"predict_exposed_ms {label}: {message}"
    return None


@pytest.mark.points(2)
@pytest.mark.tasks("predict_exposed_ms")
def test_predict_exposed_ms():
    """The exposed tail of bucketed DP, predicted from the link's alpha and beta: right on every
    setting, a classic wrong derivation named by the term it got wrong."""
    from workbook.grading.labs import load_lab
    from workbook.grading.predictions import reads_the_model
    predict = load_lab(LAB).predict_exposed_ms
    problem = reads_the_model(predict, ("exposed_tail", "tail_buckets", "dp_overlap_report")) \
        or _prediction_problem(predict)
    if problem:
        raise AssertionError(problem)


def _numbers_test(points: float, task: str, variants: tuple, doc: str):
    """The numerics test of ``variants`` (each run on its own, in turn) on 2 and 4 ranks."""
    @pytest.mark.points(points)
    @pytest.mark.tasks(task)
    @pytest.mark.parametrize("n", [2, 4])
    def test(n):
        for variant in variants:
            _check_variant(variant, n)
    test.__doc__ = doc
    return test


test_naive_dp = _numbers_test(1, "NaiveDP", ("naive",), "Naive DP: the averaged gradient, and "
                              "after 3 steps the single-device parameters.")
test_bucketed_dp = _numbers_test(1.5, "BucketedDP", ("bucketed",), "Bucketed DP: the same numbers "
                                 "as one device, buckets of 32 KiB.")
test_zero_1_and_2 = _numbers_test(2, "ShardedTrainer", ("zero1", "zero2"), "ZeRO-1 and ZeRO-2: "
                                  "each rank's shard of the averaged gradient, the same "
                                  "parameters.")
test_zero3 = _numbers_test(2, "Zero3", ("zero3",), "ZeRO-3: the same numbers with parameters "
                           "sharded at rest.")
NUMBERS_TEST = {"naive": "naive_dp", "bucketed": "bucketed_dp", "zero1": "zero_1_and_2",
                "zero2": "zero_1_and_2", "zero3": "zero3"}     # the numerics check of a variant


def _numbers_first(variant: str) -> None:
    """The traffic and overlap of ``variant`` earn points only once its own numbers are right
    (on 2 and 4 ranks; the run its numerics test made is read again, and a variant once found
    right is not compared again: its run is cached, so the verdict cannot change)."""
    def numbers():
        for n in (2, 4):
            _check_variant(variant, n)
    numbers_first(numbers, NUMBERS_TEST[variant], once=("dp_overlap", variant))


@pytest.mark.points(1)
@pytest.mark.tasks("ShardedTrainer", "Zero3")
@pytest.mark.parametrize("n", [2, 4])
def test_memory_per_rank(n):
    """What a ZeRO rank holds between steps, measured from its storages, equals the ZeRO
    table (``workbook.data_parallel.predicted_memory``)."""
    from workbook.data_parallel import KINDS, predicted_memory
    from workbook.model import parameter_shapes
    n = graded_size(n, 2, 4)
    tag, cfg = _configs()[0]
    shapes = parameter_shapes(cfg)
    for variant in ("zero1", "zero2", "zero3"):
        for rank, res in enumerate(_numerics(n, variant)):
            entry = res[(variant, tag)]
            raise_if_failed(entry, rank, n, f"{NAMES[variant]} ({tag})")
            numels = [sum(torch.Size(shapes[name]).numel() for name in unit) for unit in entry["units"]]
            want = predicted_memory(numels, n, STAGE[variant], entry["element_bytes"])
            for kind in KINDS:
                if entry["memory"][kind] != want[kind]:
                    raise AssertionError(_memory_message(rank, n, variant, kind,
                                                         entry["memory"][kind], want[kind]))


def _memory_message(rank, n, variant, kind, got, want) -> str:
    formula = {("parameters", 3): "Psi/n: only this rank's shards (free each layer's flat "
                                  "buffer after use: flat.free_params())",
               ("gradients", 2): "Psi/n: free each layer's full gradient once its "
                                 "reduce-scatter is done (flat.free_grads())",
               ("gradients", 3): "Psi/n: free each layer's full gradient once its "
                                 "reduce-scatter is done (flat.free_grads())",
               ("optimizer", 1): "2 Psi/n: Adam over this rank's shards only"}
    stage = STAGE[variant]
    why = formula.get((kind, stage), formula.get((kind, min(stage, 3)), ""))
    if kind == "optimizer" and stage:
        why = "2 Psi/n: Adam over this rank's shards only"
    return (f"rank {rank}: {NAMES[variant]} on {ranks_label(n)} holds {got / 1e6:.3f} MB of "
            f"{kind} between steps (measured from its storages); the ZeRO-{stage} table says "
            f"{want / 1e6:.3f} MB" + (f" = {why}" if why else ""))


def _check_traffic(variant: str, trace_root) -> None:
    """One steady-state step of ``variant`` on 2 and on 3 ranks, from the trace: the
    collectives of each pass, their number and bytes, against the lesson's formulas; graded only
    once the variant's numbers are right."""
    _numbers_first(variant)
    for n in world_sizes(2, 3):
        per_rank = on_ranks(n, _run_traffic, str(trace_root / f"traffic{n}"), variant,
                            link=simulated_link(n, LINK), timeout=TIMEOUT_S,
                            key=("traffic", variant, n, str(trace_root)))
        for rank, res in enumerate(per_rank):
            r = res[variant]
            raise_if_failed(r, rank, n, f"one traced step of {NAMES[variant]}")
            if variant == "bucketed" and not r["buckets"]:
                raise AssertionError(f"rank {rank}: BucketedDP on {ranks_label(n)} has no "
                                     f"buckets: its spec keeps them, as flat buffers in bucket "
                                     f"order, in the trainer's `buckets`")
            b, units = r["element_bytes"], r["units"]
            padded = [-(-u // n) * n * b for u in units]
            psi, L = sum(r["params"]) * b, len(units)
            zero12 = {"forward": {"all_gather": (L - 1, sum(padded[1:]))},
                      "backward": {"reduce_scatter": (L, sum(padded))},
                      "optimizer": {"all_gather": (1, padded[0])}}
            want = {"naive": {"backward": {"all_reduce": (len(r["params"]), psi)}},
                    "bucketed": {"backward": {"all_reduce": (r["buckets"], psi)}},
                    "zero1": zero12, "zero2": zero12,
                    "zero3": {"forward": {"all_gather": (L, sum(padded))},
                              "backward": {"all_gather": (L - 1, sum(padded[:-1])),
                                           "reduce_scatter": (L, sum(padded))}}}[variant]
            for phase in ("forward", "backward", "optimizer"):
                got, expected = r["phases"][phase], want.get(phase, {})
                for op in sorted((set(got) | set(expected)) - {"barrier"}):
                    count, nbytes = expected.get(op, (0, 0))
                    have = got.get(op, {"count": 0, "bytes": 0})
                    if have["count"] != count or (have["bytes"] is not None
                                                  and have["bytes"] != nbytes):
                        raise AssertionError(
                            f"rank {rank}: {NAMES[variant]} on {ranks_label(n)}, one step, "
                            f"{phase} pass (from the trace): {have['count']} {op} moving "
                            f"{have['bytes']} bytes, expected {count} moving {nbytes} bytes; "
                            + _TRAFFIC_HINTS[variant])


def _traffic_test(variant: str, task: str):
    @pytest.mark.points(0.6)
    @pytest.mark.tasks(task)
    def test(trace_root):
        """The collectives of one step, counted and sized from the trace (2 and 3 ranks)."""
        _check_traffic(variant, trace_root)
    return test


_TRAFFIC_HINTS = {
    "naive": "naive DP all-reduces each parameter's gradient once, after backward",
    "bucketed": "one all-reduce per bucket, each of its flat gradient buffer, during backward",
    "zero1": "each layer's gradients are reduce-scattered once (backward); its parameters are "
             "all-gathered once per step: the first layer's at the end of the optimizer step, "
             "every other one layer ahead, in the next forward pass",
    "zero2": "each layer's gradients are reduce-scattered once (backward); its parameters are "
             "all-gathered once per step: the first layer's at the end of the optimizer step, "
             "every other one layer ahead, in the next forward pass",
    "zero3": "forward gathers every layer, backward every layer but the last (kept from the "
             "forward pass) and reduce-scatters each layer's gradients once"}


# --------------------------------------------------------------------------- overlap
def _structure(variant: str, r: dict, phases) -> str | None:
    """The first structural mistake in ``phases``, read from the link's op log, or None."""
    where = f"rank {r['rank']}: {NAMES[variant]} (2 ranks, {r['link']})"
    for phase in phases:
        p = r[phase]
        if p["never_waited"]:
            return (f"{where}: {', '.join(p['never_waited'])} issued in the {phase} pass never "
                    f"waited on: until work.wait() returns, its buffer need not be complete")
        if variant == "bucketed" and phase == "backward" and r["late_bytes"] > r["largest"]:
            return (f"{where}: {r['late_bytes'] / 1e6:.2f} MB of the {r['all_reduce_bytes'] / 1e6:.2f} "
                    f"MB all-reduced were issued only after the last gradient was ready, more "
                    f"than one bucket: a bucket's all-reduce should start from the hook that "
                    f"completes it, and the buckets, in reverse order of use, complete one after "
                    f"another during backward")
        if p["scatters_at_once"] > EXPOSED_SCATTERS:
            return (f"{where}: {p['scatters_at_once']} of the {phase} pass's {p['scatters']} "
                    f"reduce-scatters were waited on right after they started, before any compute "
                    f"could hide them; start each layer's reduce-scatter as soon as its gradients "
                    f"are accumulated and wait for them all only after backward")
        if p["at_once"] > EXPOSED_GATHERS:
            return (f"{where}: {p['at_once']} of the {phase} pass's {p['gathers']} all-gathers were "
                    f"waited on right after they started, before any compute could hide them; "
                    f"start layer i + 1's gather before layer i runs"
                    + (" (i - 1's in backward)" if phase == "backward" else "")
                    + " and wait for it only when its own layer is about to run")
    return None


ADVICE = {("bucketed", "backward"): "start each bucket's all-reduce from the gradient hook that "
                                    "completes it, and wait for them all only after backward",
          ("zero2", "forward"): "start the first layer's all-gather at the end of the optimizer "
                                "step and each next layer's before the current one runs",
          ("zero2", "backward"): "start each layer's reduce-scatter as soon as its gradients are "
                                 "accumulated; wait only after backward",
          ("zero3", "forward"): "start layer i + 1's all-gather before layer i runs; wait for it "
                                "in layer i + 1's pre-hook",
          ("zero3", "backward"): "start layer i - 1's all-gather before layer i's backward and "
                                 "each reduce-scatter as soon as the layer's gradients are ready"}
OVERLAP = {v: OverlapCheck(_overlap, limits, functools.partial(_structure, v),
                           where=f"{NAMES[v]} (2 ranks, {{link}})",
                           what="the link time issued in the {phase} pass",
                           advice={ph: ADVICE[(v, ph)] for ph in limits}, link=LINK,
                           timeout=TIMEOUT_S, failed=f"the overlap run of {NAMES[v]}", args=(v,))
           for v, limits in THRESHOLDS.items()}


def _check_structure_first(variant: str) -> None:
    """The structure of ``variant``'s overlap on the small model (``_structure_run``: program
    order, counted in about a second), before its overlap run measures the wide one: a rank that
    raised, then the first structural mistake (``_structure``), fails here."""
    n, = world_sizes(2)
    res = on_ranks(n, _structure_run, variant, link=LINK, timeout=TIMEOUT_S,
                   key=("structure", variant))
    for r in res:
        raise_if_failed(r, r["rank"], len(res), OVERLAP[variant].failed)
        problem = _structure(variant, r, tuple(THRESHOLDS[variant]))
        if problem:
            raise AssertionError(problem)


trace_root = trace_root_fixture("dp_overlap_traces")
test_traffic_naive = _traffic_test("naive", "NaiveDP")
test_traffic_bucketed = _traffic_test("bucketed", "BucketedDP")
test_traffic_zero1 = _traffic_test("zero1", "ShardedTrainer")
test_traffic_zero2 = _traffic_test("zero2", "ShardedTrainer")
test_traffic_zero3 = _traffic_test("zero3", "Zero3")


@pytest.mark.points(3)
@pytest.mark.tasks("BucketedDP")
def test_bucketed_all_reduce_hidden(trace_root):
    """Bucketed DP: each bucket issued as soon as it is complete; at least 40% of the
    all-reduce time hidden behind the backward pass. Graded once its numbers are right."""
    _numbers_first("bucketed")
    _check_structure_first("bucketed")
    OVERLAP["bucketed"].check(trace_root)


@pytest.mark.points(3)
@pytest.mark.tasks("ShardedTrainer")
def test_zero2_traffic_hidden(trace_root):
    """ZeRO-2: the reduce-scatters hidden behind backward (50%), the parameter all-gathers
    behind the next forward pass (30%: the first block's is exposed behind the embedding).
    Graded once ZeRO-2's numbers are right."""
    _numbers_first("zero2")
    _check_structure_first("zero2")
    OVERLAP["zero2"].check(trace_root)


@pytest.mark.points(4)
@pytest.mark.tasks("Zero3")
def test_zero3_gathers_hidden(trace_root):
    """ZeRO-3: one-layer prefetch hides the all-gathers, forward (30%) and backward (50%).
    Graded once ZeRO-3's numbers are right."""
    _numbers_first("zero3")
    _check_structure_first("zero3")
    OVERLAP["zero3"].check(trace_root)
