# Generated from solutions/collectives.py by `workbook assign` (level: standard): this is your file to edit.
# Replace each `raise NotImplementedError` with your code; check it with `workbook run collectives`
# (or `workbook watch collectives`). Stuck on task N? `workbook hint collectives N`, one hint at a time.
#
# Your tasks (38 pts in all):
#    1. use_builtins (2 pts): Call each of the eight built-in collectives once; return what this
#       rank holds afterwards.
#    2. broadcast (4 pts): Naive broadcast: afterwards every rank's tensor holds the root's; return
#       it.
#    3. tree_broadcast (5 pts): Binomial-tree broadcast: the naive broadcast's result, in ceil(log2
#       n) rounds; return the tensor.
#    4. reduce (4 pts): Naive reduce: afterwards the root's tensor holds the reduction (sum, max or
#       min, as asked) of every rank's tensor; every other rank's tensor is unchanged.
#    5. tree_reduce (5 pts): Binomial-tree reduce: the naive reduce's result, in ceil(log2 n)
#       rounds; return the tensor.
#    6. all_reduce (3 pts): All-reduce: afterwards every rank's tensor holds the reduction (sum,
#       max or min, as asked) of every rank's tensor; return it.
#    7. gather (3 pts): Gather: afterwards entry p of the root's list holds rank p's tensor (the
#       root's own entry included); return the list.
#    8. scatter (3 pts): Scatter: afterwards rank p's tensor holds entry p of the root's list;
#       return the tensor.
#    9. all_gather (3 pts): All-gather: afterwards every rank's output holds every rank's input,
#       rank p's in chunk p of the output (the chunks of the conventions); return the output.
#   10. reduce_scatter (3 pts): Reduce-scatter: afterwards rank r's output holds chunk r of the
#       reduction (sum, max or min, as asked) of every rank's input; return the output.
#   11. barrier (3 pts): Dissemination barrier: no rank returns before every rank has entered it.
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
    raise NotImplementedError("not implemented yet: collectives.use_builtins")
    return out


# --------------------------------------------------------------------------- part 2: build them
def broadcast(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Naive broadcast: afterwards every rank's tensor holds the root's; return it.

    The root (the source rank) sends straight to every other rank: lesson 1, "Building them
    from messages", section "Naive: everyone talks to the root". Contract: n - 1 messages in
    all, each non-root rank receiving exactly one, from the root; point-to-point only."""
    rank, n = dist.get_rank(), dist.get_world_size()
    raise NotImplementedError("not implemented yet: collectives.broadcast")
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
    raise NotImplementedError("not implemented yet: collectives.tree_broadcast")
    return tensor


def reduce(tensor: torch.Tensor, dst: int = 0, op=SUM) -> torch.Tensor:
    """Naive reduce: afterwards the root's tensor holds the reduction (sum, max or min, as
    asked) of every rank's tensor; every other rank's tensor is unchanged. Return the tensor.

    Every other rank sends straight to the root (the destination rank), which combines what
    arrives: lesson 1, "Naive: everyone talks to the root". Contract: n - 1 messages in all,
    each non-root rank sending exactly one, to the root; point-to-point only; the reduction is
    applied with the given combiner (module docstring, "Conventions")."""
    rank, n = dist.get_rank(), dist.get_world_size()
    raise NotImplementedError("not implemented yet: collectives.reduce")
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
    raise NotImplementedError("not implemented yet: collectives.tree_reduce")
    return tensor


def all_reduce(tensor: torch.Tensor, op=SUM) -> torch.Tensor:
    """All-reduce: afterwards every rank's tensor holds the reduction (sum, max or min, as
    asked) of every rank's tensor; return it.

    The latency-friendly all-reduce of lesson 1, end of "Trees: ⌈log2 n⌉ rounds": two of the
    builds above, 2 ceil(log2 n) rounds of whole-tensor messages. Contract: point-to-point
    only."""
    raise NotImplementedError("not implemented yet: collectives.all_reduce")
    return tensor


def gather(tensor: torch.Tensor, gather_list: list | None = None, dst: int = 0):
    """Gather: afterwards entry p of the root's list holds rank p's tensor (the root's own
    entry included); return the list.

    The list is given, and filled, on the root (the destination rank) only. Lesson 1, "Naive:
    everyone talks to the root". Contract: n - 1 messages in all, each non-root rank sending
    exactly one, to the root; point-to-point only."""
    rank, n = dist.get_rank(), dist.get_world_size()
    raise NotImplementedError("not implemented yet: collectives.gather")
    return gather_list


def scatter(tensor: torch.Tensor, scatter_list: list | None = None, src: int = 0) -> torch.Tensor:
    """Scatter: afterwards rank p's tensor holds entry p of the root's list; return the tensor.

    The list is given on the root (the source rank) only. Lesson 1, "Naive: everyone talks to
    the root". Contract: n - 1 messages in all, each non-root rank receiving exactly one, from
    the root; point-to-point only."""
    rank, n = dist.get_rank(), dist.get_world_size()
    raise NotImplementedError("not implemented yet: collectives.scatter")
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
    raise NotImplementedError("not implemented yet: collectives.all_gather")
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
    raise NotImplementedError("not implemented yet: collectives.reduce_scatter")
    return output


def barrier() -> None:
    """Dissemination barrier: no rank returns before every rank has entered it.

    Lesson 1, "Building them from messages", section "The dissemination barrier". Contract:
    ceil(log2 n) rounds, each rank sending one one-element message per round (the two given
    buffers below: one to send, one to receive into); point-to-point only."""
    rank, n = dist.get_rank(), dist.get_world_size()
    token, heard = torch.zeros(1, device=_device()), torch.zeros(1, device=_device())
    raise NotImplementedError("not implemented yet: collectives.barrier")


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
