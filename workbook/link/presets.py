"""The real interconnects the simulated link imitates: names, bandwidths, latencies, GPU rates.

Kept apart from ``workbook.link`` (which needs torch) so that the command line can list and
check preset names without importing torch.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    """A real interconnect and the compute it feeds (the numbers the calibration keeps in ratio)."""
    name: str
    description: str
    bandwidth_GBps: float    # bus bandwidth of the link, GB/s (1e9 bytes/s)
    latency_us: float        # per-operation latency on the real hardware
    peak_tflops: float       # dense bf16 matmul rate of one GPU on that machine
    gpus_per_node: int = 8   # GPUs that share the intra-node fabric above
    network_GBps: float | None = None   # the node's network cards together, GB/s (None: flat)
    network_latency_us: float = 5.0     # per-operation latency between nodes

    @property
    def nic_GBps(self) -> float | None:
        """One GPU's share of the network: its own card on a rail-optimised node."""
        return None if self.network_GBps is None else self.network_GBps / self.gpus_per_node


PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("dgx-h100", "DGX-H100 intra-node NVLink 4 / NVSwitch, 900 GB/s, H100 bf16 ~790 TFLOP/s; "
           "between nodes 8x ConnectX-7 400 Gb/s InfiniBand (50 GB/s per GPU)",
           900.0, 2.0, 790.0, 8, 400.0, 5.0),
    Preset("dgx-h100-ib", "DGX-H100 across nodes, 8x ConnectX-7 InfiniBand = 400 GB/s per node, "
           "flat: every pair of ranks at that rate (the Domino paper's multi-node setting)",
           400.0, 5.0, 790.0),
    Preset("dgx-a100", "DGX-A100 intra-node NVLink 3, 600 GB/s, A100 bf16 ~312 TFLOP/s; between "
           "nodes 8x ConnectX-6 200 Gb/s HDR InfiniBand (25 GB/s per GPU)",
           600.0, 2.0, 312.0, 8, 200.0, 5.0),
    Preset("pcie-h100", "H100 PCIe without NVLink, ~64 GB/s PCIe 5 x16 (a slow link, for sweeps); "
           "between nodes 2x 400 Gb/s Ethernet for 8 GPUs (12.5 GB/s per GPU)",
           64.0, 5.0, 790.0, 8, 100.0, 10.0),
]}


def preset_names() -> list[str]:
    return ["none", *PRESETS]
