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
### BEGIN CHALLENGE: the ring all-reduce in one go: both phases and the whole ring
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
    ### BEGIN SOLUTION
    ### hint 1: in every step each rank passes one partial sum to the right and adds the one
    ###     arriving from the left into its own copy of that chunk; lesson 2, "Step through the
    ###     ring" (follow one chunk around the heatmap)
    ### hint 2: find what rank r sends in step 0 (its own chunk r) and what it receives (its
    ###     left neighbour's chunk); in every later step both indices move back by one, mod n.
    ###     Post the receive into (a prefix of) the scratch buffer, send, wait for the receive,
    ###     combine it into the chunk it belongs to, then wait for the send
    ### hint 3: scratch = torch.empty_like(chunks[0]); for step in range(n - 1): send_i, recv_i =
    ###     (rank - step) % n, (rank - step - 1) % n; incoming = scratch[:chunks[recv_i].numel()];
    ###     irecv(incoming, src=left), isend(chunks[send_i], dst=right), wait the receive,
    ###     combine(chunks[recv_i], incoming, op), wait the send; return (rank + 1) % n
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
    ### BEGIN SOLUTION
    ### hint 1: the finished chunks travel once more around the ring, copied, not combined;
    ###     lesson 2, "Step through the ring" (the all-gather steps)
    ### hint 2: in step 0 a rank sends the chunk it finished and receives the one its left
    ###     neighbour finished; in every later step it forwards the chunk it received in the step
    ###     before, so both indices move back by one per step, mod n. Post the receive straight
    ###     into its chunk, send, then wait for both
    ### hint 3: for step in range(n - 1): send_i, recv_i = (rank + 1 - step) % n,
    ###     (rank - step) % n; irecv(chunks[recv_i], src=left); isend(chunks[send_i], dst=right);
    ###     wait for both
    for step in range(n - 1):
        send_i, recv_i = (rank + 1 - step) % n, (rank - step) % n
        received = dist.irecv(chunks[recv_i], src=left)
        sent = dist.isend(chunks[send_i], dst=right)
        received.wait()
        sent.wait()
    ### END SOLUTION


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
    ### BEGIN SOLUTION
    ### hint 1: run the two phases above on n views of the tensor's own memory, so that they
    ###     reduce it where it lies; lesson 2, introduction
    ### hint 2: with one rank there is nothing to do; otherwise take a flat view of the tensor
    ###     (a contiguous copy if it is not contiguous), cut it into n views, run phase 1 then
    ###     phase 2 on them, and if you worked on a copy, copy the result back into the tensor
    ### hint 3: flat = tensor.view(-1) (or tensor.contiguous().view(-1)); chunks =
    ###     torch.tensor_split(flat, n); ring_reduce_scatter(chunks, op); ring_all_gather(chunks);
    ###     if flat.data_ptr() != tensor.data_ptr(): tensor.copy_(flat.view(tensor.shape))
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
### END CHALLENGE


# --------------------------------------------------------------------------- the cost model
# Every time below is in seconds: one message of m bytes costs alpha + m / beta, with alpha the
# latency (seconds) and beta the link's bandwidth (bytes per second), as in lesson 2, "The
# alpha–beta model"; the size is the whole tensor's, in bytes, and n the number of ranks.
def naive_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """The modelled time of lesson 1's naive all-reduce: a naive reduce to a root, then a
    naive broadcast from it, the root handling one message at a time.

    Lesson 1, "What each build costs", and lesson 2, "The alpha–beta model". Contract: the
    time in seconds, for any n >= 1 (0 for one rank)."""
    ### BEGIN SOLUTION
    ### hint 1: count the messages the root handles one after another, and price each with the
    ###     alpha-beta model; lesson 1, "What each build costs" (the naive rows)
    ### hint 2: the reduce brings one whole-tensor message from each other rank, the broadcast
    ###     sends one to each; every message costs the latency plus the whole tensor's bytes
    ###     over the bandwidth
    ### hint 3: 2 * (n - 1) * (alpha + size_bytes / beta)
    return 2 * (n - 1) * (alpha + size_bytes / beta)
    ### END SOLUTION


def tree_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """The modelled time of lesson 1's tree all-reduce: a binomial-tree reduce, then a
    binomial-tree broadcast.

    Lesson 2, "The alpha–beta model" (the tree), and lesson 1, "Trees: ⌈log2 n⌉ rounds".
    Contract: the time in seconds, for any n >= 1 (0 for one rank)."""
    ### BEGIN SOLUTION
    ### hint 1: a round costs one message's time, whatever the number of messages sent in it
    ###     side by side; lesson 1, "Trees: ⌈log2 n⌉ rounds"
    ### hint 2: count the rounds of both trees (the reduce and the broadcast each take the
    ###     rounded-up base-2 logarithm of n); each round moves the whole tensor, paying the
    ###     latency plus its bytes over the bandwidth; one rank needs no round at all
    ### hint 3: 2 * math.ceil(math.log2(n)) * (alpha + size_bytes / beta) if n > 1 else 0.0
    return 2 * math.ceil(math.log2(n)) * (alpha + size_bytes / beta) if n > 1 else 0.0
    ### END SOLUTION


def ring_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """The modelled time of your ring all-reduce (both phases).

    Lesson 2, "The alpha–beta model". Contract: the time in seconds, for any n >= 1 (0 for one
    rank); chunks taken as S / n bytes each."""
    ### BEGIN SOLUTION
    ### hint 1: the ring is a sequence of steps, one message per rank per step, all steps alike;
    ###     lesson 2, "The alpha–beta model"
    ### hint 2: count the steps of both phases; each pays the latency plus one chunk's bytes
    ###     (the tensor's size over n) over the bandwidth
    ### hint 3: 2 * (n - 1) * (alpha + size_bytes / (n * beta))
    return 2 * (n - 1) * (alpha + size_bytes / (n * beta))
    ### END SOLUTION


def crossover_bytes(n: int, alpha: float, beta: float) -> float:
    """The tensor size, in bytes, above which your modelled ring beats your modelled tree
    (below it the tree is faster).

    Lesson 2, "The alpha–beta model", the paragraph on where the curves cross. Contract: 0.0
    when the ring is never slower than the tree, whatever the size; positive infinity (a
    float) when it is never faster."""
    ### BEGIN SOLUTION
    ### hint 1: both models are a latency part plus a part proportional to the size; lesson 2,
    ###     "The alpha–beta model", where the curves cross
    ### hint 2: write each time as (number of latencies) x alpha + (bytes per byte of tensor) x
    ###     size / beta and set them equal: the ring's extra latencies over the tree's, divided
    ###     by what the ring saves per byte, is the crossover; if the ring pays no extra latency
    ###     it always wins, and if it saves nothing per byte it never does
    ### hint 3: rounds = ceil(log2 n); extra_latency = (n - 1 - rounds) * alpha;
    ###     saved_per_byte = (rounds - (n - 1) / n) / beta; 0 if extra_latency <= 0, else
    ###     extra_latency / saved_per_byte (inf if saved_per_byte <= 0)
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
