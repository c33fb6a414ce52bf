"""``workbook plan``: a training step of a 4D split predicted from the course's formulas.

One GPU computes at ``R = efficiency x peak``. Per layer and micro-batch of ``b`` sequences
(``T = b s / CP`` tokens on a GPU; ``plan_flops`` for the counts)::

    t_lin = 2 T P_layer / (TP R)          the GEMMs, forward
    t_att = 2 b s^2 h / (CP TP R)         causal attention's two products, forward: one CP
                                          rank's share (the zig-zag split balances it)
    forward = t_lin + t_att,  backward = 2 x forward   (+ what ``recompute`` runs again: the
    MLP's GEMMs for ``selective``, the whole forward and its TP/CP traffic for ``full``)

Each communication (``plan_comm``) is exposed whole when its overlap is off; when on, it hides
behind the compute lab ``overlap_math`` pairs it with, and only the excess shows:
``exposed = max(0, comm - compute)``: TP's collectives behind the layer's GEMMs (labs
``tp_overlap``, ``domino``), CP's K/V exchange behind attention (``cp_ring``), the gradient
reduce-scatter behind the last micro-batch's backward and the weight all-gather behind the first
forward (``dp_overlap``), each p2p send behind a chunk's forward (``pp_overlap``; the ``p - 1``
sends that fill and drain the pipeline always show).

The pipeline (labs ``pp_overlap``, ``pp_schedules``): with ``m`` micro-batches, ``v`` chunks per
GPU and ``t_c`` the slowest stage's time per micro-batch and chunk, 1F1B and interleaved 1F1B
take ``(v m + p - 1) t_c``: a bubble of ``(p - 1) / (v m + p - 1)`` (Narayanan et al. 2021,
arXiv 2104.04473). The step::

    step = (v m + p - 1) t_c + exposed PP + exposed DP
    TFLOP/s per GPU = F_step / (step x GPUs),   MFU = TFLOP/s / peak

``fit_efficiency`` finds the efficiency that makes the prediction equal a measured TFLOP/s, so
one published row calibrates the kernels and the others are predicted (docs/plan-llama3.md).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from workbook.capstone.plan_comm import comm_times
from workbook.capstone.plan_flops import (attention_flops, head_params, layer_params,
                                          linear_flops, mlp_params, model_flops_per_token)
from workbook.capstone.plan_memory import Memory, memory_per_gpu, stage_layers
from workbook.capstone.plan_shapes import (Cluster, Model, PlanError, Split, micro_batches,
                                           resolve)


@dataclass(frozen=True)
class Prediction:
    """One split's step: seconds by part (they add up to ``step_s``), throughput, memory."""
    split: Split
    step_s: float
    parts: dict                  # compute, tp, cp, bubble, pp, dp: seconds of the step
    comm: dict                   # tp, cp, pp, dp: seconds of communication in all (hidden or not)
    tflops: float                # model TFLOP/s per GPU
    mfu: float
    memory: Memory

    def to_json(self) -> dict:
        s = self.split
        return {"split": {"tp": s.tp, "cp": s.cp, "pp": s.pp, "dp": s.dp, "virtual": s.virtual,
                          "micro_batch": s.micro_batch, "global_batch": s.global_batch,
                          "micro_batches": micro_batches(s), "zero": s.zero,
                          "recompute": s.recompute, "overlaps": sorted(s.overlaps)},
                "step_s": self.step_s, "tflops_per_gpu": self.tflops, "mfu": self.mfu,
                "bubble": bubble_fraction(s.pp, micro_batches(s), s.virtual),
                "parts_s": self.parts, "comm_s": self.comm, "memory": self.memory.to_json()}


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """``(p - 1) / (v m + p - 1)``: the share of an (interleaved) 1F1B step a stage idles."""
    return (p - 1) / (v * m + p - 1)


def hidden(comm: float, compute: float, on: bool) -> float:
    """What of ``comm`` shows: all of it without overlap, the excess over ``compute`` with."""
    return max(0.0, comm - compute) if on else comm


def predict(model: Model, cluster: Cluster, split: Split) -> Prediction:
    """The step of ``split`` on ``cluster`` (module docstring); ``PlanError`` for a broken rule."""
    split = resolve(model, cluster, split)
    rate, tp, cp, m, v, p = cluster.flops, split.tp, split.cp, micro_batches(split), \
        split.virtual, split.pp
    tokens = split.micro_batch * model.seq / cp
    lin = linear_flops(tokens, layer_params(model)) / tp / rate
    att = attention_flops(split.micro_batch, model.seq, model) / (cp * tp) / rate
    fwd = lin + att
    redo = {"none": 0.0, "selective": linear_flops(tokens, mlp_params(model)) / tp / rate,
            "full": fwd}[split.recompute]
    layers = stage_layers(model, split)
    stage_params = [n * layer_params(model) / tp + head_params(model) / tp *
                    ((i == 0) + (i == p - 1)) for i, n in enumerate(layers)]
    c = comm_times(model, cluster, split, max(stage_params))
    exp_tp = hidden(c.tp_fwd, lin, split.on("tp")) + hidden(c.tp_bwd, 2 * lin, split.on("tp"))
    exp_cp = hidden(c.cp_fwd, att, split.on("cp")) + hidden(c.cp_bwd, 2 * att, split.on("cp"))
    if split.recompute == "full":            # the forward runs again, its comm with it
        exp_tp += hidden(c.tp_fwd, lin, split.on("tp"))
        exp_cp += hidden(c.cp_fwd, att, split.on("cp"))
    head = 3 * linear_flops(tokens, head_params(model)) / tp / rate
    per_layer = {"compute": 3 * fwd + redo, "tp": exp_tp, "cp": exp_cp}
    stage = [{k: n * t for k, t in per_layer.items()} for n in layers]
    stage[-1]["compute"] += head
    slow = max(stage, key=lambda d: sum(d.values()))
    t_stage = sum(slow.values())                  # one micro-batch through the slowest stage
    t_chunk = t_stage / v
    fwd_stage = max(layers) * fwd                 # one micro-batch's forward through a stage
    parts = {k: m * t for k, t in slow.items()}
    parts["bubble"] = (p - 1) * t_chunk
    if p > 1:
        steady = v * m * 2 * hidden(c.p2p, t_chunk / 3, True)   # a chunk's forward is 1/3 of it
        parts["pp"] = (p - 1) * 2 * c.p2p + steady if split.on("pp") else \
            (v * m + p - 1) * 2 * c.p2p
    else:
        parts["pp"] = 0.0
    bwd_stage, on_dp = 2 * fwd_stage, split.on("dp")
    if split.zero == 3:                           # every micro-batch gathers and reduces
        parts["dp"] = m * (hidden(c.dp_params, fwd_stage, on_dp)
                           + hidden(c.dp_params + c.dp_grads, bwd_stage, on_dp))
        dp_total = m * (2 * c.dp_params + c.dp_grads)
    else:
        parts["dp"] = hidden(c.dp_grads, bwd_stage, on_dp) + hidden(c.dp_params, fwd_stage, on_dp)
        dp_total = c.dp_grads + c.dp_params
    step = sum(parts.values())
    flops = split.global_batch * model.seq * model_flops_per_token(model)
    tflops = flops / (step * cluster.gpus) / 1e12
    n_slow = max(layers)
    comm = {"tp": m * n_slow * (c.tp_fwd + c.tp_bwd + (c.tp_fwd if split.recompute == "full"
                                                       else 0)),
            "cp": m * n_slow * (c.cp_fwd + c.cp_bwd), "pp": (v * m + p - 1) * 2 * c.p2p
            if p > 1 else 0.0, "dp": dp_total}
    return Prediction(split, step, parts, comm, tflops, tflops / cluster.peak_tflops,
                      memory_per_gpu(model, cluster, split))


def fit_efficiency(model: Model, cluster: Cluster, split: Split, tflops: float) -> float:
    """The kernel efficiency at which ``predict`` gives ``tflops`` TFLOP/s per GPU (bisection:
    the prediction grows with the efficiency)."""
    top = predict(model, replace(cluster, efficiency=1.0), split).tflops
    if not 0 < tflops <= top:
        raise PlanError(f"{tflops:g} TFLOP/s per GPU is out of reach: this split predicts at most "
                        f"{top:.0f} at the full peak (efficiency 1)")
    lo, hi = 1e-4, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if predict(model, replace(cluster, efficiency=mid), split).tflops < tflops:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
