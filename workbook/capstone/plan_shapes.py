"""What ``workbook plan`` is asked about: a model, a cluster, a split, and the rules they obey.

A **model** is a decoder-only transformer (Llama style: RMSNorm, SwiGLU MLP of three ``h x f``
matrices, grouped-query attention with ``kv_heads`` key/value heads, untied embedding and output
head). A **cluster** is ``nodes`` nodes of ``gpus_per_node`` GPUs wired like a link preset of
``workbook.link.presets`` (NVLink inside a node, one network card per GPU between nodes), each
GPU computing at ``efficiency x peak``. A **split** is the 4D mesh ``TP x CP x PP x DP`` plus
the micro-batch size ``b``, the global batch ``B`` (sequences), the virtual pipeline stages ``v``
and which overlaps are on.

The rules (each broken rule is one line that names it, ``PlanError``; ``workbook plan`` exits 2):

* ``TP x CP x PP x DP = nodes x gpus_per_node``: every GPU holds exactly one mesh position;
* ``L + e`` (``e``: the embedding and/or the loss counted as a layer, as Llama 3 and Megatron's
  ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split`` do)
  is a multiple of ``PP x v``: every pipeline chunk holds the same number of layers;
* ``B`` is a multiple of ``b x DP``: every DP replica runs ``m = B / (b DP)`` whole micro-batches;
* TP divides the query heads and the KV heads (Megatron splits heads over TP ranks), and the
  sequence splits into ``2 CP`` chunks (the zig-zag split of lab ``cp_ring``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

OVERLAPS = ("tp", "cp", "pp", "dp")       # TP comm overlap, CP ring, PP p2p, DP/ZeRO
RECOMPUTE = ("none", "selective", "full")


class PlanError(ValueError):
    """A split that breaks one of the module docstring's rules, said in one line."""


@dataclass(frozen=True)
class Model:
    """A Llama-style decoder: ``layers`` blocks of width ``hidden``, MLP width ``ffn``."""
    layers: int
    hidden: int
    ffn: int
    heads: int
    vocab: int
    seq: int
    kv_heads: int = 0                     # 0: as many as ``heads`` (no grouped-query attention)

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


#: Published shapes (Llama Team, "The Llama 3 Herd of Models", arXiv 2407.21783, Table 3).
MODELS = {
    "llama3-8b": dict(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256),
    "llama3-70b": dict(layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, vocab=128256),
    "llama3-405b": dict(layers=126, hidden=16384, ffn=53248, heads=128, kv_heads=8, vocab=128256),
}


@dataclass(frozen=True)
class Cluster:
    """``nodes`` x ``gpus_per_node`` GPUs joined as link preset ``link`` describes."""
    link: str
    nodes: int
    gpus_per_node: int
    peak_tflops: float                    # dense bf16 peak of one GPU
    efficiency: float = 1.0               # the share of the peak a GEMM reaches (fitted)
    gpu_memory_gb: float = 80.0

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def flops(self) -> float:
        """FLOP/s one GPU computes at: ``efficiency x peak``."""
        return self.efficiency * self.peak_tflops * 1e12


@dataclass(frozen=True)
class Split:
    """The mesh and the schedule. ``global_batch`` in sequences; ``dp`` 0: what the GPUs leave."""
    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 0
    micro_batch: int = 1
    global_batch: int = 0                 # sequences; 0: one micro-batch per DP replica
    virtual: int = 1                      # virtual pipeline stages (chunks) per GPU
    overlaps: frozenset = field(default_factory=lambda: frozenset(OVERLAPS))
    zero: int = 1                         # 0 plain DP, 1 optimizer sharded, 2 + grads, 3 + params
    recompute: str = "none"
    embedding_as_layer: bool = False      # the input embedding takes a layer's place in PP
    loss_as_layer: bool = False           # the output head and loss take a layer's place in PP

    def on(self, overlap: str) -> bool:
        return overlap in self.overlaps

    def describe(self) -> str:
        return (f"TP{self.tp} CP{self.cp} PP{self.pp} DP{self.dp} v{self.virtual} "
                f"b{self.micro_batch}")


def layer_slots(model: Model, split: Split) -> int:
    """The layers the pipeline split balances: ``L``, plus one per end counted as a layer."""
    return model.layers + int(split.embedding_as_layer) + int(split.loss_as_layer)


def micro_batches(split: Split) -> int:
    """``m = B / (b x DP)``: micro-batches each DP replica runs per step."""
    return split.global_batch // (split.micro_batch * split.dp)


def resolve(model: Model, cluster: Cluster, split: Split) -> Split:
    """``split`` with DP filled in (from the GPUs left) and the global batch defaulted, after
    every rule of the module docstring is checked (``PlanError`` names the first one broken)."""
    from dataclasses import replace
    gpus, tcp = cluster.gpus, split.tp * split.cp * split.pp
    for name, value in (("TP", split.tp), ("CP", split.cp), ("PP", split.pp),
                        ("micro-batch", split.micro_batch), ("virtual stages", split.virtual),
                        ("nodes", cluster.nodes), ("GPUs per node", cluster.gpus_per_node)):
        if value < 1:
            raise PlanError(f"{name} must be a whole number, at least 1, got {value}")
    if not 0 < cluster.efficiency <= 1:
        raise PlanError(f"the kernel efficiency is a share of the peak: above 0, at most 1, "
                        f"got {cluster.efficiency:g}")
    dp = split.dp or (gpus // tcp if gpus % tcp == 0 else 0)
    if dp == 0:
        raise PlanError(f"TP x CP x PP = {split.tp} x {split.cp} x {split.pp} = {tcp} does not "
                        f"divide the {gpus} GPUs ({cluster.nodes} nodes x "
                        f"{cluster.gpus_per_node}): the mesh must cover every GPU once")
    if tcp * dp != gpus:
        raise PlanError(f"TP x CP x PP x DP = {split.tp} x {split.cp} x {split.pp} x {dp} = "
                        f"{tcp * dp} GPUs, but the cluster has {gpus} ({cluster.nodes} nodes x "
                        f"{cluster.gpus_per_node}): the product must equal the GPU count")
    slots, chunks = layer_slots(model, split), split.pp * split.virtual
    if slots % chunks:
        counted = f"{model.layers} layers" + (f" (+{slots - model.layers} for embedding/loss)"
                                              if slots != model.layers else "")
        raise PlanError(f"{counted} do not split into PP x v = {split.pp} x {split.virtual} = "
                        f"{chunks} pipeline chunks: the layers must be a multiple of PP x v "
                        f"(or count the embedding and loss as layers: --embedding-as-layer, "
                        f"--loss-as-layer)")
    if split.virtual > 1 and split.pp == 1:
        raise PlanError("virtual pipeline stages need PP > 1: with one stage there is no "
                        "pipeline to interleave")
    for what, n in (("query heads", model.heads), ("KV heads", model.kv)):
        if n % split.tp:
            raise PlanError(f"TP={split.tp} does not divide the {n} {what}: TP splits the "
                            f"heads over its ranks")
    if split.cp > 1 and model.seq % (2 * split.cp):
        raise PlanError(f"the sequence of {model.seq} tokens does not split into 2 x CP = "
                        f"{2 * split.cp} zig-zag chunks: it must be a multiple of 2 x CP")
    batch = split.global_batch or split.micro_batch * dp
    if batch % (split.micro_batch * dp):
        raise PlanError(f"a global batch of {batch} sequences does not split into micro-batches "
                        f"of {split.micro_batch} on DP={dp} replicas: it must be a multiple of "
                        f"micro-batch x DP = {split.micro_batch * dp}")
    if split.zero not in (0, 1, 2, 3):
        raise PlanError(f"ZeRO stage must be 0, 1, 2 or 3, got {split.zero}")
    if split.recompute not in RECOMPUTE:
        raise PlanError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {split.recompute}")
    return replace(split, dp=dp, global_batch=batch)


def parse_count(text: str) -> int:
    """``16M`` -> 16777216, ``8K`` -> 8192, ``131072`` -> 131072 (binary units, as the Llama 3
    paper's "16M tokens" means 2^24); anything else is a ``PlanError`` in one line."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = str(text).strip().upper()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        value = -1
    if value < 1 or value != int(value):
        raise PlanError(f"expected a whole count like 8192, 8K or 16M, got {text}")
    return int(value)


def parse_overlaps(text: str) -> frozenset:
    """``all``, ``none`` or a comma list of ``tp,cp,pp,dp``."""
    t = text.strip().lower()
    if t in ("all", ""):
        return frozenset(OVERLAPS)
    if t == "none":
        return frozenset()
    names = {n.strip() for n in t.split(",") if n.strip()}
    bad = sorted(names - set(OVERLAPS))
    if bad:
        raise PlanError(f"unknown overlap {', '.join(bad)}: choose from {', '.join(OVERLAPS)}, "
                        f"all or none")
    return frozenset(names)
