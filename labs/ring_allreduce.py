# Generated from solutions/ring_allreduce.py by `workbook assign`: this is your file to edit.
# Replace each `raise NotImplementedError` with your code, then grade it with
#     workbook grade --lab ring_allreduce
#
# Your tasks (18 pts in all):
#   1. ring_reduce_scatter (4 pts): Phase 1 on `chunks` (n views of the tensor, changed in place);
#      return the index of the chunk this rank now holds fully reduced, (rank + 1) % n.
#   2. ring_all_gather (3 pts): Phase 2: starting from chunk (rank + 1) % n, pass the finished
#      chunks around the ring so that every rank ends with all n.
#   3. ring_all_reduce (8 pts): All-reduce `tensor` in place (any shape, any number of elements);
#      return it.
#   4. naive_time (0.75 pts): Seconds for reduce-to-root then broadcast-from-root, the root
#      handling one message at a time: 2(n-1) messages of the whole tensor.
#   5. tree_time (0.75 pts): Seconds for a binomial tree reduce plus tree broadcast: 2 ceil(log2 n)
#      rounds of the whole tensor.
#   6. ring_time (0.75 pts): Seconds for the ring: 2(n-1) steps, each moving one chunk of
#      size_bytes / n.
#   7. crossover_bytes (0.75 pts): The size above which the ring beats the tree (0: always; inf:
#      never).
"""Lab 2 -- ring all-reduce: reduce-scatter around a ring, then all-gather around it.

Lesson 2 explains it (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 2009). The ranks stand in a circle: rank r only sends to r+1 and receives
from r-1 (mod n). The tensor is cut into n chunks (``torch.tensor_split``), one chunk moves per
rank per step: n-1 steps that reduce every chunk onto one rank, then n-1 steps that pass the
reduced chunks around. Per rank that is 2(n-1) messages of about K/n elements, the lower bound for
an all-reduce, which is why nccl-tests reports busbw = (S / t) * 2(n-1)/n. The alpha-beta cost
model then tells when the ring beats a tree (``crossover_bytes``): work out each cost yourself.

Run it: ``workbook run ring_allreduce`` (the checks, then your ring's algbw/busbw beside the
built-in), ``python labs/ring_allreduce.py --nproc 3 [--link dgx-h100]`` or ``torchrun
--nproc_per_node=4 labs/ring_allreduce.py``.
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


# --------------------------------------------------------------------------- the two phases
def ring_reduce_scatter(chunks, op=SUM) -> int:
    """Phase 1 on ``chunks`` (n views of the tensor, changed in place); return the index of
    the chunk this rank now holds fully reduced, (rank + 1) % n.

    Use ``dist.isend`` / ``dist.irecv`` (the grader counts them): n-1 sends per rank.
    Receive into one preallocated scratch buffer (sized like ``chunks[0]``, the largest),
    then combine it into the chunk it belongs to."""
    rank, n = dist.get_rank(), dist.get_world_size()
    left, right = neighbours()
    # TODO: what moves in step 0 (you send, your left sends you), and how do both indices shift per
    #       step?
    raise NotImplementedError("not implemented yet: ring_allreduce.ring_reduce_scatter")


def ring_all_gather(chunks) -> None:
    """Phase 2: starting from chunk (rank + 1) % n, pass the finished chunks around the ring
    so that every rank ends with all n. n-1 isends per rank; receive straight into the
    chunk views (the tensor itself), no scratch buffer needed."""
    rank, n = dist.get_rank(), dist.get_world_size()
    left, right = neighbours()
    # TODO: send the finished chunk you hold, receive the one your left held; how do both shift per
    #       step?
    raise NotImplementedError("not implemented yet: ring_allreduce.ring_all_gather")


def ring_all_reduce(tensor: torch.Tensor, op=SUM) -> torch.Tensor:
    """All-reduce ``tensor`` in place (any shape, any number of elements); return it."""
    n = dist.get_world_size()
    # TODO: chunk a flat view as the lab docstring says, run both phases; mind n == 1 and
    #       non-contiguous input
    raise NotImplementedError("not implemented yet: ring_allreduce.ring_all_reduce")
    return tensor


# --------------------------------------------------------------------------- the cost model
def naive_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """Seconds for reduce-to-root then broadcast-from-root, the root handling one message at
    a time: 2(n-1) messages of the whole tensor."""
    # TODO: count the messages; each pays the latency plus its bytes' time on the link
    raise NotImplementedError("not implemented yet: ring_allreduce.naive_time")


def tree_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """Seconds for a binomial tree reduce plus tree broadcast: 2 ceil(log2 n) rounds of the
    whole tensor."""
    # TODO: as naive_time, but count rounds; how many does one rank alone need?
    raise NotImplementedError("not implemented yet: ring_allreduce.tree_time")


def ring_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """Seconds for the ring: 2(n-1) steps, each moving one chunk of size_bytes / n."""
    # TODO: one message per step; how many bytes does each carry?
    raise NotImplementedError("not implemented yet: ring_allreduce.ring_time")


def crossover_bytes(n: int, alpha: float, beta: float) -> float:
    """The size above which the ring beats the tree (0: always; inf: never)."""
    # TODO: solve ring_time == tree_time for the size; when does the ring always or never win?
    raise NotImplementedError("not implemented yet: ring_allreduce.crossover_bytes")


def bus_bandwidth(size_bytes: float, seconds: float, n: int) -> float:
    """nccl-tests' all-reduce bus bandwidth (bytes/s): (S / t) * 2(n-1)/n."""
    return size_bytes / seconds * 2 * (n - 1) / n if n > 1 else 0.0


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
