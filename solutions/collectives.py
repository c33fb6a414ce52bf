"""Lab 1 — collectives: use the eight built-in collectives, then build each from messages.

Part 1 (``use_builtins``) calls ``torch.distributed``'s own collectives once each. Part 2 builds
the same results again with nothing but point-to-point messages: a naive and a binomial-tree
broadcast and reduce, an all-reduce, gather, scatter, all-gather, reduce-scatter and a barrier.
Lesson 1 (``lessons/01_collectives.py``) explains what each collective does and, in its
section "Building them from messages", how each build works and what it costs. Each task's
docstring below is its spec; ``workbook hint collectives N`` shows hints for task N, one at a
time.

Conventions of the builds (every task relies on them)
-----------------------------------------------------
* Tensors are changed in place, as in torch.distributed; each build also returns its result.
* ``op`` is ``dist.ReduceOp.SUM``, ``MAX`` or ``MIN``; the given ``combine(acc, other, op)``
  (from ``workbook.communication.reduce_ops``) applies it in place: ``acc <- acc (op) other``.
* Chunks: the all-gather and the reduce-scatter cut a flat buffer of K elements into n chunks
  with the given ``chunk_views`` (``torch.tensor_split``'s rule: the first K % n chunks have one
  element more); rank r owns chunk r. The built-ins need K divisible by n, the builds do not.
* Part 2 may only send point-to-point messages (blocking or not): the grader's flight recorder
  fails any build that calls a collective (``dist.broadcast``, ``dist.barrier``, ...). The
  grader also counts the messages and, for the trees, the rounds.

Run it: ``workbook run collectives`` (the grader's checks, then what each build sent),
``python labs/collectives.py --nproc 3`` or ``torchrun --nproc_per_node=4 labs/collectives.py``.
Grade it: ``workbook grade --lab collectives``.
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
    """Wait for every handle of a non-blocking send or receive in ``works``."""
    for work in works:
        work.wait()


def _device() -> torch.device:
    """This rank's device: where its tensors live, and every tensor it hands a collective."""
    from workbook.runtime.ranks import device
    return device()


# --------------------------------------------------------------------------- part 1: use them
def use_builtins(root: int = 0) -> dict:
    """Call each of the eight built-in collectives once; return what this rank holds afterwards.

    Lesson 1 runs every one of them, before and after, in its sections from "Broadcast and
    reduce" to "Barrier": predict each value before you run it.

    Contract: each collective starts from a fresh input (the given helper below: rank r holds
    three float32 values r + 1), the root is the argument of that name, and the result is a
    dict with one entry per collective, keyed by the collective's name as written below with
    its hyphen turned into an underscore, the value being what this rank holds afterwards as
    (nested) Python lists of floats:

    * broadcast, from the root;
    * reduce, the sum, to the root (an entry on the root only);
    * all-reduce, the maximum;
    * gather, to the root (an entry on the root only: one list per rank, in rank order);
    * all-gather (one list per rank, in rank order);
    * scatter, from the root, whose piece for rank j is three float32 values 10 j;
    * reduce-scatter, the sum, of a 3n-element input holding 0, 1, ..., 3n - 1 plus the rank
      (each rank keeps its three elements);
    * barrier (the value True once it has returned).
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    dev = _device()

    def x():                                                     # float32[3], fresh each time
        return torch.full((3,), float(rank + 1), device=dev)
    out: dict = {}
    ### BEGIN SOLUTION
    ### hint 1: one built-in call per entry, each on a fresh input; lesson 1's cell that runs one
    ###     collective on every rank (just before "Broadcast and reduce") calls every one of them
    ### hint 2: for each collective, make its input (and, for those that fill one, an output
    ###     buffer or a list of n receive buffers), call the built-in with the root and the
    ###     reduction it asks for, then store what the rank holds, converted to lists; the
    ###     rooted ones take their list on the root only; the reduce-scatter takes the whole
    ###     input tensor and a three-element output
    ### hint 3: t = x(); dist.broadcast(t, src=root); out["broadcast"] = t.tolist(); likewise
    ###     dist.reduce(t, dst=root, op=SUM) (store on the root only), dist.all_reduce(t, op=MAX),
    ###     dist.gather(x(), bucket, dst=root), dist.all_gather(bucket, x()),
    ###     dist.scatter(t, parts, src=root),
    ###     dist.reduce_scatter_tensor(t, torch.arange(3.0 * n) + rank), dist.barrier()
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
### BEGIN CHALLENGE: broadcast and reduce, naive and by tree, and the tree all-reduce
def broadcast(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Naive broadcast: afterwards every rank's tensor holds the root's; return it.

    The root (the source rank) sends straight to every other rank: lesson 1, "Building them
    from messages", section "Naive: everyone talks to the root". Contract: n - 1 messages in
    all, each non-root rank receiving exactly one, from the root; point-to-point only."""
    rank, n = dist.get_rank(), dist.get_world_size()
    ### BEGIN SOLUTION
    ### hint 1: only the root holds the data, so it is the only sender; lesson 1, "Naive:
    ###     everyone talks to the root"
    ### hint 2: on the root, start one non-blocking send of the tensor to each other rank, then
    ###     wait for all of them; on every other rank, receive once from the root into the tensor
    ### hint 3: root: wait_all([dist.isend(tensor, dst=peer) for peer in range(n) if peer != src]);
    ###     others: dist.recv(tensor, src=src)
    if rank == src:
        wait_all([dist.isend(tensor, dst=peer) for peer in range(n) if peer != src])
    else:
        dist.recv(tensor, src=src)
    ### END SOLUTION
    return tensor


def tree_broadcast(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Binomial-tree broadcast: the naive broadcast's result, in ceil(log2 n) rounds; return
    the tensor.

    Lesson 1, "Building them from messages", section "Trees: ⌈log2 n⌉ rounds". Contract: any
    root (the source rank); n - 1 messages in all, each non-root rank receiving exactly one;
    the root sends at most ceil(log2 n) messages and the whole broadcast takes at most
    ceil(log2 n) rounds (the grader counts both); point-to-point only."""
    rank, n = dist.get_rank(), dist.get_world_size()
    v = (rank - src) % n                                  # my position in the tree, root = 0
    ### BEGIN SOLUTION
    ### hint 1: the holders double every round, and a position decides its part from its own
    ###     number and the round's distance alone; lesson 1, "Trees: ⌈log2 n⌉ rounds" (draw
    ###     the six-rank tree its "Think it through" asks for)
    ### hint 2: loop over distances 1, 2, 4, ... while below n; in each round a position below
    ###     the distance sends to the position one distance above (if that is below n), a
    ###     position from the distance up to twice it receives from one distance below, every
    ###     other position sits out; turn a position back into a rank by adding the root, mod n
    ### hint 3: mask = 1; while mask < n: if v < mask and v + mask < n: dist.send(tensor,
    ###     dst=(v + mask + src) % n); elif mask <= v < 2 * mask: dist.recv(tensor,
    ###     src=(v - mask + src) % n); mask *= 2
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
    """Naive reduce: afterwards the root's tensor holds the reduction (sum, max or min, as
    asked) of every rank's tensor; every other rank's tensor is unchanged. Return the tensor.

    Every other rank sends straight to the root (the destination rank), which combines what
    arrives: lesson 1, "Naive: everyone talks to the root". Contract: n - 1 messages in all,
    each non-root rank sending exactly one, to the root; point-to-point only; the reduction is
    applied with the given combiner (module docstring, "Conventions")."""
    rank, n = dist.get_rank(), dist.get_world_size()
    ### BEGIN SOLUTION
    ### hint 1: the root receives n - 1 messages and folds each into its own tensor; lesson 1,
    ###     "Naive: everyone talks to the root"
    ### hint 2: a receive overwrites its buffer, so the root needs a scratch buffer like the
    ###     tensor: for each other rank in turn, receive into it, then combine it into the
    ###     tensor; every other rank sends its tensor to the root once
    ### hint 3: root: incoming = torch.empty_like(tensor); for each peer != dst:
    ###     dist.recv(incoming, src=peer); combine(tensor, incoming, op);
    ###     others: dist.send(tensor, dst=dst)
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
    """Binomial-tree reduce: the naive reduce's result, in ceil(log2 n) rounds; return the
    tensor.

    Lesson 1, "Trees: ⌈log2 n⌉ rounds", the second table: the broadcast tree run backwards.
    Contract: any root (the destination rank); only the root's tensor changes, every other
    rank's keeps its input; each non-root rank sends exactly one message, n - 1 in all; the
    root receives at most ceil(log2 n) and the whole reduce takes at most ceil(log2 n) rounds
    (the grader counts both); point-to-point only; reductions with the given combiner."""
    rank, n = dist.get_rank(), dist.get_world_size()
    v = (rank - dst) % n                                  # my position in the tree, root = 0
    ### BEGIN SOLUTION
    ### hint 1: partial results flow towards the root, smallest distance first, and a position
    ###     that has sent its partial result is done; lesson 1, "Trees: ⌈log2 n⌉ rounds" (draw
    ###     the six-rank reduce tree its "Think it through" asks for)
    ### hint 2: accumulate into a buffer of your own (the root: its tensor; the others: a
    ###     copy), with a scratch buffer to receive into; loop over distances 1, 2, 4, ... while
    ###     below n: an odd multiple of the distance sends its partial result one distance down
    ###     and leaves the loop; an even multiple receives from one distance up, if that
    ###     position exists, and combines it in
    ### hint 3: partial = tensor if rank == dst else tensor.clone(); incoming =
    ###     torch.empty_like(tensor); mask = 1; while mask < n: if v % (2 * mask) == mask:
    ###     dist.send(partial, dst=(v - mask + dst) % n); break; if v + mask < n:
    ###     dist.recv(incoming, src=(v + mask + dst) % n); combine(partial, incoming, op);
    ###     mask *= 2
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
    """All-reduce: afterwards every rank's tensor holds the reduction (sum, max or min, as
    asked) of every rank's tensor; return it.

    The latency-friendly all-reduce of lesson 1, end of "Trees: ⌈log2 n⌉ rounds": two of the
    builds above, 2 ceil(log2 n) rounds of whole-tensor messages. Contract: point-to-point
    only."""
    ### BEGIN SOLUTION
    ### hint 1: all-reduce = reduce to one rank, then broadcast from it; lesson 1, end of
    ###     "Trees: ⌈log2 n⌉ rounds"
    ### hint 2: run your tree reduce with the reduction asked for to rank 0, then your tree
    ###     broadcast from rank 0, both on the tensor itself
    ### hint 3: tree_reduce(tensor, dst=0, op=op); tree_broadcast(tensor, src=0)
    tree_reduce(tensor, dst=0, op=op)
    tree_broadcast(tensor, src=0)
    ### END SOLUTION
    return tensor
### END CHALLENGE


def gather(tensor: torch.Tensor, gather_list: list | None = None, dst: int = 0):
    """Gather: afterwards entry p of the root's list holds rank p's tensor (the root's own
    entry included); return the list.

    The list is given, and filled, on the root (the destination rank) only. Lesson 1, "Naive:
    everyone talks to the root". Contract: n - 1 messages in all, each non-root rank sending
    exactly one, to the root; point-to-point only."""
    rank, n = dist.get_rank(), dist.get_world_size()
    ### BEGIN SOLUTION
    ### hint 1: each rank's data has its own place in the root's list, so the root can receive
    ###     from everyone at once; lesson 1, "Naive: everyone talks to the root"
    ### hint 2: on the root, copy its own tensor into its entry, start one non-blocking receive
    ###     per other rank straight into that rank's entry, and wait for them all; every other
    ###     rank sends its tensor to the root
    ### hint 3: root: gather_list[dst].copy_(tensor); wait_all([dist.irecv(gather_list[peer],
    ###     src=peer) for peer != dst]); others: dist.send(tensor, dst=dst)
    if rank == dst:
        gather_list[dst].copy_(tensor)
        wait_all([dist.irecv(gather_list[peer], src=peer) for peer in range(n) if peer != dst])
    else:
        dist.send(tensor, dst=dst)
    ### END SOLUTION
    return gather_list


def scatter(tensor: torch.Tensor, scatter_list: list | None = None, src: int = 0) -> torch.Tensor:
    """Scatter: afterwards rank p's tensor holds entry p of the root's list; return the tensor.

    The list is given on the root (the source rank) only. Lesson 1, "Naive: everyone talks to
    the root". Contract: n - 1 messages in all, each non-root rank receiving exactly one, from
    the root; point-to-point only."""
    rank, n = dist.get_rank(), dist.get_world_size()
    ### BEGIN SOLUTION
    ### hint 1: the gather run backwards; lesson 1, "Naive: everyone talks to the root"
    ### hint 2: on the root, copy its own entry into its tensor, start one non-blocking send of
    ###     entry p to each other rank p, and wait for them all; every other rank receives once
    ###     from the root into its tensor
    ### hint 3: root: tensor.copy_(scatter_list[src]); wait_all([dist.isend(scatter_list[peer],
    ###     dst=peer) for peer != src]); others: dist.recv(tensor, src=src)
    if rank == src:
        tensor.copy_(scatter_list[src])
        wait_all([dist.isend(scatter_list[peer], dst=peer) for peer in range(n) if peer != src])
    else:
        dist.recv(tensor, src=src)
    ### END SOLUTION
    return tensor


def all_gather(output: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    """All-gather: afterwards every rank's output holds every rank's input, rank p's in chunk p
    of the output (the chunks of the conventions); return the output.

    Lesson 1, "Building them from messages", section "Direct exchange: all-gather and
    reduce-scatter". Contract: the output has K elements and rank p's input as many as chunk
    p; every rank exchanges directly with every other, all messages in flight at once, and
    receives straight into the output (no extra buffers); point-to-point only."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = chunk_views(output, n)                       # view p: where rank p's input goes
    ### BEGIN SOLUTION
    ### hint 1: one round in which every pair of ranks trades its chunks; lesson 1, "Direct
    ###     exchange: all-gather and reduce-scatter"
    ### hint 2: copy your input into your own view of the output; then, for every other rank,
    ###     start a non-blocking send of your view to it and a non-blocking receive from it into
    ###     its view; wait for all of them at the end
    ### hint 3: chunks[rank].copy_(input.view(-1)); for each peer != rank:
    ###     works += [dist.isend(chunks[rank], dst=peer), dist.irecv(chunks[peer], src=peer)];
    ###     wait_all(works)
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
    """Reduce-scatter: afterwards rank r's output holds chunk r of the reduction (sum, max or
    min, as asked) of every rank's input; return the output.

    Lesson 1, "Direct exchange: all-gather and reduce-scatter". Contract: the input has K
    elements, cut into the chunks of the conventions, and stays unchanged; the output has as
    many elements as chunk r; every rank exchanges directly with every other, all messages in
    flight at once; point-to-point only; reductions with the given combiner."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = chunk_views(input, n)
    ### BEGIN SOLUTION
    ### hint 1: one round in which every pair of ranks trades chunks, then each rank reduces
    ###     what it received; lesson 1, "Direct exchange: all-gather and reduce-scatter"
    ### hint 2: start from a copy of your own chunk of the input in the output; give every
    ###     other rank a scratch buffer of its own (all receives are in flight together), send
    ###     each other rank p chunk p of your input and receive its chunk for you into its
    ###     scratch buffer, wait for everything, then combine the buffers into the output
    ### hint 3: mine = output.view(-1); mine.copy_(chunks[rank]); scratch = {peer:
    ###     torch.empty_like(mine) for peer != rank}; isend(chunks[peer], dst=peer) and
    ###     irecv(scratch[peer], src=peer) for each; wait_all; combine(mine, scratch[peer], op)
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
    """Dissemination barrier: no rank returns before every rank has entered it.

    Lesson 1, "Building them from messages", section "The dissemination barrier". Contract:
    ceil(log2 n) rounds, each rank sending one one-element message per round (the two given
    buffers below: one to send, one to receive into); point-to-point only."""
    rank, n = dist.get_rank(), dist.get_world_size()
    token, heard = torch.zeros(1, device=_device()), torch.zeros(1, device=_device())
    ### BEGIN SOLUTION
    ### hint 1: in the round of distance d a rank tells the rank d after it and hears from the
    ###     rank d before it; lesson 1, "The dissemination barrier"
    ### hint 2: loop over distances 1, 2, 4, ... while below n; in each round start a
    ###     non-blocking send of the token to the rank one distance after you (mod n), receive
    ###     from the rank one distance before you, then wait for your send
    ### hint 3: step = 1; while step < n: sent = dist.isend(token, dst=(rank + step) % n);
    ###     dist.recv(heard, src=(rank - step) % n); sent.wait(); step *= 2
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
