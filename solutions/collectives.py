"""Lab 1 — collectives: first use the eight built-ins, then rebuild each from point-to-point.

A collective is a pattern of messages that every rank of a group takes part in. Here the
group has n ranks, the data is a tensor of S bytes, and "a message" is one send matched by
one receive. Part 1 (``use_builtins``) calls ``torch.distributed``'s own collectives; part 2
builds the same results with nothing but ``dist.send / recv / isend / irecv``.

What each build costs (the root is ``src``/``dst``; L = ceil(log2 n)):

=================  ======================================  ==========  =====================
build              who sends what                          rounds      busiest rank moves
=================  ======================================  ==========  =====================
broadcast (naive)  root -> each other rank, S bytes        n - 1       root sends (n-1) S
tree_broadcast     binomial tree: holders double per round L           root sends L S
reduce (naive)     each other rank -> root, S bytes        n - 1       root receives (n-1) S
tree_reduce        binomial tree, partial results upward   L           root receives L S
all_reduce         tree_reduce to 0, then tree_broadcast   2 L         2 L S
gather / scatter   root <-> each other rank, its own chunk n - 1       root (n-1)/n S
all_gather         every rank -> every other, its chunk    n - 1       (n-1)/n S out, same in
reduce_scatter     every rank -> rank j, the j-th chunk    n - 1       (n-1)/n S out, same in
barrier            dissemination: round k, to rank r+2^k   L           L one-element messages
=================  ======================================  ==========  =====================

Both trees send n - 1 messages in total, like the naive versions; they win by spreading the
sends over many senders, so the root's n - 1 sequential messages become L rounds. The
bandwidth-optimal all-reduce (a ring, 2(n-1)/n S per rank) is the next lab.

nccl-tests turns a measured time t into bandwidths as algbw = S / t and busbw = algbw * f,
with f = 2(n-1)/n for all-reduce, (n-1)/n for all-gather and reduce-scatter (S = the full
n-rank buffer) and 1 for broadcast and reduce: busbw is the rate a rank's busiest link ran
at, comparable across n. ``workbook bench`` prints both for these builds.

Conventions of the builds
-------------------------
* Tensors are changed in place, as in torch.distributed; each build also returns its result.
* ``op`` is ``dist.ReduceOp.SUM``, ``MAX`` or ``MIN``; ``combine(acc, other, op)`` (given, from
  ``workbook.communication.reduce_ops``) applies it in place: ``acc <- acc (op) other``.
* Chunks: ``all_gather`` and ``reduce_scatter`` view a flat buffer of K elements as
  ``torch.tensor_split(buffer, n)``: the first K % n chunks have one element more than the
  others (K = 10, n = 4 gives 3, 3, 2, 2). Rank r owns chunk r. That is the rule of
  ``chunk_views``; the built-ins need K divisible by n, the builds do not.
* Only point-to-point calls are allowed in part 2: the grader's flight recorder fails any
  build that calls a collective (``dist.broadcast``, ``dist.barrier``, ...).

Run it: ``workbook run collectives`` (the grader's checks, then what each build sent),
``python labs/collectives.py --nproc 3`` or ``torchrun --nproc_per_node=4 labs/collectives.py``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from workbook.communication.reduce_ops import MAX, SUM, combine   # given: see the conventions above


# --------------------------------------------------------------------------- helpers (given)
def chunk_views(buffer: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
    """The n chunks of a contiguous buffer, as views: ``torch.tensor_split`` of its flat form."""
    return torch.tensor_split(buffer.view(-1), n)


def wait_all(works) -> None:
    for work in works:
        work.wait()


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
        else torch.device("cpu")


# --------------------------------------------------------------------------- part 1: use them
def use_builtins(root: int = 0) -> dict:
    """Call each built-in once; return what this rank holds afterwards (as lists).

    Rank r starts from ``x = [r+1, r+1, r+1]``. Predict every entry before you run it:
    broadcast from ``root``; reduce (sum) to ``root`` (key present on the root only);
    all_reduce (max); gather to ``root`` (root only); all_gather; scatter from ``root`` of
    ``[10*j, 10*j, 10*j]`` to rank j; reduce_scatter_tensor (sum) of ``arange(3n) + r``; barrier.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    dev = _device()

    def x():                                                     # float32[3], fresh each time
        return torch.full((3,), float(rank + 1), device=dev)
    out: dict = {}
    ### BEGIN SOLUTION hint: one dist.<collective> call per key; store t.tolist() in out[key]
    t = x()
    dist.broadcast(t, src=root)
    out["broadcast"] = t.tolist()
    t = x()
    dist.reduce(t, dst=root, op=SUM)
    if rank == root:
        out["reduce"] = t.tolist()
    t = x()
    dist.all_reduce(t, op=MAX)
    out["all_reduce"] = t.tolist()
    bucket = [torch.empty(3, device=dev) for _ in range(n)] if rank == root else None
    dist.gather(x(), bucket, dst=root)
    if rank == root:
        out["gather"] = [b.tolist() for b in bucket]
    bucket = [torch.empty(3, device=dev) for _ in range(n)]
    dist.all_gather(bucket, x())
    out["all_gather"] = [b.tolist() for b in bucket]
    parts = [torch.full((3,), 10.0 * j, device=dev) for j in range(n)] if rank == root else None
    t = torch.empty(3, device=dev)
    dist.scatter(t, parts, src=root)
    out["scatter"] = t.tolist()
    t = torch.empty(3, device=dev)
    dist.reduce_scatter_tensor(t, torch.arange(3.0 * n, device=dev) + rank, op=SUM)
    out["reduce_scatter"] = t.tolist()
    dist.barrier()
    out["barrier"] = True
    ### END SOLUTION
    return out


# --------------------------------------------------------------------------- part 2: build them
def broadcast(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Naive broadcast: the root sends its tensor to each of the n-1 others (n-1 rounds)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    ### BEGIN SOLUTION hint: the root isends to every other rank; everyone else receives once
    if rank == src:
        wait_all([dist.isend(tensor, dst=peer) for peer in range(n) if peer != src])
    else:
        dist.recv(tensor, src=src)
    ### END SOLUTION
    return tensor


def tree_broadcast(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Binomial-tree broadcast: in round k every holder v < 2^k sends to v + 2^k.

    Positions are relative to the root, ``v = (rank - src) % n``, so any root works. After
    round k the first 2^(k+1) positions hold the data: ceil(log2 n) rounds, n-1 messages.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    v = (rank - src) % n                                  # my position in the tree, root = 0
    ### BEGIN SOLUTION hint: rounds with a doubling mask; in each, v says: send (if the partner exists), receive or sit out
    mask = 1
    while mask < n:
        if v < mask and v + mask < n:
            dist.send(tensor, dst=(v + mask + src) % n)
        elif mask <= v < 2 * mask:
            dist.recv(tensor, src=(v - mask + src) % n)
        mask *= 2
    ### END SOLUTION
    return tensor


def reduce(tensor: torch.Tensor, dst: int = 0, op=SUM) -> torch.Tensor:
    """Naive reduce: every rank sends to the root, which combines n-1 messages in turn.

    Only the root's tensor changes; the others keep their input."""
    rank, n = dist.get_rank(), dist.get_world_size()
    ### BEGIN SOLUTION hint: the root receives into a scratch buffer and combine()s; others send
    if rank == dst:
        incoming = torch.empty_like(tensor)
        for peer in range(n):
            if peer != dst:
                dist.recv(incoming, src=peer)
                combine(tensor, incoming, op)
    else:
        dist.send(tensor, dst=dst)
    ### END SOLUTION
    return tensor


def tree_reduce(tensor: torch.Tensor, dst: int = 0, op=SUM) -> torch.Tensor:
    """Binomial-tree reduce, the broadcast tree run backwards: ceil(log2 n) rounds.

    In round k (mask = 2^k) a position v with ``v % (2 mask) == mask`` sends its partial result
    to v - mask and is done; a position with ``v % (2 mask) == 0`` receives from v + mask (if
    that exists) and combines. Non-root ranks keep their input (they work on a copy)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    v = (rank - dst) % n
    ### BEGIN SOLUTION hint: accumulate into a copy (the root: into tensor); send once, then stop
    partial = tensor if rank == dst else tensor.clone()
    incoming = torch.empty_like(tensor)
    mask = 1
    while mask < n:
        if v % (2 * mask) == mask:
            dist.send(partial, dst=(v - mask + dst) % n)
            break
        if v + mask < n:
            dist.recv(incoming, src=(v + mask + dst) % n)
            combine(partial, incoming, op)
        mask *= 2
    ### END SOLUTION
    return tensor


def all_reduce(tensor: torch.Tensor, op=SUM) -> torch.Tensor:
    """All-reduce as tree_reduce to rank 0 followed by tree_broadcast from rank 0 (2 L rounds).

    Latency-friendly (few rounds) but every message carries all S bytes; the ring of the next
    lab moves only 2(n-1)/n S per rank."""
    ### BEGIN SOLUTION hint: two of your builds above, one after the other
    tree_reduce(tensor, dst=0, op=op)
    tree_broadcast(tensor, src=0)
    ### END SOLUTION
    return tensor


def gather(tensor: torch.Tensor, gather_list: list | None = None, dst: int = 0):
    """The root receives rank p's tensor into ``gather_list[p]`` (its own is copied)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    ### BEGIN SOLUTION hint: the root posts one irecv per peer, then waits; others send
    if rank == dst:
        gather_list[dst].copy_(tensor)
        wait_all([dist.irecv(gather_list[peer], src=peer) for peer in range(n) if peer != dst])
    else:
        dist.send(tensor, dst=dst)
    ### END SOLUTION
    return gather_list


def scatter(tensor: torch.Tensor, scatter_list: list | None = None, src: int = 0) -> torch.Tensor:
    """The root sends ``scatter_list[p]`` to rank p, which receives it into ``tensor``."""
    rank, n = dist.get_rank(), dist.get_world_size()
    ### BEGIN SOLUTION hint: gather backwards
    if rank == src:
        tensor.copy_(scatter_list[src])
        wait_all([dist.isend(scatter_list[peer], dst=peer) for peer in range(n) if peer != src])
    else:
        dist.recv(tensor, src=src)
    ### END SOLUTION
    return tensor


def all_gather(output: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    """Every rank ends with every chunk: ``chunk_views(output, n)[p]`` = rank p's ``input``.

    Direct exchange: each rank sends its chunk to the n-1 others and receives theirs straight
    into the matching view of ``output`` (no extra copies)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = chunk_views(output, n)                       # n views; rank p's has input.numel()
    ### BEGIN SOLUTION hint: copy your own chunk, then one isend and one irecv per peer
    chunks[rank].copy_(input.view(-1))
    works = []
    for peer in range(n):
        if peer != rank:
            works.append(dist.isend(chunks[rank], dst=peer))
            works.append(dist.irecv(chunks[peer], src=peer))
    wait_all(works)
    ### END SOLUTION
    return output


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, op=SUM) -> torch.Tensor:
    """Rank r ends with chunk r of the reduction of every rank's ``input`` (K elements).

    ``output`` has ``chunk_views(input, n)[r].numel()`` elements. Each rank sends chunk p of
    its input to rank p and combines the n-1 chunks r it receives with its own."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = chunk_views(input, n)
    ### BEGIN SOLUTION hint: one scratch buffer per peer, so all receives can be in flight at once
    mine = output.view(-1)
    mine.copy_(chunks[rank])
    scratch = {peer: torch.empty_like(mine) for peer in range(n) if peer != rank}
    works = []
    for peer in scratch:
        works.append(dist.isend(chunks[peer], dst=peer))
        works.append(dist.irecv(scratch[peer], src=peer))
    wait_all(works)
    for peer in sorted(scratch):
        combine(mine, scratch[peer], op)
    ### END SOLUTION
    return output


def barrier() -> None:
    """Dissemination barrier: in round k rank r tells r + 2^k and hears from r - 2^k.

    After round k a rank has (indirectly) heard from the 2^(k+1) ranks before it, so after
    ceil(log2 n) rounds it knows everyone has arrived."""
    rank, n = dist.get_rank(), dist.get_world_size()
    token, heard = torch.zeros(1, device=_device()), torch.zeros(1, device=_device())
    ### BEGIN SOLUTION hint: isend the token, recv from the other side, then wait for the send
    step = 1
    while step < n:
        sent = dist.isend(token, dst=(rank + step) % n)
        dist.recv(heard, src=(rank - step) % n)
        sent.wait()
        step *= 2
    ### END SOLUTION


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
