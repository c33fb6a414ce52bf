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

Run it: ``python solutions/async_overlap.py --nproc 2 --link dgx-h100`` (or ``workbook run
async_overlap --nproc 2 --link dgx-h100 --trace-dir runs/async``); grade it with
``workbook grade --lab async_overlap``.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist


def overlapped_all_reduce(tensor: torch.Tensor, compute):
    """Sum ``tensor`` over every rank, in place, while ``compute()`` runs; return what
    ``compute()`` returned.

    ``compute`` is independent of ``tensor``: call it exactly once, after the all-reduce has
    started and before you wait for it. When this function returns, ``tensor`` must hold the sum
    (so the wait must have happened)."""
    ### BEGIN SOLUTION hint: start the all-reduce (async_op=True), call compute(), then wait
    work = dist.all_reduce(tensor, async_op=True)
    result = compute()
    work.wait()
    ### END SOLUTION
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
    ### BEGIN SOLUTION hint: keep the last chunk's work; wait it after starting the next one's
    pending = None
    for x in chunks:
        y = layer(x)
        work = dist.all_reduce(y, async_op=True)
        if pending is not None:
            pending.wait()                 # chunk k is done; chunk k+1's transfer has started
        pending = work
        outputs.append(y)
    if pending is not None:
        pending.wait()
    ### END SOLUTION
    return outputs


# --------------------------------------------------------------------------- self-check
def _busy(seconds: float, n: int = 384):
    """Independent compute for about ``seconds``: a chain of matrix products."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g) / n ** 0.5
    b = a.clone()
    t0 = time.perf_counter()
    steps = 0
    while time.perf_counter() - t0 < seconds or steps == 0:
        b = torch.tanh(a @ b)
        steps += 1
    return b


def _sample(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-9, 10, shape, generator=g).float()


def self_check(trace_dir=None) -> dict:
    """On every rank: both exercises against the synchronous all-reduce, with timings.

    The compute given to each exercise lasts about twice the modelled all-reduce (on
    ``--link none`` the transfer is nearly free and there is little to see). With ``trace_dir``
    the overlapped step is profiled, and the trace's overlap % is added."""
    from contextlib import nullcontext

    from workbook import link
    rank, n = dist.get_rank(), dist.get_world_size()
    sim = link.current_link()
    size = 1 << 16                                             # float32 elements: 256 KiB
    comm_s = sim.op_time("all_reduce", 4 * size, n) if sim else 0.0
    busy_s = max(2.0 * comm_s, 0.005)
    out = {"rank": rank, "world_size": n, "link": sim.label if sim else "none",
           "modelled_all_reduce_ms": comm_s * 1e3}
    x = _sample((size,), rank)
    expected = x.clone()
    dist.all_reduce(expected)
    chunks = [_sample((5, 64), 100 * rank + k) for k in range(4)]
    w = _sample((64, size // 64 // 4), 7 + rank)

    def layer(c):
        _busy(busy_s)
        return c @ w

    want = []
    for c in chunks:
        y = c @ w
        dist.all_reduce(y)
        want.append(y)
    tracing = nullcontext()
    if trace_dir is not None:
        from workbook.trace.capture import rank_trace
        tracing = rank_trace(trace_dir, lab="async_overlap")
    try:
        got = x.clone()
        dist.barrier()                      # outside the trace: a barrier is link time too
        with tracing:
            t0 = time.perf_counter()
            overlapped_all_reduce(got, lambda: _busy(busy_s))
            t1 = time.perf_counter()
            outs = pipelined_all_reduce(chunks, layer)
            t2 = time.perf_counter()
    except NotImplementedError as exc:
        out["status"] = str(exc)
        return out
    ok1 = torch.equal(got, expected)
    ok2 = len(outs) == len(want) and all(torch.equal(a, b) for a, b in zip(outs, want))
    out["status"] = "ok" if ok1 and ok2 else (
        ("overlapped_all_reduce differs from the synchronous all-reduce; " if not ok1 else "")
        + ("pipelined_all_reduce differs from the synchronous all-reduce" if not ok2 else ""))
    out.update(compute_ms=busy_s * 1e3, overlapped_ms=(t1 - t0) * 1e3,
               pipelined_ms=(t2 - t1) * 1e3)
    if trace_dir is not None and n > 1 and sim is not None:
        from pathlib import Path

        from workbook import trace
        out["trace_overlap_pct"] = trace.overlap_pct(
            trace.load_trace(Path(trace_dir) / f"rank{rank}.trace.json"))
    return out


def describe(results: list[dict]) -> str:
    first, n = results[0], len(results)
    states = {r["status"] for r in results}
    summary = f"{states.pop()} on every rank" if len(states) == 1 else "; ".join(
        f"rank {r['rank']}: {r['status']}" for r in results)
    lines = [f"async overlap lab, {n} rank(s): {summary}"]
    if "overlapped_ms" in first:
        slow = max(r["overlapped_ms"] for r in results)
        comm, comp = first["modelled_all_reduce_ms"], first["compute_ms"]
        lines.append(f"one all-reduce (modelled {comm:.1f} ms) + {comp:.1f} ms of compute: "
                     f"{slow:.1f} ms overlapped, {comm + comp:.1f} ms one after the other")
        lines.append(f"4 chunks of {comp:.1f} ms compute, pipelined: "
                     f"{max(r['pipelined_ms'] for r in results):.1f} ms "
                     f"({4 * (comm + comp):.1f} ms one after the other)")
        if "trace_overlap_pct" in first:
            pct = ", ".join(f"rank {r['rank']}: {r['trace_overlap_pct']:.0f}%" for r in results
                            if r.get("trace_overlap_pct") is not None)
            lines.append(f"communication hidden behind compute (from the trace): {pct} "
                         "(the last chunk's all-reduce has nothing left to hide behind)")
        lines.append(first["link"])
    return "\n".join(lines)


if __name__ == "__main__":
    from workbook.launch import main
    main(self_check, describe=describe)
