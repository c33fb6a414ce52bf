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
    ### BEGIN SOLUTION hint: what moves in step 0 (you send, your left sends you), and how do both indices shift per step?
    scratch = torch.empty_like(chunks[0])                 # [ceil(K/n)], reused every step
    for step in range(n - 1):
        send_i, recv_i = (rank - step) % n, (rank - step - 1) % n
        incoming = scratch[: chunks[recv_i].numel()]      # a view: no allocation per step
        received = dist.irecv(incoming, src=left)        # post the receive first
        sent = dist.isend(chunks[send_i], dst=right)
        received.wait()
        combine(chunks[recv_i], incoming, op)
        sent.wait()
    return (rank + 1) % n
    ### END SOLUTION


def ring_all_gather(chunks) -> None:
    """Phase 2: starting from chunk (rank + 1) % n, pass the finished chunks around the ring
    so that every rank ends with all n. n-1 isends per rank; receive straight into the
    chunk views (the tensor itself), no scratch buffer needed."""
    rank, n = dist.get_rank(), dist.get_world_size()
    left, right = neighbours()
    ### BEGIN SOLUTION hint: send the finished chunk you hold, receive the one your left held; how do both shift per step?
    for step in range(n - 1):
        send_i, recv_i = (rank + 1 - step) % n, (rank - step) % n
        received = dist.irecv(chunks[recv_i], src=left)
        sent = dist.isend(chunks[send_i], dst=right)
        received.wait()
        sent.wait()
    ### END SOLUTION


def ring_all_reduce(tensor: torch.Tensor, op=SUM) -> torch.Tensor:
    """All-reduce ``tensor`` in place (any shape, any number of elements); return it."""
    n = dist.get_world_size()
    ### BEGIN SOLUTION hint: chunk a flat view as the lab docstring says, run both phases; mind n == 1 and non-contiguous input
    if n == 1:
        return tensor
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    chunks = torch.tensor_split(flat, n)                  # n views: ceil or floor of K/n each
    ring_reduce_scatter(chunks, op)
    ring_all_gather(chunks)
    if flat.data_ptr() != tensor.data_ptr():              # we worked on a contiguous copy
        tensor.copy_(flat.view(tensor.shape))
    ### END SOLUTION
    return tensor


# --------------------------------------------------------------------------- the cost model
def naive_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """Seconds for reduce-to-root then broadcast-from-root, the root handling one message at
    a time: 2(n-1) messages of the whole tensor."""
    ### BEGIN SOLUTION hint: count the messages; each pays the latency plus its bytes' time on the link
    return 2 * (n - 1) * (alpha + size_bytes / beta)
    ### END SOLUTION


def tree_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """Seconds for a binomial tree reduce plus tree broadcast: 2 ceil(log2 n) rounds of the
    whole tensor."""
    ### BEGIN SOLUTION hint: as naive_time, but count rounds; how many does one rank alone need?
    return 2 * math.ceil(math.log2(n)) * (alpha + size_bytes / beta) if n > 1 else 0.0
    ### END SOLUTION


def ring_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """Seconds for the ring: 2(n-1) steps, each moving one chunk of size_bytes / n."""
    ### BEGIN SOLUTION hint: one message per step; how many bytes does each carry?
    return 2 * (n - 1) * (alpha + size_bytes / (n * beta))
    ### END SOLUTION


def crossover_bytes(n: int, alpha: float, beta: float) -> float:
    """The size above which the ring beats the tree (0: always; inf: never)."""
    ### BEGIN SOLUTION hint: solve ring_time == tree_time for the size; when does the ring always or never win?
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    extra_latency = (n - 1 - rounds) * alpha              # the ring's additional alpha terms
    saved_per_byte = (rounds - (n - 1) / n) / beta        # the ring's saving per byte
    if extra_latency <= 0:
        return 0.0
    return extra_latency / saved_per_byte if saved_per_byte > 0 else math.inf
    ### END SOLUTION


def bus_bandwidth(size_bytes: float, seconds: float, n: int) -> float:
    """nccl-tests' all-reduce bus bandwidth (bytes/s): (S / t) * 2(n-1)/n."""
    return size_bytes / seconds * 2 * (n - 1) / n if n > 1 else 0.0


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
