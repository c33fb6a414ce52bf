"""The demo: 4 CPU ranks run every collective on the simulated DGX-H100 link, traced.

``workbook demo`` (what the README's first command runs) shows in one minute what the course is
about: each primitive's cost on a realistic link, and one asynchronous all-reduce hidden behind
compute, with the per-rank traces and an HTML report to look at.
"""
from __future__ import annotations

import time
from pathlib import Path

SIZE = 1 << 18            # float32 elements per rank: 1 MiB


def _collectives(tensor, world):
    """(name, function) for every built-in collective on a buffer like ``tensor``."""
    import torch
    import torch.distributed as dist
    rank = dist.get_rank()
    chunk = torch.empty_like(tensor[: tensor.numel() // world])
    gathered = torch.empty(world * chunk.numel(), dtype=tensor.dtype)
    parts = list(gathered.chunk(world))
    return [
        ("broadcast", lambda: dist.broadcast(tensor, src=0)),
        ("reduce", lambda: dist.reduce(tensor, dst=0)),
        ("all_reduce", lambda: dist.all_reduce(tensor)),
        ("gather", lambda: dist.gather(chunk, parts if rank == 0 else None, dst=0)),
        ("all_gather", lambda: dist.all_gather_into_tensor(gathered, chunk)),
        ("scatter", lambda: dist.scatter(chunk, parts if rank == 0 else None, src=0)),
        ("reduce_scatter", lambda: dist.reduce_scatter_tensor(chunk, gathered)),
        ("barrier", lambda: dist.barrier()),
    ]


def demo_rank(run_dir: str) -> dict:
    """Runs on every rank: each collective once (timed), then an async all-reduce with compute."""
    import torch
    import torch.distributed as dist
    from torch.profiler import record_function
    from workbook import link
    from workbook.trace.capture import rank_trace

    world, rank = dist.get_world_size(), dist.get_rank()
    x = torch.full((SIZE,), float(rank + 1))
    timings = {}
    with rank_trace(run_dir, lab="demo"):
        for name, op in _collectives(x.clone(), world):
            dist.barrier()
            t0 = time.perf_counter()
            with record_function(name):
                op()
            timings[name] = time.perf_counter() - t0
        # overlap: an async all-reduce while this rank multiplies matrices of its own
        lk = link.current_link()
        modelled = lk.op_time("all_reduce", x.numel() * 4, world) if lk else 0.0
        a = torch.randn(256, 256)
        dist.barrier()
        t0 = time.perf_counter()
        with record_function("overlap: all_reduce || matmuls"):
            work = dist.all_reduce(x, async_op=True)
            t_c = time.perf_counter()
            while time.perf_counter() - t_c < modelled:
                a = torch.tanh(a @ a)
            work.wait()
        timings["all_reduce overlapped with compute"] = time.perf_counter() - t0
    expected = world * (world + 1) / 2
    return {"timings": timings, "all_reduce_ok": bool(torch.all(x == expected)),
            "modelled_all_reduce_s": modelled}


def run_demo(nproc: int = 4, link: str = "dgx-h100", out: str = "runs/demo") -> int:
    from workbook.runtime import launch
    from workbook import link as link_module
    run_dir = Path(out).resolve()
    print(f"starting {nproc} CPU ranks (gloo) on the {link} link preset ...", flush=True)
    t0 = time.perf_counter()
    results = launch.run(demo_rank, nproc, str(run_dir), backend="gloo", link=link, timeout=300)
    lk = link_module.PRESETS.get(link)
    print(f"ran in {time.perf_counter() - t0:.1f} s. Times on rank 0 "
          f"({'simulated link: ' + lk.description if lk else 'no link model'}):")
    size = SIZE * 4
    print(f"  {'collective':<36}{'ms':>9}   ({size / 2**20:.0f} MiB per rank)")
    for name, seconds in results[0]["timings"].items():
        print(f"  {name:<36}{seconds * 1e3:>9.1f}")
    ok = all(r["all_reduce_ok"] for r in results)
    print(f"all-reduce result correct on every rank: {ok}")
    overlapped = results[0]["timings"]["all_reduce overlapped with compute"]
    serial = results[0]["modelled_all_reduce_s"] * 2
    if serial:
        print(f"async all-reduce + equal compute: {overlapped * 1e3:.0f} ms vs {serial * 1e3:.0f} ms "
              f"if run one after the other ({overlapped / serial:.2f}x)")
    print(f"traces: {run_dir}/rank*.trace.json")
    try:
        from workbook.trace.report import write_report
        report = write_report(run_dir, run_dir / "report.html")
        print(f"trace report: {report or run_dir / 'report.html'}")
    except ImportError:
        pass
    return 0 if ok else 1
