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


### BEGIN CHALLENGE: the overlapped all-reduce, its pipeline, and the pipeline's predicted time
def overlapped_all_reduce(tensor: torch.Tensor, compute):
    """Sum a tensor over every rank, in place, with the transfer hidden behind independent
    compute; return what the compute returned.

    Contract: ``compute`` takes no argument and never touches the tensor; it runs exactly once,
    and it must run *while the all-reduce is in flight* (lesson 3, "The same step,
    asynchronous"), neither before the transfer starts nor after it has finished. On return the
    tensor holds the sum over all ranks (a grader's spy delivers the sum only once you have asked
    for it, as a GPU would). Any dtype, any shape, any number of ranks (one included)."""
    ### BEGIN SOLUTION
    ### hint 1: a collective can be started without blocking; lesson 3, "The same step,
    ###     asynchronous", shows the three steps of an overlapped step.
    ### hint 2: start the all-reduce so that it returns at once with a handle, run the compute
    ###     while it travels, then block on the handle before returning.
    ### hint 3: what makes dist.all_reduce return a handle at once? where must compute() run,
    ###     relative to the handle's wait()?
    work = dist.all_reduce(tensor, async_op=True)
    result = compute()
    work.wait()
    ### END SOLUTION
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
    ### BEGIN SOLUTION
    ### hint 1: the overlapped step of task 1, repeated, where the "independent compute" hiding
    ###     chunk k's transfer is chunk k+1's layer; lesson 3, "A pipeline of all-reduces".
    ### hint 2: for each chunk: compute its output, start its all-reduce without blocking, and
    ###     only then finish the previous chunk's all-reduce; remember the newest handle. After the
    ###     loop one all-reduce is still in flight: finish it.
    ### hint 3: keep one handle in flight: after which compute may you wait on it? which one is
    ###     left at the end?
    pending = None
    for x in chunks:
        y = layer(x)
        work = dist.all_reduce(y, async_op=True)
        if pending is not None:
            pending.wait()                 # the previous chunk is done; this chunk's is travelling
        pending = work
        outputs.append(y)
    if pending is not None:
        pending.wait()
    ### END SOLUTION
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
    ### BEGIN SOLUTION
    ### hint 1: two durations per chunk, its compute and its all-reduce, and a timeline in which
    ###     each chunk's all-reduce runs beside the next chunk's compute; lesson 3, "Predicting
    ###     the pipeline".
    ### hint 2: the compute time is the layer's FLOPs over the measured rate; the all-reduce is
    ###     the latency plus the bus bytes (not the payload) over the bandwidth; then add up the
    ###     timeline: the first compute and the last all-reduce hide behind nothing, every step in
    ###     between costs the longer of the two.
    ### hint 3: compute: the matmul's 2 * rows * d_in * d_out FLOPs over the measured rate;
    ###     all-reduce: alpha + the output's bytes (4 per float32 element) * 2(n - 1)/n over the
    ###     bandwidth; step: the first compute + the last all-reduce + (chunks - 1) times the
    ###     longer of the two; then seconds to ms.
    compute_s = 2.0 * rows * d_in * d_out / link.local_flops
    bus_bytes = 4.0 * rows * d_out * 2 * (n - 1) / n
    comm_s = link.latency_s + bus_bytes / link.bandwidth_Bps if n > 1 else 0.0
    if chunks <= 0:
        return 0.0
    step_s = compute_s + comm_s + (chunks - 1) * max(compute_s, comm_s)
    ### END SOLUTION
    return step_s * 1e3
### END CHALLENGE


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
