# Generated from solutions/ring_allreduce.py by `workbook assign` (level: standard): this is your file to edit.
# Replace each `raise NotImplementedError` with your code; check it with `workbook run ring_allreduce`
# (or `workbook watch ring_allreduce`). Stuck on task N? `workbook hint ring_allreduce N`, one hint at a time.
#
# Your tasks (18 pts in all):
#   1. ring_reduce_scatter (4 pts): Phase 1, the ring reduce-scatter: afterwards the chunk that
#      lesson 2 says rank r completes, (r + 1) mod n, holds on this rank the reduction (sum, max or
#      min, as asked) of that chunk over every rank; return its index.
#   2. ring_all_gather (3 pts): Phase 2, the ring all-gather: starting from a rank whose only
#      finished chunk is the one phase 1 completed on it, (r + 1) mod n, afterwards every chunk on
#      every rank holds its finished value.
#   3. ring_all_reduce (8 pts): All-reduce a tensor in place with the ring, phase 1 then phase 2;
#      return it.
#   4. naive_time (0.75 pts): The modelled time of lesson 1's naive all-reduce: a naive reduce to a
#      root, then a naive broadcast from it, the root handling one message at a time.
#   5. tree_time (0.75 pts): The modelled time of lesson 1's tree all-reduce: a binomial-tree
#      reduce, then a binomial-tree broadcast.
#   6. ring_time (0.75 pts): The modelled time of your ring all-reduce (both phases).
#   7. crossover_bytes (0.75 pts): The tensor size, in bytes, above which your modelled ring beats
#      your modelled tree (below it the tree is faster).
"""Lab 2 -- ring all-reduce: reduce-scatter around a ring, then all-gather around it.

You build the bandwidth-optimal all-reduce from point-to-point messages: its two phases, the
whole ring for any world size and any number of elements, then the alpha-beta cost model that
says when the ring beats the trees of lab 1. Lesson 2 (``lessons/02_ring_allreduce.py``)
explains the ring (its introduction and "Step through the ring") and the cost model ("The
alpha–beta model"); the ring follows Patarasuk & Yuan, "Bandwidth optimal all-reduce
algorithms for clusters of workstations", JPDC 2009. Each task's docstring below is its spec;
``workbook hint ring_allreduce N`` shows hints for task N, one at a time.

Run it: ``workbook run ring_allreduce`` (the checks, then your ring's algbw/busbw beside the
built-in), ``python labs/ring_allreduce.py --nproc 3 [--link dgx-h100]`` or ``torchrun
--nproc_per_node=4 labs/ring_allreduce.py``. Grade it: ``workbook grade --lab ring_allreduce``.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from workbook.communication.reduce_ops import SUM, combine   # given: combine(acc, other, op): acc <- acc (op) other


# --------------------------------------------------------------------------- helpers (given)
def neighbours() -> tuple[int, int]:
    """``(left, right)``: the rank this one receives from and the rank it sends to."""
    rank, n = dist.get_rank(), dist.get_world_size()
    return (rank - 1) % n, (rank + 1) % n


# --------------------------------------------------------------------------- the ring
def ring_reduce_scatter(chunks, op=SUM) -> int:
    """Phase 1, the ring reduce-scatter: afterwards the chunk that lesson 2 says rank r
    completes, (r + 1) mod n, holds on this rank the reduction (sum, max or min, as asked) of
    that chunk over every rank; return its index.

    Lesson 2, phase 1 of its introduction and the reduce-scatter steps of "Step through the
    ring". Contract: the chunks are the n views of one tensor (sizes differ by at most one
    element, the first ones the largest; some may be empty), reduced in place, and the other
    chunks may end holding anything; n - 1 steps, in each of which a rank sends exactly one
    chunk to its right neighbour and receives one from its left (the given helper above names
    both); non-blocking sends and receives only (the grader counts them); a single scratch
    buffer for the whole phase, no allocation per step; reductions with the given combiner."""
    rank, n = dist.get_rank(), dist.get_world_size()
    left, right = neighbours()
    raise NotImplementedError("not implemented yet: ring_allreduce.ring_reduce_scatter")


def ring_all_gather(chunks) -> None:
    """Phase 2, the ring all-gather: starting from a rank whose only finished chunk is the one
    phase 1 completed on it, (r + 1) mod n, afterwards every chunk on every rank holds its
    finished value.

    Lesson 2, phase 2 of its introduction and the all-gather steps of "Step through the ring".
    Contract: the chunks as in phase 1, the unfinished ones holding anything to begin with;
    n - 1 steps, in each of which a rank sends exactly one chunk to its right neighbour and
    receives one from its left; non-blocking sends and receives only; received chunks land
    straight in their views of the tensor (no scratch buffer)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    left, right = neighbours()
    raise NotImplementedError("not implemented yet: ring_allreduce.ring_all_gather")


def ring_all_reduce(tensor: torch.Tensor, op=SUM) -> torch.Tensor:
    """All-reduce a tensor in place with the ring, phase 1 then phase 2; return it.

    Lesson 2, its introduction. Contract: any shape, any number of elements K (fewer than n,
    or not divisible by n, included), contiguous or not; any reduction the phases take; with
    one rank nothing is sent. The tensor is cut into n chunks as lesson 1 cuts a buffer for
    the all-gather ("Direct exchange": the first K mod n chunks one element longer), so every
    message carries one chunk: exactly 2(n - 1) non-blocking sends per rank, all to the right
    neighbour, each of floor(K/n) or ceil(K/n) elements, and receives only from the left (the
    grader checks all of it, and fails a ring that calls a collective)."""
    n = dist.get_world_size()
    raise NotImplementedError("not implemented yet: ring_allreduce.ring_all_reduce")
    return tensor


# --------------------------------------------------------------------------- the cost model
# Every time below is in seconds: one message of m bytes costs alpha + m / beta, with alpha the
# latency (seconds) and beta the link's bandwidth (bytes per second), as in lesson 2, "The
# alpha–beta model"; the size is the whole tensor's, in bytes, and n the number of ranks.
def naive_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """The modelled time of lesson 1's naive all-reduce: a naive reduce to a root, then a
    naive broadcast from it, the root handling one message at a time.

    Lesson 1, "What each build costs", and lesson 2, "The alpha–beta model". Contract: the
    time in seconds, for any n >= 1 (0 for one rank)."""
    raise NotImplementedError("not implemented yet: ring_allreduce.naive_time")


def tree_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """The modelled time of lesson 1's tree all-reduce: a binomial-tree reduce, then a
    binomial-tree broadcast.

    Lesson 2, "The alpha–beta model" (the tree), and lesson 1, "Trees: ⌈log2 n⌉ rounds".
    Contract: the time in seconds, for any n >= 1 (0 for one rank)."""
    raise NotImplementedError("not implemented yet: ring_allreduce.tree_time")


def ring_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """The modelled time of your ring all-reduce (both phases).

    Lesson 2, "The alpha–beta model". Contract: the time in seconds, for any n >= 1 (0 for one
    rank); chunks taken as S / n bytes each."""
    raise NotImplementedError("not implemented yet: ring_allreduce.ring_time")


def crossover_bytes(n: int, alpha: float, beta: float) -> float:
    """The tensor size, in bytes, above which your modelled ring beats your modelled tree
    (below it the tree is faster).

    Lesson 2, "The alpha–beta model", the paragraph on where the curves cross. Contract: 0.0
    when the ring is never slower than the tree, whatever the size; positive infinity (a
    float) when it is never faster."""
    raise NotImplementedError("not implemented yet: ring_allreduce.crossover_bytes")


def bus_bandwidth(size_bytes: float, seconds: float, n: int) -> float:
    """nccl-tests' all-reduce bus bandwidth (bytes/s): (S / t) * 2(n-1)/n."""
    return size_bytes / seconds * 2 * (n - 1) / n if n > 1 else 0.0


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
