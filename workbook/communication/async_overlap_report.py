"""Figures of the async_overlap lab: the same work, one thing after the other or overlapped.

On 2 ranks over the simulated dgx-h100 link, with compute that lasts about twice the modelled
all-reduce of 256 KiB (a chain of matmuls, independent of the tensor in flight):

* **one all-reduce**: a synchronous ``dist.all_reduce`` then the compute (serial), against
  your ``overlapped_all_reduce`` (the compute runs while the bytes travel);
* **4 chunks**: compute and synchronously all-reduce each chunk in turn (serial), against your
  ``pipelined_all_reduce`` (chunk k's all-reduce travels while chunk k+1 computes).

Serial is at least compute + communication; perfect overlap is max(compute, communication)
for one all-reduce, and for the pipeline the model of its schedule (``pipelined_step_s``): the
"ideal" column.
With ``trace_dir`` both overlapped runs are profiled, each a step of its own (``traced_step``:
0 the overlapped all-reduce, 1 the pipeline), and the share of communication hidden behind
compute is read from each rank's trace, step by step.

* **your prediction**: ``predict_pipelined_ms`` for a pipeline of ``PREDICTED`` chunks through a
  real matmul layer on this link, beside the model (``pipelined_model_ms``, the package's own
  arithmetic of the same schedule) and the step measured on this run (wall clock, slowest rank,
  simulated link). A prediction not written yet shows as ``-``.
"""
from __future__ import annotations

import time

WORLD_SIZE = 2
LINK = "dgx-h100"
ELEMENTS, CHUNKS = 1 << 16, 4
PREDICTED = dict(chunks=4, rows=64, d_in=8192, d_out=1024)    # the predicted pipeline's shapes
TRACED = ("overlapped one", "pipelined chunks")                # with trace_dir: step 0, step 1


def pipelined_step_s(compute_s: float, comm_s: float, chunks: int) -> float:
    """The model of the pipelined schedule's step, in seconds: chunk k is computed, its
    all-reduce issued, then chunk k-1's all-reduce waited on; the link carries one all-reduce at
    a time, in issue order (``workbook.link``). From the first compute's start to the last
    all-reduce's end, each piece lasting exactly its modelled time."""
    computed = link_free = 0.0          # when the last compute ended; when the link is free
    done = []                           # when each chunk's all-reduce ends
    for k in range(chunks):
        start = computed if k < 2 else max(computed, done[k - 2])   # waited on chunk k-2's
        computed = start + compute_s
        link_free = max(computed, link_free) + comm_s
        done.append(link_free)
    return done[-1] if done else 0.0


def pipelined_model_ms(link, n: int, chunks: int, rows: int, d_in: int, d_out: int) -> float:
    """The model's step time, in ms, of ``pipelined_all_reduce`` on ``n`` ranks over ``link``:
    ``chunks`` float32 ``[rows, d_in]`` chunks through ``x @ W`` (``W`` ``[d_in, d_out]``, 2
    FLOPs per multiply-add at ``link.local_flops``), each ``[rows, d_out]`` output all-reduced
    (``link.op_time``: alpha plus the bus bytes over the bandwidth). What
    ``predict_pipelined_ms`` is graded against."""
    compute_s = 2.0 * rows * d_in * d_out / link.local_flops
    comm_s = link.op_time("all_reduce", 4 * rows * d_out, n)
    return pipelined_step_s(compute_s, comm_s, chunks) * 1e3


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
        from workbook.trace.capture import rank_trace, traced_step
        dist.barrier()
        with rank_trace(trace_dir, lab="async_overlap"):
            for k, name in enumerate(TRACED):
                with traced_step(k), torch.profiler.record_function(name):
                    runs[name]()
    chunk_s = sim.op_time("all_reduce", ELEMENTS, n) if sim else 0.0      # a quarter of the bytes
    out = {"rank": rank, "link": sim.label if sim else None, "comm_ms": comm_s * 1e3,
           "chunk_comm_ms": chunk_s * 1e3,
           "compute_ms": busy_s * 1e3, "ms": times}
    if sim is not None:
        out["prediction"] = _prediction(lab, sim, n)
    if trace_dir is not None:
        out["trace_dir"] = str(trace_dir)
        if sim is not None and n > 1:
            t = trace.load_trace(Path(trace_dir) / f"rank{rank}.trace.json")
            out["hidden_pct"] = {name: trace.overlap_pct(t, step=k) for k, name in enumerate(TRACED)}
    return out


def _prediction(lab, sim, n: int) -> dict:
    """Your prediction of the ``PREDICTED`` pipeline, the model's, and the step measured (wall
    clock, after a warm-up); None for what is not written yet."""
    import torch
    import torch.distributed as dist
    p = PREDICTED
    try:
        predicted = float(lab.predict_pipelined_ms(sim, n, **p))
    except (NotImplementedError, TypeError, ValueError):     # not written yet, or not a number
        predicted = None
    from workbook.runtime import ranks
    device = ranks.device()                         # cuda:N on GPU ranks (NCCL takes no CPU tensor)
    g = torch.Generator().manual_seed(dist.get_rank())
    chunks = [torch.randn(p["rows"], p["d_in"], generator=g).to(device) for _ in range(p["chunks"])]
    w = (torch.randn(p["d_in"], p["d_out"], generator=g) / p["d_in"] ** 0.5).to(device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    measured = None
    try:
        lab.pipelined_all_reduce(chunks, lambda c: c @ w)                # warm-up
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        lab.pipelined_all_reduce(chunks, lambda c: c @ w)
        sync()
        measured = (time.perf_counter() - t0) * 1e3
    except NotImplementedError:
        pass
    dist.barrier()
    t0 = time.perf_counter()
    chunks[0] @ w                                   # one chunk's compute, every rank at once
    sync()
    compute_ms = (time.perf_counter() - t0) * 1e3
    return {"predicted_ms": predicted, "model_ms": pipelined_model_ms(sim, n, **p),
            "measured_ms": measured, "compute_model_ms":
                2e3 * p["rows"] * p["d_in"] * p["d_out"] / sim.local_flops,
            "compute_ms": compute_ms}


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
             f"{pipelined_step_s(comp, first['chunk_comm_ms'], CHUNKS):>10.1f}"]
    if "hidden_pct" in first:
        for name in TRACED:
            pct = ", ".join(f"rank {r['rank']}: {r['hidden_pct'][name]:.0f}%" for r in results
                            if r["hidden_pct"].get(name) is not None)
            lines.append(f"communication hidden behind compute (trace), {name}: {pct or '-'}")
        lines.append("  (the pipeline's last chunk's all-reduce has nothing left to hide behind)")
    if first.get("trace_dir"):
        from workbook.measure.output import steps_line
        lines.append(steps_line(first["trace_dir"], TRACED))
    if first.get("prediction"):
        from workbook.grading.predictions import comparison_lines
        p = PREDICTED
        measured = [r["prediction"]["measured_ms"] for r in results]
        pred = first["prediction"]
        lines.append(f"your prediction: pipelined_all_reduce of {p['chunks']} chunks "
                     f"[{p['rows']}, {p['d_in']}] @ [{p['d_in']}, {p['d_out']}] on "
                     f"{len(results)} ranks (measured: wall clock, slowest rank, simulated link)")
        lines += comparison_lines([
            ("pipelined step", pred["predicted_ms"], pred["model_ms"],
             None if None in measured else max(measured)),
            ("one chunk's compute", None, pred["compute_model_ms"],
             max(r["prediction"]["compute_ms"] for r in results))])
        lines.append("  (the model's compute rate is the link's calibration, one rank alone; the "
                     "ranks share this machine's cores)")
    return "\n".join(lines)
