"""The reduce operations the point-to-point builds of labs 1 and 2 support, and how to apply one.

Given code (not learner work): ``solutions/collectives.py`` and ``solutions/ring_allreduce.py``
import it, so each lab page shows one line instead of a copy of the same helper.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

SUM, MAX, MIN = dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN


def combine(acc: torch.Tensor, other: torch.Tensor, op=SUM) -> torch.Tensor:
    """``acc <- acc (op) other`` elementwise, in place; ``op`` is SUM, MAX or MIN."""
    if op == SUM:
        return acc.add_(other)
    if op == MAX:
        return torch.maximum(acc, other, out=acc)
    if op == MIN:
        return torch.minimum(acc, other, out=acc)
    raise ValueError(f"unsupported reduce op {op}: use dist.ReduceOp.SUM, MAX or MIN")
