"""Communication of a 4D split: which GPUs form each group, what each collective moves, how long.

**Where the groups sit.** GPUs are numbered as torchrun numbers them, node after node, and the
mesh is laid out ``[TP, CP, PP, DP]``, TP fastest (the Llama 3 paper's order, arXiv 2407.21783,
section 3.3.2): GPU ``t + TP (c + CP (q + PP d))`` holds TP rank ``t``, CP rank ``c``, stage ``q``,
replica ``d``. So a TP group of up to ``gpus_per_node`` GPUs stays on NVLink, and CP, PP and DP
groups cross the network once TP fills a node. The gradients of a weight are reduced over the
``DP x CP`` GPUs that hold it (CP ranks hold the same weights; Megatron's
``data_parallel_group_with_context_parallel``).

**What a collective costs** is the link layer's model (``workbook.link.topology``): the
alpha-beta time ``a + S busfactor(op, n) / B`` with nccl-tests' bus factors, on NVLink inside a
node, on one network card per GPU between nodes, hierarchical when a group spans both; a preset
with no network is one flat fabric. ``S`` is nccl-tests' size, the full buffer.

**What moves, per layer and micro-batch** (lab ``overlap_math``'s strategy table; bf16 = 2 bytes):

* TP with sequence parallelism (labs ``sp``, ``tp_overlap``): forward, 2 all-gathers and 2
  reduce-scatters of ``S = b (s/CP) h 2``; backward the same 4 (the reduce-scatters of the input
  gradients, the all-gathers of the inputs the weight gradients need);
* CP (lab ``cp_ring``): forward, the K and V of the whole sequence gathered,
  ``S = b s 2 (k/TP) d 2``; backward, gathered again and dK, dV reduce-scattered;
* PP (lab ``pp_overlap``): one send of the sequence-parallel activation,
  ``S = b (s/CP) h 2 / TP``, per chunk boundary forward, one per boundary backward;
* DP (lab ``dp_overlap``), per step: ZeRO 0 all-reduces the fp32 gradients (4 bytes a weight);
  ZeRO 1/2 reduce-scatter them and all-gather the updated bf16 weights; ZeRO 3 all-gathers the
  weights for each micro-batch's forward and backward and reduce-scatters its gradients.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from workbook.capstone.plan_shapes import Cluster, Model, Split
from workbook.link.presets import PRESETS
from workbook.link.topology import Fabric, Topology

BF16, FP32 = 2, 4


@dataclass(frozen=True)
class Network:
    """The cluster's fabrics: ``time(op, bytes, ranks)`` for any group of global GPU ranks."""
    topology: Topology | None
    flat: Fabric

    @lru_cache(maxsize=65536)         # noqa: B019 (frozen, few instances: a search's cache)
    def time(self, op: str, size_bytes: float, ranks: tuple) -> float:
        if len(ranks) <= 1 and op not in ("send", "recv"):
            return 0.0
        if self.topology is not None:
            return self.topology.time(op, size_bytes, ranks)
        return self.flat.time(op, size_bytes, 2 if op in ("send", "recv") else len(ranks))


def network(cluster: Cluster) -> Network:
    """The hardware figures of ``cluster.link`` (not the CPU-calibrated simulation)."""
    p = PRESETS[cluster.link]
    node = Fabric(p.bandwidth_GBps * 1e9, p.latency_us * 1e-6)
    if p.nic_GBps is None:
        return Network(None, node)
    return Network(Topology(cluster.gpus_per_node, node,                 # a card per GPU
                            Fabric(p.nic_GBps * 1e9, p.network_latency_us * 1e-6)), node)


def groups(split: Split) -> dict:
    """The first group of each kind, as global ranks (module docstring's layout)."""
    return _groups(split.tp, split.cp, split.pp, split.dp)


@lru_cache(maxsize=4096)
def _groups(tp: int, cp: int, pp: int, dp: int) -> dict:
    return {"tp": tuple(range(tp)),
            "cp": tuple(c * tp for c in range(cp)),
            "pp": (0, tp * cp) if pp > 1 else (0,),
            "dp": tuple(c * tp + d * tp * cp * pp for d in range(dp) for c in range(cp))}


@dataclass(frozen=True)
class CommTimes:
    """Seconds of every collective one GPU waits on, per layer and micro-batch or per step."""
    tp_fwd: float                # per layer, per micro-batch
    tp_bwd: float
    cp_fwd: float
    cp_bwd: float
    p2p: float                   # one send between neighbouring stages
    dp_grads: float              # per step (ZeRO 3: per micro-batch)
    dp_params: float             # per step (ZeRO 3: per micro-batch, forward and backward each)


def comm_times(model: Model, cluster: Cluster, split: Split, stage_params: float) -> CommTimes:
    """What each collective of the module docstring costs on ``cluster``; ``stage_params``:
    weights one GPU holds (its stage, cut by TP), whose gradients DP reduces."""
    net, g = network(cluster), groups(split)
    b, s = split.micro_batch, model.seq
    act = b * (s / split.cp) * model.hidden * BF16                  # [b, s/CP, h], TP-gathered
    tp_one = net.time("all_gather", act, g["tp"]) + net.time("reduce_scatter", act, g["tp"])
    kv = b * s * 2 * (model.kv / split.tp) * model.head_dim * BF16  # K and V of the sequence
    cp_ag = net.time("all_gather", kv, g["cp"])
    cp_rs = net.time("reduce_scatter", kv, g["cp"])
    p2p = net.time("send", act / split.tp, g["pp"]) if split.pp > 1 else 0.0
    if split.zero == 0:
        grads, params = net.time("all_reduce", stage_params * FP32, g["dp"]), 0.0
    else:
        grads = net.time("reduce_scatter", stage_params * FP32, g["dp"])
        params = net.time("all_gather", stage_params * BF16, g["dp"])
    return CommTimes(2 * tp_one, 2 * tp_one, cp_ag, cp_ag + cp_rs, p2p, grads, params)
