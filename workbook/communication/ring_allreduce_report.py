"""Figures of the ring_allreduce lab: your ring's bandwidth against the built-in all-reduce.

For a few tensor sizes S, each rank all-reduces S bytes of float32 with your
``ring_all_reduce`` and with ``dist.all_reduce`` (the fastest of ``ITERS`` runs after a
warm-up, the slowest rank's time t). nccl-tests turns t into

* **algbw** = S / t: how fast the all-reduce went, from the user's point of view;
* **busbw** = algbw * 2(n-1)/n: the rate each rank's link ran at. A ring moves 2(n-1)/n S per
  rank, the least any all-reduce can, so busbw is comparable across n.

On a simulated link (``--link``) the alpha-beta model's ring and tree times are printed beside
them (the lab's ``ring_time`` / ``tree_time``, left out while they are stubs): the simulation,
not measured hardware. With
``trace_dir`` one 1 MiB all-reduce of each runs under the profiler (``record_function``
ranges "your ring" and "built-in"), each a step of its own (``traced_step``: 0 yours, 1 the
built-in), so ``workbook trace summary DIR --step N`` and the trace report show each apart.
"""
from __future__ import annotations


from workbook.measure.profiled_step import best_time
from workbook.runtime.ranks import device

WORLD_SIZE = 4
SIZES = (64 << 10, 1 << 20, 8 << 20)            # bytes
ITERS = 5
TRACED = ("your ring", "built-in")                 # with trace_dir: step 0, step 1


def _timed(fn, tensor) -> float:
    fn(tensor.clone())                                     # warm-up (and connection set-up)
    return best_time(fn, tensor.clone, ITERS)


def run(trace_dir=None, impl=None) -> dict:
    import torch
    import torch.distributed as dist

    from workbook import link
    from workbook.grading.labs import load_lab
    lab = load_lab("ring_allreduce", impl)
    n = dist.get_world_size()
    dev = device()                                        # the rank's: NCCL takes no CPU tensor
    sim = link.current_link()
    rows = []
    for size in SIZES:
        x = torch.ones(size // 4, device=dev)
        row = {"bytes": size, "ring_s": _timed(lab.ring_all_reduce, x),
               "builtin_s": _timed(dist.all_reduce, x)}
        if sim is not None and n > 1:
            try:                                          # your cost model, once written
                row["model_ring_s"] = lab.ring_time(size, n, sim.latency_s, sim.bandwidth_Bps)
                row["model_tree_s"] = lab.tree_time(size, n, sim.latency_s, sim.bandwidth_Bps)
            except NotImplementedError:
                row.pop("model_ring_s", None)
        rows.append(row)
    if trace_dir is not None:                             # 1 MiB, profiled: yours, then the built-in
        from workbook.trace.capture import rank_trace, traced_step
        x = torch.ones((1 << 20) // 4, device=dev)
        with rank_trace(trace_dir, lab="ring_allreduce"):
            for k, (name, fn) in enumerate(zip(TRACED, (lab.ring_all_reduce, dist.all_reduce))):
                dist.barrier()                            # between the steps: in neither
                with traced_step(k), torch.profiler.record_function(name):
                    fn(x.clone())
    backend = "gloo" if link.is_link_backend(dist.get_backend()) else dist.get_backend()
    return {"rank": dist.get_rank(), "world_size": n, "backend": backend,
            "link": sim.label if sim else None, "rows": rows,
            "trace_dir": None if trace_dir is None else str(trace_dir)}


def describe(results: list[dict]) -> str:
    n, first = len(results), results[0]
    factor = 2 * (n - 1) / n if n > 1 else 0.0
    where = first["link"] or f"{first['backend']} on this machine, measured"
    lines = [f"ring all-reduce figures: {n} ranks, float32, {where}",
             f"{'size':>8}  {'':<12}{'time us':>10}{'algbw GB/s':>12}{'busbw GB/s':>12}"]
    for k, row in enumerate(first["rows"]):
        size = row["bytes"]
        times = {name: max(r["rows"][k][key] for r in results)          # the slowest rank
                 for name, key in (("your ring", "ring_s"), ("built-in", "builtin_s"))}
        if "model_ring_s" in row:
            times.update({"model: ring": row["model_ring_s"], "model: tree": row["model_tree_s"]})
        label = f"{size >> 10} KiB" if size < (1 << 20) else f"{size >> 20} MiB"
        for j, (name, t) in enumerate(times.items()):
            lines.append(f"{label if j == 0 else '':>8}  {name:<12}{t * 1e6:>10.0f}"
                         f"{size / t / 1e9:>12.3f}{size / t * factor / 1e9:>12.3f}")
    lines.append(f"busbw = algbw * 2(n-1)/n (nccl-tests); time: the slowest rank, fastest of {ITERS}"
                 + ("; model: the lab's ring_time / tree_time on the simulated link"
                    if "model_ring_s" in first["rows"][0] else ""))
    if first.get("trace_dir"):
        from workbook.measure.output import steps_line
        lines.append(steps_line(first["trace_dir"], (f"{name} (1 MiB)" for name in TRACED)))
    return "\n".join(lines)
