"""``workbook plan --search``: every split the rules allow, ranked by predicted TFLOP/s per GPU.

The candidates: TP, CP and PP each a divisor of the GPU count, DP the GPUs left, and ``v`` from 1
up to ``max_virtual`` (powers of two); the micro-batch, global batch, ZeRO stage, recompute and
overlaps stay as asked. A candidate that breaks a rule of ``plan_shapes`` (TP not dividing the KV
heads, layers not splitting into ``PP x v`` chunks, a batch that DP cannot share) is skipped and
counted; one that breaks none is predicted (``plan.predict``). Those that fit in the GPU's memory
are ranked by TFLOP/s per GPU (the same GPUs and the same batch, so also by step time); those
that do not are kept apart with how much they overshoot and which term dominates.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from workbook.capstone.plan import Prediction, predict
from workbook.capstone.plan_shapes import Cluster, Model, PlanError, Split


@dataclass(frozen=True)
class SearchResult:
    fitting: list                # Prediction, best first
    too_big: list                # Prediction, least over first
    skipped: int                 # candidates a rule ruled out


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(cluster: Cluster, split: Split, max_virtual: int = 8):
    """Every ``(tp, cp, pp, v)`` mesh of the cluster's GPUs, ``split``'s other settings kept."""
    gpus = cluster.gpus
    for tp in divisors(gpus):
        for cp in divisors(gpus // tp):
            for pp in divisors(gpus // (tp * cp)):
                v = 1
                while v <= (max_virtual if pp > 1 else 1):
                    yield replace(split, tp=tp, cp=cp, pp=pp, dp=0, virtual=v)
                    v *= 2


def search(model: Model, cluster: Cluster, split: Split, max_virtual: int = 8) -> SearchResult:
    """The module docstring's ranking. ``split.global_batch`` must be set (sequences): the
    search compares splits on the same batch."""
    fitting, too_big, skipped = [], [], 0
    for cand in candidates(cluster, split, max_virtual):
        try:
            pred: Prediction = predict(model, cluster, cand)
        except PlanError:
            skipped += 1
            continue
        (fitting if pred.memory.fits else too_big).append(pred)
    fitting.sort(key=lambda p: -p.tflops)
    too_big.sort(key=lambda p: p.memory.total)
    return SearchResult(fitting, too_big, skipped)
