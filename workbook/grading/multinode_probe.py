"""Where did each rank run? A probe for a job of several torchrun nodes (``workbook.runtime.multinode``).

    torchrun --nnodes 2 --nproc-per-node 2 ... -m workbook.grading.multinode_probe [--fail-rank R] [--hold]

Every rank reports torchrun's numbers for it (``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``), its network namespace, the interface and address its
gloo uses, an all-reduce of ``rank + 1`` over the job, and what the simulated ``dgx-h100``
link made of torchrun's nodes (ranks per node, the fabrics a whole-job all-reduce holds: NVLink
and the network); rank 0 prints the records as one
``PROBE [...]`` JSON line. It runs through ``JobRanks`` as every self-check under torchrun does,
so a failure behaves the same: ``--fail-rank R`` has rank R raise and every rank hold R's own
error; ``--hold`` (after it, when both are given) keeps every rank all-reducing until a host
goes away and the watchdog ends the job (the package's multi-node test kills one namespace's
processes to check that: one job shows the records, a rank's error and a hang).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import time

from workbook.runtime.ranks import device


def _where() -> dict:
    """Where this rank runs: torchrun's numbers, its network namespace, the interface and
    address gloo uses; and an all-reduce of rank + 1 over the job."""
    import fcntl
    import struct

    import torch
    import torch.distributed as dist
    from workbook import link
    total = torch.tensor([dist.get_rank() + 1.0], device=device())
    dist.all_reduce(total)
    lk = link.current_link()                          # the simulated link saw the nodes too
    fabrics = list(lk.fabrics("all_reduce", range(dist.get_world_size()))) if lk else None
    ifname = os.environ.get("GLOO_SOCKET_IFNAME", "")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:           # SIOCGIFADDR
        addr = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname[:15].encode()))[20:24]
    keys = ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")
    return {**{k.lower(): os.environ.get(k) for k in keys}, "gloo_ifname": ifname,
            "gloo_addr": socket.inet_ntoa(addr), "netns": os.readlink("/proc/self/ns/net"),
            "all_reduce": total.item(), "link_ranks_per_node": lk.ranks_per_node if lk else None,
            "link_fabrics": fabrics}


def _fail(fail_rank: int) -> None:
    """Rank ``fail_rank`` raises while the others all-reduce (and fail when it is gone)."""
    import torch
    import torch.distributed as dist
    if dist.get_rank() == fail_rank:
        raise RuntimeError(f"rank {fail_rank} fails on purpose (probe --fail-rank)")
    dist.all_reduce(torch.ones(1, device=device()))


def _hold() -> None:
    """Every rank all-reduces until stopped (rank 0 says ``PROBE HOLDING`` as it starts)."""
    import torch
    import torch.distributed as dist
    if dist.get_rank() == 0:
        print("PROBE HOLDING", flush=True)
    while True:
        dist.all_reduce(torch.ones(1, device=device()))
        time.sleep(0.05)


def probe(argv=None) -> None:
    """Under torchrun: rank 0 prints ``PROBE [...]``, one JSON record per rank (``_where``);
    then ``--fail-rank R`` has rank R raise (rank 0 prints ``PROBE FAILED`` and R's error; the
    job goes on in a fresh process group), ``--hold`` has every rank all-reduce until a host
    goes away or the watchdog (``--timeout``) ends the job (exit 2). Failures as in every
    self-check: without ``--hold``, a failure's job exits 1."""
    from workbook.grading.torchrun_ranks import JobRanks
    parser = argparse.ArgumentParser(prog="torchrun ... -m workbook.grading.multinode_probe")
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    steps = [(_where, (), "dgx-h100")]
    steps += [(_fail, (args.fail_rank,), "none")] if args.fail_rank is not None else []
    steps += [(_hold, (), "none")] if args.hold else []
    job, code = JobRanks(args.timeout), 0
    for fn, fn_args, link in steps:
        try:
            results = job.run(job.world, fn, fn_args, {}, link=link, timeout=args.timeout)
        except Exception as exc:                      # every rank holds the failing rank's error
            if job.rank == 0:
                notes = " ".join(getattr(exc, "__notes__", []))
                print(f"PROBE FAILED {type(exc).__name__}: {exc} {notes}", flush=True)
            code = 1
            if fn is _fail:                           # on purpose: the job goes on (a fresh group)
                continue
            break
        if fn is _where and job.rank == 0:
            print("PROBE " + json.dumps(results), flush=True)
    job.finish(code)


if __name__ == "__main__":
    probe()
