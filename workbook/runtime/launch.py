"""The rank launcher: run one function on N ranks, from a notebook, a test, the CLI or torchrun.

Three ways in, one code path for the lab:

* ``run(fn, world_size=4)`` spawns 4 rank processes on this machine, runs ``fn()`` on each and
  returns the 4 results (a list indexed by rank);
* ``RankPool(4)`` keeps 4 rank processes alive so that each further ``pool.run(fn)`` costs
  milliseconds instead of the seconds it takes to start Python and import torch (the test suite
  and notebooks use ``shared_pool``);
* ``main(fn)`` at the bottom of a lab file: under ``torchrun`` it joins the job described by
  RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT; run as a plain script it starts the
  ranks itself. Either way ``fn`` sees an initialised default process group.

What the launcher promises (each has a test in tests/package/test_launch.py):

* backend: gloo on CPU (through the simulated link, see ``workbook.link``), NCCL with one GPU
  per rank when asked for or when enough GPUs exist (``workbook.runtime.gpu`` decides, and says why);
* ports: the rendezvous store listens on a port the OS picks, so parallel runs never collide;
* failure: when a rank raises, the caller gets *that* rank's exception and traceback, not the
  "connection closed" its peers see next; surviving ranks are stopped, nothing is left running;
* hangs: after ``timeout`` seconds the caller gets ``RanksTimedOut`` with the flight recorder's
  report of the last collective each rank entered.

The parts live in ``workbook.runtime.ranks`` (inside a rank) and ``workbook.runtime.pool`` (live rank
processes); this module is the front door.
"""
from __future__ import annotations

import os

from workbook.runtime.gpu import add_backend_argument, gpu_count  # noqa: F401
from workbook.runtime.pool import (DEFAULT_TIMEOUT, RankFailed, RankPool, RanksStillRunning,  # noqa: F401
                           RanksTimedOut, RemoteTraceback, close_shared_pools, shared_pool)
from workbook.runtime.ranks import (RankContext, choose_backend, context, device,  # noqa: F401
                            init_rank, rank_layout, set_link, threads_per_rank)


def run(fn, world_size: int = 2, *args, backend: str | None = None, link: str = "none",
        timeout: float = DEFAULT_TIMEOUT, pool: bool = False, master_port: int | None = None,
        nnodes: int = 1, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` fresh ranks (or a shared pool) and return
    the per-rank results. ``nnodes``: the ranks form that many simulated nodes, numbered as
    torchrun numbers them (rank r on node ``r // (world_size // nnodes)``): each rank sees its
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and ``GROUP_RANK``, and a simulated link costs traffic
    between nodes on the preset's network (``workbook.link.topology``)."""
    if pool:
        return shared_pool(world_size, backend, nnodes=nnodes).run(fn, *args, link=link,
                                                                    timeout=timeout, **kwargs)
    with RankPool(world_size, backend, link=link, master_port=master_port, nnodes=nnodes) as p:
        return p.run(fn, *args, link=link, timeout=timeout, **kwargs)


# --------------------------------------------------------------------------- torchrun
def on_ranks(fn, n: int, *args, link: str = "none", timeout: float = 60.0, nnodes: int = 1,
             **kwargs) -> list:
    """``fn(*args, **kwargs)`` on each of ``n`` ranks; the per-rank results, indexed by rank.
    With a simulated ``link`` the ranks are CPU ranks (the link is gloo's), on a GPU machine too.
    ``nnodes``: the ranks form that many simulated nodes (``workbook.runtime.launch.run``)."""
    from workbook.runtime.ranks import backend_for_link
    return shared_pool(n, backend_for_link(link), nnodes=nnodes).run(
        fn, *args, link=link, timeout=timeout, **kwargs)


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def init_from_env(backend: str | None = None, link: str = "none",
                  timeout: float = DEFAULT_TIMEOUT) -> RankContext:
    """Join the job torchrun describes in the environment (single- or multi-node)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    chosen = choose_backend(backend, local_world, link)
    import torch
    if chosen == "gloo":
        torch.set_num_threads(threads_per_rank(local_world))
    init_rank(rank, world, local_rank, chosen, None, 0, timeout + 60.0)   # gloo's timeout above ours
    set_link(link, {})
    return context()


def main(fn, *, default_nproc: int = 4, describe=None) -> list | None:
    """The ``__main__`` of every lab file: torchrun or a plain ``python lab.py --nproc N``.

    ``fn()`` runs on every rank and returns something printable; rank 0 prints the results
    (``describe(results)`` formats them when given)."""
    from workbook.runtime.options import OneLineErrors, positive_count, positive_seconds
    parser = OneLineErrors(description=(fn.__doc__ or "").strip().split("\n")[0])
    parser.add_argument("--nproc", type=positive_count, default=default_nproc,
                        help="ranks (ignored under torchrun)")
    add_backend_argument(parser)
    parser.add_argument("--link", default=os.environ.get("WORKBOOK_LINK", "none"))
    parser.add_argument("--timeout", type=positive_seconds, default=DEFAULT_TIMEOUT)
    opts = parser.parse_args()
    if under_torchrun():
        import torch.distributed as dist
        init_from_env(opts.backend, opts.link, opts.timeout)
        try:
            result = fn()
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, result)
        finally:
            dist.destroy_process_group()
        if int(os.environ["RANK"]) == 0:
            print(describe(gathered) if describe else gathered)
        return gathered
    results = run(fn, opts.nproc, backend=opts.backend, link=opts.link, timeout=opts.timeout)
    print(describe(results) if describe else results)
    return results
