# Generated from solutions/async_overlap.py by `workbook assign` (level: standard): this is your file to edit.
# Replace each `raise NotImplementedError` with your code; check it with `workbook run async_overlap`
# (or `workbook watch async_overlap`). Stuck on task N? `workbook hint async_overlap N`, one hint at a time.
#
# Your tasks (12 pts in all):
#   1. overlapped_all_reduce (5 pts): Sum a tensor over every rank, in place, with the transfer
#      hidden behind independent compute; return what the compute returned.
#   2. pipelined_all_reduce (5 pts): Run `layer` on each chunk and return the list of its outputs,
#      each summed over every rank, with each chunk's all-reduce hidden behind the *next* chunk's
#      compute.
#   3. predict_pipelined_ms (2 pts): Predict, before running it, the step time in milliseconds of
#      your `pipelined_all_reduce` on `n` ranks over the simulated `link`.
"""Lab `async_overlap`: start a collective, keep computing, and wait only when you need the answer.

Lesson 3 ("The same step, asynchronous") shows a rank hiding an all-reduce behind independent
compute on the course's simulated link, where the modelled transfer time is real wall-clock time
on a CPU too, and the profiler trace shows the all-reduce on the ``link`` track beside your
compute. In this lab you build that schedule yourself, then a pipeline of it, and predict how long
the pipeline takes before you run it:

1. ``overlapped_all_reduce``: one all-reduce hidden behind one piece of independent compute;
2. ``pipelined_all_reduce``: a batch cut into chunks, each chunk's output all-reduced while the
   next chunk is computed (the heart of Domino, lesson 6);
3. ``predict_pipelined_ms``: the step time of your pipeline, from the link's alpha-beta figures
   and the layer's shapes (lesson 3, "Predicting the pipeline").

Run it: ``workbook run async_overlap`` (the grader's checks, then serial vs overlapped time on the
simulated dgx-h100 link, and your prediction beside the model and the measurement),
``python labs/async_overlap.py --trace-dir runs/async`` or
``torchrun --nproc_per_node=2 labs/async_overlap.py``; grade it with
``workbook grade --lab async_overlap``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def overlapped_all_reduce(tensor: torch.Tensor, compute):
    """Sum a tensor over every rank, in place, with the transfer hidden behind independent
    compute; return what the compute returned.

    Contract: ``compute`` takes no argument and never touches the tensor; it runs exactly once,
    and it must run *while the all-reduce is in flight* (lesson 3, "The same step,
    asynchronous"), neither before the transfer starts nor after it has finished. On return the
    tensor holds the sum over all ranks (a grader's spy delivers the sum only once you have asked
    for it, as a GPU would). Any dtype, any shape, any number of ranks (one included)."""
    raise NotImplementedError("not implemented yet: async_overlap.overlapped_all_reduce")
    return result


def pipelined_all_reduce(chunks: list[torch.Tensor], layer) -> list[torch.Tensor]:
    """Run ``layer`` on each chunk and return the list of its outputs, each summed over every
    rank, with each chunk's all-reduce hidden behind the *next* chunk's compute.

    Contract: ``layer`` maps one chunk to one tensor; call it once per chunk, in the order of
    ``chunks``. Outputs come back in the same order, one per chunk (an empty list for no chunk).
    Overlap (lesson 3, "A pipeline of all-reduces"): chunk k's all-reduce must travel while
    chunk k+1 is computed, so no chunk waits on its own all-reduce, and at most two all-reduces
    are in flight at once. Every all-reduce you start is finished before the function returns,
    and none is finished earlier than the overlap requires."""
    outputs: list[torch.Tensor] = []
    raise NotImplementedError("not implemented yet: async_overlap.pipelined_all_reduce")
    return outputs


def predict_pipelined_ms(link, n: int, chunks: int, rows: int, d_in: int, d_out: int) -> float:
    """Predict, before running it, the step time in milliseconds of your
    ``pipelined_all_reduce`` on ``n`` ranks over the simulated ``link``.

    The step: ``chunks`` float32 chunks of shape ``[rows, d_in]``, each through a layer that
    multiplies it by a ``[d_in, d_out]`` weight (a matmul: lesson 3 says how many FLOPs), each
    output ``[rows, d_out]`` all-reduced over the ``n`` ranks. From the start of the first chunk's
    compute to the end of the last all-reduce, with your schedule.

    Inputs: the link is a ``workbook.link.Link``, a calibrated simulated link: its fields hold
    the alpha-beta figures (the latency per operation, in seconds, and the bus bandwidth, in
    bytes per second) and the matmul rate this machine measured, in FLOP/s (lesson 3, "Predicting
    the pipeline", names them). It carries one operation at a time, in issue order.
    Output: a float, in ms. The model: lesson 3, "Predicting the pipeline" (and lesson 2 for an
    all-reduce's cost). The grader compares your number with the package's model of the same
    schedule for several links, rank counts and shapes."""
    raise NotImplementedError("not implemented yet: async_overlap.predict_pipelined_ms")
    return step_s * 1e3


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
