# Generated from solutions/async_overlap.py by `workbook assign`: this is your file to edit.
# Replace each `raise NotImplementedError` with your code, then grade it with
#     workbook grade --lab async_overlap
#
# Your tasks (10 pts in all):
#   1. overlapped_all_reduce (5 pts): Sum `tensor` over every rank, in place, while `compute()`
#      runs; return what `compute()` returned.
#   2. pipelined_all_reduce (5 pts): Return `[sum over ranks of layer(x) for x in chunks]`, with
#      chunk k's all-reduce overlapping the computation of `layer` on chunk k+1.
"""Lab `async_overlap`: start a collective, keep computing, and wait only when you need the answer.

A synchronous ``dist.all_reduce(t)`` returns once ``t`` holds the sum over all ranks: the rank
sits idle while the bytes cross the link. With ``async_op=True`` the call returns at once with a
*work* handle; the transfer goes on in the background, and ``work.wait()`` blocks until it is
done. Everything the rank does between the two calls runs *during* the transfer, so its cost is
hidden, provided that work neither reads nor writes the tensor in flight (until ``wait()``
returns, the tensor may hold the old values, the new ones, or anything in between).

On the course's simulated link (``workbook.link``) the modelled transfer time is paid inside
``wait()``, so this overlap is real wall-clock time saved on a CPU too; the profiler trace shows
the all-reduce on the ``link`` track and your compute on the main thread, side by side.

Two exercises:

1. ``overlapped_all_reduce(tensor, compute)``: one all-reduce hidden behind one piece of
   independent compute (think: gradients of the last layer being reduced while the backward pass
   of the layer below runs).
2. ``pipelined_all_reduce(chunks, layer)``: a batch cut into chunks. Each chunk's output needs
   an all-reduce (as a row-parallel linear layer's output does in tensor parallelism); chunk k's
   all-reduce travels while chunk k+1 is computed. This is the heart of Domino (lab 6).

Run it: ``workbook run async_overlap`` (the grader's checks, then serial vs overlapped time on
the simulated dgx-h100 link), ``python labs/async_overlap.py --trace-dir runs/async`` or
``torchrun --nproc_per_node=2 labs/async_overlap.py``; grade it with
``workbook grade --lab async_overlap``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def overlapped_all_reduce(tensor: torch.Tensor, compute):
    """Sum ``tensor`` over every rank, in place, while ``compute()`` runs; return what
    ``compute()`` returned.

    ``compute`` is independent of ``tensor``: call it exactly once, after the all-reduce has
    started and before you wait for it. When this function returns, ``tensor`` must hold the sum
    (so the wait must have happened)."""
    # TODO: what makes dist.all_reduce return a handle at once? where must compute() run?
    raise NotImplementedError("not implemented yet: async_overlap.overlapped_all_reduce")
    return result


def pipelined_all_reduce(chunks: list[torch.Tensor], layer) -> list[torch.Tensor]:
    """Return ``[sum over ranks of layer(x) for x in chunks]``, with chunk k's all-reduce
    overlapping the computation of ``layer`` on chunk k+1.

    Call ``layer`` once per chunk, in order. Start each output's all-reduce asynchronously as
    soon as it is computed; wait for a chunk's all-reduce only once the next chunk's compute is
    done (keep at most two in flight); wait for the last one before returning. Every handle you
    start must be waited on exactly where its result is needed: not earlier (no overlap), not
    never (the numbers may not be there)."""
    outputs: list[torch.Tensor] = []
    # TODO: keep one handle in flight: after which compute may you wait on it? which one is left at
    #       the end?
    raise NotImplementedError("not implemented yet: async_overlap.pipelined_all_reduce")
    return outputs


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
