"""Inside a rank: which backend and device it uses, and how it joins the process group.

Shared by every way of starting ranks (``workbook.runtime.pool`` spawns them, ``torchrun`` starts them
and ``workbook.runtime.launch.init_from_env`` joins them), so a lab sees the same world either way:

* backend: gloo on CPU, always through the simulated link's backend (``workbook.link``: with
  the link set to ``none`` it adds nothing); NCCL with one GPU per rank (several per GPU on NCCL
  2.30+); gloo with the tensors on a GPU (``gloo-cuda``). ``workbook.runtime.gpu.plan`` decides, and says
  why; ``$WORKBOOK_BACKEND`` is the default request;
* threads: a CPU rank gets ``cores // ranks`` torch threads so ranks do not fight for cores;
* nodes: a rank knows its node as torchrun says it (``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
  ``GROUP_RANK``), whether torchrun started it on real hosts or the pool on this machine, and
  the simulated link costs each op by the nodes its ranks span (``workbook.link.topology``);
* the flight recorder is installed, so a hang can be reported per rank.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta


RANKS_HERE = "WORKBOOK_RANKS_HERE"     # ranks on this machine, when simulated nodes share it


@dataclass
class RankContext:
    """What a rank function may ask about where it runs (``workbook.runtime.launch.context()``)."""
    rank: int
    world_size: int
    local_rank: int          # this rank's index on its node
    backend: str
    device: str
    node: int = 0            # GROUP_RANK: which node (torchrun's agent) this rank runs on
    ranks_per_node: int = 0  # LOCAL_WORLD_SIZE: ranks on each node

    @property
    def nnodes(self) -> int:
        return self.world_size // (self.ranks_per_node or self.world_size)


_CONTEXT: RankContext | None = None


def context() -> RankContext:
    if _CONTEXT is None:
        raise RuntimeError("not inside a rank: call this from a function started by workbook.runtime.launch")
    return _CONTEXT


def inside_rank() -> bool:
    """Whether this process is a rank the launcher (or torchrun, through the workbook) set up."""
    return _CONTEXT is not None


def device():
    """The torch device of this rank: ``cuda:N`` on NCCL or gloo-cuda, else ``cpu``; outside a rank
    the launcher started (a plain script, a notebook's own cell), ``cpu``. The one way the
    workbook asks "where do my tensors live"."""
    import torch
    return torch.device(_CONTEXT.device if _CONTEXT is not None else "cpu")


# --------------------------------------------------------------------------- choosing


def rank_layout(backend: str | None, local_world_size: int, link: str | None = "none"):
    """Where ``local_world_size`` ranks run on this machine (``workbook.runtime.gpu.Layout``): ``backend``
    is a request (None: ``$WORKBOOK_BACKEND``, else what works here; see ``workbook.runtime.gpu``)."""
    from workbook.runtime import gpu
    from workbook.link import preset_names
    if link not in (None, *preset_names()):
        raise ValueError(f"unknown link preset {link!r}: choose one of {', '.join(preset_names())}")
    return gpu.machine_plan(local_world_size, backend, simulated_link=link not in (None, "none"))


def backend_for_link(link: str | None) -> str | None:
    """The backend a run on ``link`` needs: ``gloo`` with a simulated link (its ranks are CPU
    ranks, the link being gloo's, on a GPU machine too), else None (what this machine gives)."""
    return "gloo" if link not in (None, "none") else None


def choose_backend(backend: str | None, local_world_size: int, link: str | None = "none") -> str:
    """The backend ranks start with: ``gloo`` (CPU), ``nccl`` or ``gloo-cuda`` (``rank_layout``)."""
    return rank_layout(backend, local_world_size, link).backend


def threads_per_rank(local_world_size: int) -> int:
    return max(1, (os.cpu_count() or 1) // local_world_size)


# --------------------------------------------------------------------------- inside a rank
def node_layout(world_size: int) -> tuple[int, int, int]:
    """``(local_rank, ranks_per_node, node)`` of this process, from torchrun's variables."""
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return (int(os.environ.get("LOCAL_RANK", 0)), per_node,
            int(os.environ.get("GROUP_RANK", int(os.environ.get("RANK", 0)) // per_node)))


def init_rank(rank, world_size, local_rank, backend, store, generation, timeout_s):
    """Initialise torch.distributed in this process (the part spawned ranks and torchrun share).
    ``local_rank`` picks the GPU: the rank's index among the ranks of this machine."""
    global _CONTEXT
    import warnings
    import torch
    import torch.distributed as dist
    from workbook import link
    from workbook.runtime import flight

    warnings.filterwarnings("ignore", message=r".*is deprecated. Please use `torch.distributed")
    if backend in ("nccl", "gloo-cuda"):
        here = os.environ.get(RANKS_HERE) or os.environ.get("LOCAL_WORLD_SIZE", world_size)
        layout = rank_layout(backend, int(here))      # the ranks sharing this machine's GPUs
        for key, value in layout.env.items():       # before NCCL reads it (ranks sharing a GPU)
            os.environ.setdefault(key, value)
        dev = layout.device(local_rank)
        torch.cuda.set_device(torch.device(dev))
        # gloo-cuda: the gloo wrapper, which moves CUDA tensors through host memory (gloo's own
        # send/recv hands the socket a GPU pointer and fails)
        pg_backend = "nccl" if backend == "nccl" else link.register(cuda=True)
    else:
        dev, pg_backend = "cpu", link.BACKEND_NAME
        link.register()
    link.measure_real_ops(backend == "gloo-cuda")   # no link there: trace each op as it ran
    kwargs = dict(backend=pg_backend, rank=rank, world_size=world_size,
                  timeout=timedelta(seconds=timeout_s))
    if store is not None:
        kwargs["store"] = dist.PrefixStore(f"gen{generation}", store)
    if backend == "nccl":
        kwargs["device_id"] = torch.device(dev)
    dist.init_process_group(**kwargs)
    flight.RECORDER.install()
    node_rank, per_node, node = node_layout(world_size)
    _CONTEXT = RankContext(rank, world_size, node_rank, backend, dev, node, per_node)


def link_nodes() -> int:
    """Ranks per node for the simulated link: 0 when every rank is on one node."""
    ctx = context()
    return ctx.ranks_per_node if 0 < ctx.ranks_per_node < ctx.world_size else 0


def set_link(preset: str, cache: dict) -> None:
    """All ranks agree on one calibration: rank 0 measures, the others read it from the store."""
    import torch.distributed as dist
    from workbook import link
    if preset in (None, "none") or context().device != "cpu":      # the link is for CPU ranks
        link.set_link(None)
        return
    if preset not in cache:
        store = dist.distributed_c10d._get_default_store()
        key = f"workbook/flops/{preset}/{len(cache)}"
        if dist.get_rank() == 0:
            flops = float(os.environ.get(link.ENV_LOCAL_FLOPS, 0)) or link.measure_local_flops()
            store.set(key, repr(flops))
        cache[preset] = link.make_link(preset, float(store.get(key).decode()), link_nodes())
    link.set_link(cache[preset])
