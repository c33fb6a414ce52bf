"""``workbook bench``: time a collective over a sweep of sizes, nccl-tests style.

For each size S (bytes) the ranks run the collective ``--warmup`` times, then ``--iters``
times back to back; a rank's time is the mean of those, and the reported time is the slowest
rank's (a collective is done when its last rank is). From it, as nccl-tests does:

* algbw = S / time;
* busbw = algbw * bus factor, the rate the busiest link ran at: 2(n-1)/n for all-reduce,
  (n-1)/n for all-gather and reduce-scatter, 1 for broadcast and reduce
  (``workbook.link.bus_factor``).

S is the full buffer: for all-gather the gathered output, for reduce-scatter the input, so
that each rank contributes S/n. Data is float32 zeros (no value growth across iterations).

``--impl builtin`` times torch.distributed's own collective; ``labs``, ``solutions`` or a
folder time a lab's build: all_reduce is ``ring_allreduce.ring_all_reduce``, the others come
from the collectives lab (broadcast and reduce: the binomial-tree builds). On a simulated
link (``--link dgx-h100``, gloo on CPU) the numbers are the link model's, labelled
"simulated"; on GPUs (NCCL, or gloo with CUDA tensors) they are real, and the header names the
GPU model (and says so where several ranks share one GPU). No link is simulated unless asked for.

    workbook bench all_reduce --nproc 4 --impl solutions --sizes 1M,64M --json ring.json
"""
from __future__ import annotations

import json
import sys
import time

from workbook.measure.bench_cli import parse_size
from workbook.measure.output import human
from workbook.runtime.gpu import add_backend_argument

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
LAB_BUILDS = {"all_reduce": ("ring_allreduce", "ring_all_reduce"),
              "all_gather": ("collectives", "all_gather"),
              "reduce_scatter": ("collectives", "reduce_scatter"),
              "broadcast": ("collectives", "tree_broadcast"),
              "reduce": ("collectives", "tree_reduce")}


# --------------------------------------------------------------------------- sizes
def parse_sizes(spec: str, factor: int = 2) -> list[int]:
    """``"1K..64M"`` (every factor-th step), ``"1M,64M"``, or a mix: a sorted list of bytes."""
    if factor < 2:
        raise ValueError("--factor must be at least 2")
    sizes: set[int] = set()
    for part in spec.split(","):
        if ".." in part:
            lo, hi = (parse_size(p) for p in part.split(".."))
            if lo < 1 or hi < lo:
                raise ValueError(f"bad size range {part!r}")
            s = lo
            while s <= hi:
                sizes.add(s)
                s *= factor
        elif part.strip():
            sizes.add(parse_size(part))
    return sorted(sizes)


# --------------------------------------------------------------------------- on every rank
def _bench_rank(collective: str, size_bytes: int, impl: str, iters: int, warmup: int) -> dict:
    """Time ``collective`` on this rank; return its mean seconds per iteration and context."""
    import torch
    import torch.distributed as dist
    from workbook import link
    from workbook.runtime import launch
    n = dist.get_world_size()
    dev = launch.device()
    count = max(1, size_bytes // 4)
    if collective in ("all_gather", "reduce_scatter"):
        count = max(n, count // n * n)                     # equal chunks, as the built-ins need
    big = torch.zeros(count, device=dev)                   # float32[count]: the full buffer
    small = torch.zeros(count // n, device=dev) if collective in ("all_gather", "reduce_scatter") \
        else None                                          # float32[count/n]: one rank's chunk
    if impl == "builtin":
        calls = {"all_reduce": lambda: dist.all_reduce(big),
                 "all_gather": lambda: dist.all_gather_into_tensor(big, small),
                 "reduce_scatter": lambda: dist.reduce_scatter_tensor(small, big),
                 "broadcast": lambda: dist.broadcast(big, src=0),
                 "reduce": lambda: dist.reduce(big, dst=0)}
        name = f"torch.distributed.{collective}"
    else:
        from workbook.grading.labs import load_lab
        lab_name, fn_name = LAB_BUILDS[collective]
        fn = getattr(load_lab(lab_name, impl), fn_name)
        calls = {"all_reduce": lambda: fn(big),
                 "all_gather": lambda: fn(big, small),
                 "reduce_scatter": lambda: fn(small, big),
                 "broadcast": lambda: fn(big, 0),
                 "reduce": lambda: fn(big, 0)}
        name = f"{lab_name}.{fn_name}"
    step = calls[collective]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    sync()
    seconds = (time.perf_counter() - start) / iters
    sim = link.current_link()
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return {"seconds": seconds, "size_bytes": count * 4, "name": name,
            "backend": launch.context().backend, "device": where,
            "link": sim.label if sim is not None else None}


# --------------------------------------------------------------------------- the sweep
def run_bench(collective: str, nproc: int, *, impl: str = "builtin", link: str = "none",
              sizes=(1 << 20,), iters: int = 10, warmup: int = 2, backend: str | None = None,
              timeout: float = 600.0, progress: bool = True, out=print) -> dict:
    """Run the sweep on ``nproc`` fresh ranks; return the JSON document (and print a table)."""
    from workbook.runtime.launch import RankPool
    from workbook.link import bus_factor
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}: choose one of {', '.join(COLLECTIVES)}")
    from workbook.runtime.ranks import rank_layout
    factor = bus_factor(collective, nproc)
    layout = rank_layout(backend, nproc, link)
    rows = []
    with RankPool(nproc, layout.backend, link=link) as pool:
        try:
            from tqdm import tqdm
            bar = tqdm(sizes, desc=f"bench {collective}", unit="size", leave=False,
                       disable=not progress or len(sizes) < 4, file=sys.stderr)
            write = tqdm.write if not bar.disable else out
        except ImportError:                                 # tqdm is optional
            bar, write = sizes, out
        header = False
        for size in bar:
            per_rank = pool.run(_bench_rank, collective, size, impl, iters, warmup, link=link,
                                timeout=timeout)
            first = per_rank[0]
            if not header:
                write(f"# bench {collective}: {first['name']} on {nproc} rank(s); "
                      f"{source(first, layout)}")
                write(f"# time = slowest rank's mean over {iters} iterations ({warmup} warm-up); "
                      f"busbw = algbw * {factor:.3g}")
                write(f"{'size':>8} {'bytes':>12} {'time (us)':>12} {'algbw (GB/s)':>13} "
                      f"{'busbw (GB/s)':>13}")
                header = True
            seconds = max(r["seconds"] for r in per_rank)
            nbytes = first["size_bytes"]
            algbw = nbytes / seconds / 1e9
            rows.append({"size_bytes": nbytes, "time_us": seconds * 1e6,
                         "algbw_gbps": algbw, "busbw_gbps": algbw * factor})
            write(f"{human(nbytes):>8} {nbytes:>12} {seconds * 1e6:>12.1f} {algbw:>13.3f} "
                  f"{algbw * factor:>13.3f}")
    label = "none" if link in (None, "none") else f"simulated:{link}"
    return {"collective": collective, "nproc": nproc, "impl": impl, "link": label,
            "backend": layout.backend, "device": first["device"] if rows else None,
            "ranks_per_gpu": layout.ranks_per_gpu, "rows": rows}


def source(first: dict, layout) -> str:
    """Where the figures come from, for the table's header: the simulated link (labelled so), or
    the real hardware by name -- a GPU's model, with a warning where ranks share a GPU (their
    "bandwidth" is then copies inside one GPU's memory, not an interconnect)."""
    if first["link"]:
        return f"{first['link']} -- SIMULATED numbers"
    where = f"real {first['device']} ({first['backend']}), no simulated link"
    if layout.ranks_per_gpu > 1:
        copies = "within one GPU" if first["backend"] == "nccl" else "through host memory"
        where += (f"; {layout.ranks_per_gpu} ranks share each GPU: the bandwidth is copies "
                  f"{copies}, not an interconnect")
    return where


# --------------------------------------------------------------------------- the CLI
def _handle(args) -> int:
    from workbook.link import preset_names
    if args.link not in preset_names():
        raise ValueError(f"unknown link preset {args.link!r}: choose one of {', '.join(preset_names())}")
    try:
        doc = run_bench(args.collective, args.nproc, impl=args.impl, link=args.link,
                        sizes=parse_sizes(args.sizes, args.factor), iters=args.iters,
                        warmup=args.warmup, backend=args.backend, timeout=args.timeout,
                        progress=not args.no_progress)
    except NotImplementedError as exc:
        print(f"workbook bench: {exc} (finish the lab first, or use --impl builtin)",
              file=sys.stderr)
        return 1
    if args.json:
        from pathlib import Path
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"# written to {args.json}")
    return 0


# What ``workbook bench`` can time, one line each, for its --help. ``domino`` is not a collective:
# ``workbook.cli.main`` sends ``workbook bench domino ...`` to its own parser
# (``workbook.cli.model_bench_parser``, options in ``workbook.tensor_parallel.domino_bench`` and the others) before argparse
# sees it; it is listed here so that ``workbook bench --help`` names it.
TARGETS = {
    "all_reduce": "every rank ends with the sum (busbw = algbw * 2(n-1)/n)",
    "all_gather": "every rank ends with every rank's chunk (busbw = algbw * (n-1)/n)",
    "reduce_scatter": "every rank ends with its chunk of the sum (busbw = algbw * (n-1)/n)",
    "broadcast": "rank 0's buffer to every rank (busbw = algbw)",
    "reduce": "the sum on rank 0 (busbw = algbw)",
    "domino": "Domino vs vanilla TP vs no communication (own options: workbook bench domino --help)",
    "tp_overlap": "SP's comm inside the GEMMs vs plain SP vs Domino (own options: "
                  "workbook bench tp_overlap --help)",
    "dp_overlap": "bucketed DP, ZeRO-1/2/3 vs naive DP vs no communication (own options: "
                  "workbook bench dp_overlap --help)",
    "pp_overlap": "GPipe and 1F1B, blocking and overlapped p2p, vs no communication (own "
                  "options: workbook bench pp_overlap --help)",
    "cp_ring": "ring attention's K/V exchange hidden, contiguous vs zig-zag, over a sequence "
               "sweep (own options: workbook bench cp_ring --help)",
    "pp_schedules": "1F1B, interleaved, ZB-H1 and ZBV vs no communication, beside the formulas "
                    "(own options: workbook bench pp_schedules --help)",
    "ep_overlap": "an MoE layer's all-to-all hidden (shared expert, two micro-batches, deferred "
                  "wgrad) vs no communication, 1 and 2 nodes (own options: workbook bench "
                  "ep_overlap --help)",
    "capstone": "the capstone's TP x DP and PP x DP steps, overlaps off and on, vs no "
                "communication (own options: workbook bench capstone --help)",
}
DOMINO = "domino"
OWN_OPTIONS = (DOMINO, "tp_overlap", "dp_overlap", "pp_overlap", "cp_ring", "pp_schedules",
               "ep_overlap", "capstone")   # routed by cli.main, as domino is


def _targets_epilog() -> str:
    width = max(map(len, TARGETS))
    return "what can be benchmarked:\n" + "\n".join(
        f"  {name:<{width}}  {line}" for name, line in TARGETS.items()) + \
        "\n\nexample:\n  workbook bench all_reduce --nproc 4 --impl solutions --sizes 1M,64M"


def _handle_or_domino(args) -> int:
    if args.collective in OWN_OPTIONS:
        # Only reached when an option came before the word domino (``workbook bench --nproc 2
        # domino``): cli.main routes ``bench domino ...`` itself, and these options are the
        # collectives' ones, not Domino's. The same for tp_overlap.
        name = args.collective
        print(f"workbook bench: {name} takes its own options after the word {name}: "
              f"workbook bench {name} [options] (see workbook bench {name} --help)",
              file=sys.stderr)
        return 2
    return _handle(args)


def register(subparsers) -> None:
    """Add ``bench`` to the ``workbook`` command's subparsers."""
    import argparse
    p = subparsers.add_parser("bench", help="time a collective over sizes (algbw, busbw), "
                                            "or domino: Domino vs vanilla TP vs no communication",
                              description=__doc__.split("\n\n")[0],
                              epilog=_targets_epilog(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("collective", choices=tuple(TARGETS),
                   help="a collective to time over --sizes, or domino (Domino vs vanilla TP vs "
                        "no communication; options: workbook bench domino --help); "
                        "see the list below")
    p.add_argument("--nproc", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--impl", default="builtin",
                   help="builtin (default), labs, solutions, or a folder of lab files")
    p.add_argument("--link", default="none", help="simulated link preset, or none (default)")
    add_backend_argument(p)
    p.add_argument("--sizes", default="1K..64M",
                   help="bytes: a range LO..HI (steps of --factor) and/or a list, e.g. 1M,64M")
    p.add_argument("--factor", type=int, default=4, help="step of a size range (default 4)")
    p.add_argument("--iters", type=int, default=10, help="timed iterations per size (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations first (default 2)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per size")
    p.add_argument("--json", default=None, metavar="PATH", help="write the rows here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_handle_or_domino, handler=_handle_or_domino)

