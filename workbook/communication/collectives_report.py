"""Figures of the collectives lab: what each of your builds sent, and how long it took.

Each build runs once on a float32 tensor of ``SIZE`` bytes (root n-1, ``n`` = the ranks), under
the flight recorder (``workbook.runtime.flight.RECORDER``), which sees every ``send / isend`` a rank
makes. Per build:

* **messages**: point-to-point sends of the busiest rank, and of all ranks together;
* **MB sent**: bytes the busiest rank sent. Compare with lesson 1's table ("What each build
  costs"): the naive broadcast's root sends (n-1) S, the tree's root ceil(log2 n) S, an
  all-gather (n-1)/n S per rank;
* **time**: the slowest rank's, fastest of ``ITERS``, beside the built-in doing the same job.

With ``trace_dir`` each build runs once more under the profiler, in a ``record_function``
range named after it, each a step of its own (``traced_step``: ``workbook trace summary DIR
--step N`` gives build N's figures alone).
"""
from __future__ import annotations


from workbook.measure.profiled_step import best_time
from workbook.runtime.ranks import device

WORLD_SIZE = 4
SIZE = 1 << 20                       # bytes of the full buffer
ITERS = 3
SENDS = ("send", "isend")


def run(trace_dir=None, impl=None) -> dict:
    import torch
    import torch.distributed as dist

    from workbook import link
    from workbook.runtime.flight import RECORDER
    from workbook.grading.labs import load_lab
    lab = load_lab("collectives", impl)
    rank, n = dist.get_rank(), dist.get_world_size()
    root, k = n - 1, SIZE // 4 // n * n                   # float32 elements, a multiple of n
    dev = device()                                        # the rank's: NCCL takes no CPU tensor
    x = torch.ones(k, device=dev)
    chunk = torch.tensor_split(x, n)[rank].clone()
    m = chunk.numel()                                     # even chunks
    full = [torch.ones(m, device=dev) for _ in range(n)] if rank == root else None
    bucket = [torch.empty(m, device=dev) for _ in range(n)] if rank == root else None
    # build: (your build, the built-in doing the same), each a function of a fresh tensor
    builds = {
        "broadcast": (lambda t: lab.broadcast(t, root), lambda t: dist.broadcast(t, root)),
        "tree_broadcast": (lambda t: lab.tree_broadcast(t, root), lambda t: dist.broadcast(t, root)),
        "reduce": (lambda t: lab.reduce(t, root), lambda t: dist.reduce(t, root)),
        "tree_reduce": (lambda t: lab.tree_reduce(t, root), lambda t: dist.reduce(t, root)),
        "all_reduce": (lab.all_reduce, dist.all_reduce),
        "gather": (lambda t: lab.gather(t[:m], bucket, root),
                   lambda t: dist.gather(t[:m], bucket, root)),
        "scatter": (lambda t: lab.scatter(t[:m], full, root),
                    lambda t: dist.scatter(t[:m], full, root)),
        "all_gather": (lambda t: lab.all_gather(t, chunk),
                       lambda t: dist.all_gather_into_tensor(t, chunk)),
        "reduce_scatter": (lambda t: lab.reduce_scatter(torch.empty_like(chunk), t),
                           lambda t: dist.reduce_scatter_tensor(torch.empty_like(chunk), t)),
        "barrier": (lambda t: lab.barrier(), lambda t: dist.barrier()),
    }
    sim = link.current_link()
    out = {"rank": rank, "world_size": n, "root": root, "builds": {},
           "where": sim.label if sim else "gloo on this machine, measured"}
    for name, (mine, builtin) in builds.items():
        RECORDER.reset()
        mine(x.clone())
        sends = [c for c in RECORDER.calls if c.name in SENDS]
        row = {"messages": len(sends), "bytes": sum(c.size_bytes for c in sends)}
        for key, fn in (("mine_s", mine), ("builtin_s", builtin)):
            row[key] = best_time(fn, x.clone, ITERS)
        out["builds"][name] = row
    if trace_dir is not None:                             # each build once more, profiled
        from workbook.trace.capture import rank_trace, traced_step
        with rank_trace(trace_dir, lab="collectives"):
            for k, (name, (mine, _)) in enumerate(builds.items()):
                with traced_step(k), torch.profiler.record_function(name):
                    mine(x.clone())
        out["trace_dir"] = str(trace_dir)
    return out


def describe(results: list[dict]) -> str:
    n, first = len(results), results[0]
    lines = [f"collectives figures: {n} ranks, root {first['root']}, a {SIZE >> 20} MiB float32 "
             f"buffer (gather/scatter: one chunk per rank), {first['where']}",
             f"{'build':<16}{'messages':>9}{'all ranks':>10}{'MB sent':>9}{'time ms':>9}"
             f"{'built-in ms':>12}"]
    for name in first["builds"]:
        rows = [r["builds"][name] for r in results]
        lines.append(f"{name:<16}{max(r['messages'] for r in rows):>9}"
                     f"{sum(r['messages'] for r in rows):>10}"
                     f"{max(r['bytes'] for r in rows) / 1e6:>9.2f}"
                     f"{max(r['mine_s'] for r in rows) * 1e3:>9.2f}"
                     f"{max(r['builtin_s'] for r in rows) * 1e3:>12.2f}")
    lines.append("messages and MB sent: the busiest rank's sends (flight recorder); time: the "
                 f"slowest rank, fastest of {ITERS}")
    if first.get("trace_dir"):
        from workbook.measure.output import steps_line
        lines.append(steps_line(first["trace_dir"], first["builds"]))
    return "\n".join(lines)
