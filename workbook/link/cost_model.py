"""The simulated interconnect: a link model that makes CPU runs communicate at realistic cost.

Why it exists
-------------
Two CPU ranks on one laptop talk over loopback gloo, where moving a tensor costs about as much
as copying it. On a GPU cluster the same tensor crosses NVLink or InfiniBand, and that transfer
takes a sizeable share of a training step (the Domino paper measures up to 43-47% on DGX-H100,
arXiv 2409.15241). Without that cost there is nothing to hide, and overlap lessons show nothing.

The model
---------
Every operation a rank issues on the process group gets a *modelled* duration, the alpha-beta
model that nccl-tests uses to turn time into bus bandwidth::

    t(op) = latency + size_bytes * bus_factor(op, n) / bandwidth

with the nccl-tests bus factors (n ranks): all-reduce 2(n-1)/n; all-gather, reduce-scatter,
all-to-all, gather and scatter (n-1)/n, counted on the full n-rank buffer; broadcast, reduce,
send and recv 1; barrier 0 (latency only).

Calibration
-----------
A CPU computes about 10^4 times slower than an H100. To keep the *ratio* of communication to
compute that the real machine has, a preset's bandwidth is scaled by the ratio of the local
matmul rate to the hardware's peak, and its latency by the inverse::

    bandwidth_sim = bandwidth_hw * (flops_local / flops_hw)
    latency_sim   = latency_hw   * (flops_hw / flops_local)

so a CPU run is the real machine in slow motion (the network is scaled the same way). Every
figure measured on this link is a *simulated* figure and is labelled so (``Link.label``).

The queue that turns these durations into a timeline is ``workbook.link.op_records``; the process
group that charges them to every op is ``workbook.link.gloo_backend``.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

import torch

from workbook.link.presets import PRESETS, Preset, preset_names  # noqa: F401 (torch-free, for the CLI)
from workbook.link.topology import NETWORK, NVLINK, Fabric, Topology, bus_factor  # noqa: F401

ENV_LOCAL_FLOPS = "WORKBOOK_LOCAL_FLOPS"


@dataclass(frozen=True)
class Link:
    """A calibrated simulated link: what a CPU run actually pays per byte and per operation."""
    preset: str
    bandwidth_Bps: float     # simulated bytes per second
    latency_s: float         # simulated seconds per operation
    local_flops: float       # the local matmul rate the calibration used
    scale: float             # flops_local / flops_hw: the slow-motion factor
    ranks_per_node: int = 0  # 0: every rank on one node (a flat link)
    network_Bps: float = 0.0         # one rank's network card, simulated bytes per second
    network_latency_s: float = 0.0   # simulated seconds per operation between nodes

    @property
    def topology(self) -> Topology | None:
        """The nodes and their fabrics (``workbook.link.topology``), or None for a flat link."""
        if self.ranks_per_node <= 0 or self.network_Bps <= 0:
            return None
        return Topology(self.ranks_per_node, Fabric(self.bandwidth_Bps, self.latency_s),
                        Fabric(self.network_Bps, self.network_latency_s))

    def op_time(self, op: str, size_bytes: int, group) -> float:
        """Modelled seconds for one operation: ``group`` is a number of ranks inside one node
        (the flat model), or the global ranks taking part (a send: the two ranks), costed by
        the nodes they span (``workbook.link.topology``)."""
        if not isinstance(group, int):
            topo = self.topology
            if topo is not None:
                return topo.time(op, size_bytes, group)
            group = len(list(group))
        if group <= 1 and op not in ("send", "recv"):
            return 0.0
        return self.latency_s + size_bytes * bus_factor(op, group) / self.bandwidth_Bps

    def all_to_all_time(self, matrix, ranks) -> float:
        """Modelled seconds of an all-to-all with uneven splits: ``matrix[s][d]`` bytes from the
        ``s``-th to the ``d``-th of ``ranks``; bound by the busiest rank on each fabric
        (``workbook.link.topology``)."""
        topo = self.topology
        if topo is not None:
            return topo.all_to_all_time(matrix, ranks)
        return Fabric(self.bandwidth_Bps, self.latency_s).all_to_all_time(matrix)

    def fabrics(self, op: str, ranks) -> tuple[str, ...]:
        """The fabrics ``op`` on ``ranks`` holds while it runs (one, on a flat link)."""
        topo = self.topology
        return topo.fabrics(op, ranks) if topo is not None else (NVLINK,)

    @property
    def label(self) -> str:
        nodes = (f", nodes of {self.ranks_per_node} ranks joined by its network"
                 if self.topology is not None else "")
        return (f"simulated link: {self.preset}{nodes} (calibrated to "
                f"{self.local_flops / 1e9:.0f} GFLOP/s local)")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def describe(self) -> dict:
        p = PRESETS[self.preset]
        return {"preset": self.preset, "simulated": True, "description": p.description,
                "hw_bandwidth_GBps": p.bandwidth_GBps, "hw_latency_us": p.latency_us,
                "hw_peak_tflops": p.peak_tflops, "bandwidth_GBps": self.bandwidth_Bps / 1e9,
                "latency_us": self.latency_s * 1e6, "local_gflops": self.local_flops / 1e9,
                "scale": self.scale, "ranks_per_node": self.ranks_per_node or None,
                "hw_network_GBps_per_node": p.network_GBps, "hw_nic_GBps": p.nic_GBps,
                "network_GBps": self.network_Bps / 1e9 if self.topology else None,
                "network_latency_us": self.network_latency_s * 1e6 if self.topology else None}


def measure_local_flops(n: int = 384, seconds: float = 0.25) -> float:
    """Measure this process's fp32 matmul rate (FLOP/s) with its current torch thread count."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b                                                 # warm-up
    count, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        a @ b
        count += 1
    return 2.0 * n ** 3 * count / elapsed


def make_link(preset: str, local_flops: float | None = None,
              ranks_per_node: int = 0) -> Link | None:
    """Calibrate ``preset`` to this machine; ``"none"`` gives no link. ``ranks_per_node``
    (0: one node) splits the ranks into nodes joined by the preset's network."""
    if preset in (None, "", "none"):
        return None
    if preset not in PRESETS:
        raise ValueError(f"unknown link preset {preset!r}: choose one of {', '.join(preset_names())}")
    p = PRESETS[preset]
    flops = local_flops or float(os.environ.get(ENV_LOCAL_FLOPS, 0)) or measure_local_flops()
    scale = flops / (p.peak_tflops * 1e12)
    nic = p.nic_GBps or 0.0
    return Link(preset, p.bandwidth_GBps * 1e9 * scale, p.latency_us * 1e-6 / scale, flops, scale,
                ranks_per_node if nic else 0, nic * 1e9 * scale,
                p.network_latency_us * 1e-6 / scale if nic else 0.0)


DIRECTIONS = {"send": ("send",), "recv": ("recv",)}


def lanes(op: str, fabrics) -> list[tuple[str, str]]:
    """The lanes an op holds: per fabric, one direction for a send or a receive, both else."""
    return [(f, d) for f in fabrics for d in DIRECTIONS.get(op, ("send", "recv"))]

