"""Figures of the async_overlap lab: the same work, one thing after the other or overlapped.

On 2 ranks over the simulated dgx-h100 link, with compute that lasts about twice the modelled
all-reduce of 256 KiB (a chain of matmuls, independent of the tensor in flight):

* **one all-reduce**: a synchronous ``dist.all_reduce`` then the compute (serial), against
  your ``overlapped_all_reduce`` (the compute runs while the bytes travel);
* **4 chunks**: compute and synchronously all-reduce each chunk in turn (serial), against your
  ``pipelined_all_reduce`` (chunk k's all-reduce travels while chunk k+1 computes).

Serial is at least compute + communication; perfect overlap is max(compute, communication)
per piece (plus, for the pipeline, the last chunk's all-reduce, which has nothing left to hide
behind): the "ideal" column.
With ``trace_dir`` both overlapped runs are profiled and the share of communication hidden
behind compute is read from each rank's trace.
"""
from __future__ import annotations

import time

WORLD_SIZE = 2
LINK = "dgx-h100"
ELEMENTS, CHUNKS = 1 << 16, 4


def _busy(seconds: float, n: int = 384):
    """Independent compute for about ``seconds``: a chain of matrix products."""
    import torch
    a = torch.randn(n, n, generator=torch.Generator().manual_seed(0)) / n ** 0.5
    b, t0 = a.clone(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        b = torch.tanh(a @ b)
    return b


def run(trace_dir=None, impl=None) -> dict:
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from workbook import link, trace
    from workbook.grading.labs import load_lab
    lab = load_lab("async_overlap", impl)
    rank, n = dist.get_rank(), dist.get_world_size()
    sim = link.current_link()
    comm_s = sim.op_time("all_reduce", 4 * ELEMENTS, n) if sim else 0.0
    busy_s = max(2.0 * comm_s, 0.005)
    x = torch.ones(ELEMENTS)
    chunks = [torch.ones(8, 64) for _ in range(CHUNKS)]
    w = torch.ones(64, ELEMENTS // 8 // CHUNKS)           # each chunk's output: 1/4 of x's bytes

    def layer(c):
        _busy(busy_s)
        return c @ w

    def serial_one():
        dist.all_reduce(x.clone())
        _busy(busy_s)

    def serial_chunks():
        for c in chunks:
            dist.all_reduce(layer(c))

    runs = {"serial one": serial_one,
            "overlapped one": lambda: lab.overlapped_all_reduce(x.clone(), lambda: _busy(busy_s)),
            "serial chunks": serial_chunks,
            "pipelined chunks": lambda: lab.pipelined_all_reduce(chunks, layer)}
    times = {}
    for name, fn in runs.items():
        fn()                                              # warm-up
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times[name] = (time.perf_counter() - t0) * 1e3
    if trace_dir is not None:                             # the two overlapped runs, profiled
        from workbook.trace.capture import rank_trace
        dist.barrier()
        with rank_trace(trace_dir, lab="async_overlap"):
            runs["overlapped one"]()
            runs["pipelined chunks"]()
    chunk_s = sim.op_time("all_reduce", ELEMENTS, n) if sim else 0.0      # a quarter of the bytes
    out = {"rank": rank, "link": sim.label if sim else None, "comm_ms": comm_s * 1e3,
           "chunk_comm_ms": chunk_s * 1e3,
           "compute_ms": busy_s * 1e3, "ms": times}
    if trace_dir is not None and sim is not None and n > 1:
        out["hidden_pct"] = trace.overlap_pct(
            trace.load_trace(Path(trace_dir) / f"rank{rank}.trace.json"))
    return out


def describe(results: list[dict]) -> str:
    first = results[0]
    ms = {k: max(r["ms"][k] for r in results) for k in first["ms"]}   # the slowest rank
    comm, comp = first["comm_ms"], first["compute_ms"]
    from workbook.measure.output import where_measured
    where = where_measured(first["link"], without="gloo, no link model")
    lines = [f"async overlap figures: {len(results)} ranks, {where}",
             f"all-reduce of {4 * ELEMENTS >> 10} KiB: modelled {comm:.1f} ms; compute per piece "
             f"{comp:.1f} ms",
             f"{'':<16}{'serial ms':>10}{'overlapped ms':>15}{'ideal ms':>10}",
             f"{'one all-reduce':<16}{ms['serial one']:>10.1f}{ms['overlapped one']:>15.1f}"
             f"{max(comm, comp):>10.1f}",
             f"{f'{CHUNKS} chunks':<16}{ms['serial chunks']:>10.1f}{ms['pipelined chunks']:>15.1f}"
             f"{CHUNKS * max(comp, first['chunk_comm_ms']) + first['chunk_comm_ms']:>10.1f}"]
    if "hidden_pct" in first:
        pct = ", ".join(f"rank {r['rank']}: {r['hidden_pct']:.0f}%" for r in results
                        if r.get("hidden_pct") is not None)
        lines.append(f"communication hidden behind compute (trace, both overlapped runs): {pct} "
                     "(the last chunk's all-reduce has nothing left to hide behind)")
    return "\n".join(lines)
