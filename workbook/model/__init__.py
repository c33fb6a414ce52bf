"""The single-device reference model, the ground truth of every lab.

Modules:
    config    ModelConfig: shapes, style (gpt | llama), dtype, seed; validate(tp)
    init      deterministic weights and dropout masks, keyed by name
    sharding  how each named parameter splits over tensor-parallel ranks
    ops       the math as plain functions (norms, attention, RoPE, loss)
    reference the nn.Modules and ReferenceModel; per-block reference helpers
    data      deterministic toy batches
    moe       the mixture-of-experts layer: router, capacity, experts, load-balancing loss

Quick start::

    from workbook.model import ModelConfig, ReferenceModel, make_batch
    cfg = ModelConfig(style="llama", dtype="float64")
    model = ReferenceModel(cfg)
    tokens, targets = make_batch(cfg, batch=4, seed=0)
    model(tokens, targets).backward()
"""

from .config import ModelConfig
from .data import make_batch
from .init import dropout_mask, full_weight, full_weights, parameter_shapes, stable_seed
from .moe import MoE, MoEConfig
from .reference import (
    MLP,
    Attention,
    Block,
    Embedding,
    LayerNorm,
    Linear,
    LMHead,
    ReferenceModel,
    ReferenceResult,
    RMSNorm,
    block_forward_reference,
    grads_by_name,
    params_by_name,
    run_reference,
)
from .sharding import ShardSpec, local_weight, shard_spec, shard_table, slice_for_rank, unslice

__all__ = [
    "ModelConfig", "make_batch", "MoE", "MoEConfig",
    "dropout_mask", "full_weight", "full_weights", "parameter_shapes", "stable_seed",
    "Attention", "Block", "Embedding", "LayerNorm", "Linear", "LMHead", "MLP", "RMSNorm",
    "ReferenceModel", "ReferenceResult", "block_forward_reference", "grads_by_name",
    "params_by_name", "run_reference",
    "ShardSpec", "local_weight", "shard_spec", "shard_table", "slice_for_rank", "unslice",
]
