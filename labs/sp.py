# Generated from solutions/sp.py by `workbook assign`: this is your file to edit.
# Replace each `raise NotImplementedError` with your code, then grade it with
#     workbook grade --lab sp
#
# Your tasks (29 pts in all):
#    1. all_gather_sequence (0.75 pts): `[B, S/n, ...] -> [B, S, ...]`: every rank's positions in
#       rank order, with one `dist.all_gather_into_tensor` (it joins along dim 0).
#    2. reduce_scatter_sequence (0.75 pts): `[B, S, ...] -> [B, S/n, ...]`: the sum over ranks,
#       this rank's positions only (one `dist.reduce_scatter_tensor` on the sequence-first layout).
#    3. gather_from_sequence_parallel_region (0.75 pts): Enter a parallel region from sequence
#       shards: all-gather forward; reduce-scatter backward (each rank's gradient of the gathered
#       input is a partial sum over its column slice).
#    4. reduce_scatter_to_sequence_parallel_region (0.75 pts): Leave a parallel region to sequence
#       shards: reduce-scatter forward, all-gather backward.
#    5. SPColumnParallelLinear.forward (1 pt): Column-parallel linear (`weight [out/n, in]`):
#       sequence shards `[B, S/n, in]` in, all-gathered (unless `gather_input=False`: the caller
#       gathered once, as for q, k, v), `[B, S, out/n]` out.
#    6. SPRowParallelLinear.__init__ and .forward (1 pt): Row-parallel linear
#       (`weight [out, in/n]`): `[B, S, in/n]` in, partial products reduce-scattered to
#       `[B, S/n, out]`, plus the replicated bias -- added on a shard, so its gradient is partial.
#    7. SPAttention.forward (3 pts): `blocks.{layer}.attn` from sequence shards to sequence shards:
#       one all-gather of the input for q, k, v; attention on heads/n heads over the whole
#       sequence; wo reduce-scatters.
#    8. SPMLP.forward (3 pts): `blocks.{layer}.mlp` from sequence shards to sequence shards.
#    9. sp_norm (1.5 pts): The reference norm `name`, its parameters tagged: it runs on this rank's
#       positions only.
#   10. SPBlock.dropout and .forward (7.5 pts): Pre-norm block `blocks.{layer}` on sequence shards
#       `[B, S/n, H] -> [B, S/n, H]`: norms, dropouts and residual adds on this rank's positions,
#       SPAttention and SPMLP between.
#   11. SPEmbedding.forward (2 pts): `embed` ending in sequence shards: one reduce-scatter sums the
#       ranks' partial lookups *and* shards them; then positions `pos.weight[s0:s1]` are added
#       (gpt; their gradient is partial).
#   12. SPModel.__init__ and .forward (3 pts): SPEmbedding, SPBlocks, the final norm on shards, the
#       vocab-parallel head (its input all-gathered) and loss.
#   13. sync_sequence_parallel_grads (4 pts): After backward, sum over the ranks the gradients of
#       the parameters tagged sequence-parallel (one all-reduce of them all, flattened).
"""Lab 5 -- sequence parallelism (Korthikanti et al. 2022, arXiv 2205.05198 sec. 4.2.2).

Lesson 5 explains it: the norms, dropouts and residual adds between lab 4's parallel regions run on
this rank's S/n positions; leaving a region is a reduce-scatter along the sequence, entering it an
all-gather: the same bytes, 1/n of their memory. A shard of ``[B, S, H]`` is ``x[:, s0:s1]``; the
collectives cut dim 0, so this lab transposes around them. Given helpers: ``workbook/tp.py``. Run:
``workbook run sp`` or ``torchrun --nproc_per_node=4 labs/sp.py``; grade: ``workbook grade --lab sp``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from workbook.model import ModelConfig, dropout_mask
from workbook.model import ops as model_ops    # (not "ops": cloudpickle would mistake it for torch.ops)
from workbook.model.reference import make_norm, rope_tables
from workbook.tensor_parallel.mappings import conjugate_op, local_param, mark_sequence_parallel, sequence_range, tp_world_size, vocab_parallel_cross_entropy, vocab_range
from workbook.runtime import ranks


# --------------------------------------------------------------------------- 1. sequence collectives
def all_gather_sequence(x: torch.Tensor) -> torch.Tensor:
    """``[B, S/n, ...] -> [B, S, ...]``: every rank's positions in rank order, with one
    ``dist.all_gather_into_tensor`` (it joins along dim 0). Return a contiguous tensor: q, k and v
    each flatten their input, and a transposed view would make each save its own copy."""
    n = tp_world_size()
    if n == 1:
        return x
    # TODO: sequence first, gather the [S/n, B, ...] pieces into an [S, B, ...] buffer, back
    raise NotImplementedError("not implemented yet: sp.all_gather_sequence")


def reduce_scatter_sequence(x: torch.Tensor) -> torch.Tensor:
    """``[B, S, ...] -> [B, S/n, ...]``: the sum over ranks, this rank's positions only (one
    ``dist.reduce_scatter_tensor`` on the sequence-first layout)."""
    n = tp_world_size()
    if n == 1:
        return x
    # TODO: reduce-scatter [S, B, ...] into an [S/n, B, ...] buffer
    raise NotImplementedError("not implemented yet: sp.reduce_scatter_sequence")


def gather_from_sequence_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """Enter a parallel region from sequence shards: all-gather forward; reduce-scatter backward
    (each rank's gradient of the gathered input is a partial sum over its column slice)."""
    # TODO: workbook.tensor_parallel.mappings.conjugate_op(x, forward, backward) with the functions
    #       above
    raise NotImplementedError("not implemented yet: sp.gather_from_sequence_parallel_region")


def reduce_scatter_to_sequence_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """Leave a parallel region to sequence shards: reduce-scatter forward, all-gather backward."""
    # TODO: the conjugate of the one above
    raise NotImplementedError("not implemented yet: sp.reduce_scatter_to_sequence_parallel_region")


# --------------------------------------------------------------------------- 2. the linears
class SPColumnParallelLinear(nn.Module):
    """Column-parallel linear (``weight [out/n, in]``): sequence shards ``[B, S/n, in]`` in, all-gathered
    (unless ``gather_input=False``: the caller gathered once, as for q, k, v), ``[B, S, out/n]`` out."""

    def __init__(self, cfg: ModelConfig, name: str, in_features: int, out_features: int, *,
                 bias: bool | None = None, gather_input: bool = True, device=None):
        super().__init__()
        self.name, self.gather_input = name, gather_input
        bias = cfg.style == "gpt" if bias is None else bias
        self.weight = local_param(cfg, f"{name}.weight", device)
        self.bias = local_param(cfg, f"{name}.bias", device) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO: the full sequence (unless the caller gathered it), then the local linear
        raise NotImplementedError("not implemented yet: sp.SPColumnParallelLinear.forward")


class SPRowParallelLinear(nn.Module):
    """Row-parallel linear (``weight [out, in/n]``): ``[B, S, in/n]`` in, partial products reduce-scattered
    to ``[B, S/n, out]``, plus the replicated bias -- added on a shard, so its gradient is partial."""

    def __init__(self, cfg: ModelConfig, name: str, in_features: int, out_features: int, *,
                 bias: bool | None = None, device=None):
        super().__init__()
        self.name = name
        bias = cfg.style == "gpt" if bias is None else bias
        self.weight = local_param(cfg, f"{name}.weight", device)
        # TODO: the full bias, tagged
        raise NotImplementedError("not implemented yet: sp.SPRowParallelLinear.__init__")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO: the local matmul leaves the region as a sequence shard; then the bias
        raise NotImplementedError("not implemented yet: sp.SPRowParallelLinear.forward")


# --------------------------------------------------------------------------- 3. attention, MLP, block
class SPAttention(nn.Module):
    """``blocks.{layer}.attn`` from sequence shards to sequence shards: one all-gather of the
    input for q, k, v; attention on heads/n heads over the whole sequence; wo reduce-scatters."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        self.cfg, self.name = cfg, f"blocks.{layer}.attn"
        H, self.local_heads = cfg.hidden, cfg.heads // tp_world_size()
        for w in ("wq", "wk", "wv"):
            setattr(self, w, SPColumnParallelLinear(cfg, f"{self.name}.{w}", H, H,
                                                    gather_input=False, device=device))
        self.wo = SPRowParallelLinear(cfg, f"{self.name}.wo", H, H, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO: gather once, q k v, model_ops.causal_attention (rope_tables of the full sequence),
        #       wo
        raise NotImplementedError("not implemented yet: sp.SPAttention.forward")


class SPMLP(nn.Module):
    """``blocks.{layer}.mlp`` from sequence shards to sequence shards."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        self.cfg, self.name = cfg, f"blocks.{layer}.mlp"
        H, F = cfg.hidden, cfg.ffn_hidden
        col = dict(gather_input=False, device=device)
        if cfg.style == "gpt":
            self.fc1 = SPColumnParallelLinear(cfg, f"{self.name}.fc1", H, F, **col)
            self.fc2 = SPRowParallelLinear(cfg, f"{self.name}.fc2", F, H, device=device)
        else:
            self.w_gate = SPColumnParallelLinear(cfg, f"{self.name}.w_gate", H, F, **col)
            self.w_up = SPColumnParallelLinear(cfg, f"{self.name}.w_up", H, F, **col)
            self.w_down = SPRowParallelLinear(cfg, f"{self.name}.w_down", F, H, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO: lab 4's MLP, entered from sequence shards
        raise NotImplementedError("not implemented yet: sp.SPMLP.forward")


def sp_norm(cfg: ModelConfig, name: str, device) -> nn.Module:
    """The reference norm ``name``, its parameters tagged: it runs on this rank's positions only."""
    norm = make_norm(cfg, name).to(device)
    # TODO: mark_sequence_parallel on each of its parameters
    raise NotImplementedError("not implemented yet: sp.sp_norm")
    return norm


class SPBlock(nn.Module):
    """Pre-norm block ``blocks.{layer}`` on sequence shards ``[B, S/n, H] -> [B, S/n, H]``:
    norms, dropouts and residual adds on this rank's positions, SPAttention and SPMLP between."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        device = device or ranks.device()
        self.cfg, self.layer, self.name = cfg, layer, f"blocks.{layer}"
        self.norm1 = sp_norm(cfg, f"{self.name}.norm1", device)
        self.attn = SPAttention(cfg, layer, device)
        self.norm2 = sp_norm(cfg, f"{self.name}.norm2", device)
        self.mlp = SPMLP(cfg, layer, device)

    def dropout(self, x: torch.Tensor, site: str, step: int) -> torch.Tensor:
        """Dropout on this rank's positions with its slice of the reference's full mask."""
        if not self.training or self.cfg.dropout == 0.0:
            return x
        # TODO: dropout_mask of shape [B, S, H] (S the full length), then [:, s0:s1]
        raise NotImplementedError("not implemented yet: sp.SPBlock.dropout")

    def forward(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
        # TODO: the same residual stream as lab 4, on shards
        raise NotImplementedError("not implemented yet: sp.SPBlock.forward")


# --------------------------------------------------------------------------- 4. the model
class SPEmbedding(nn.Module):
    """``embed`` ending in sequence shards: one reduce-scatter sums the ranks' partial lookups *and*
    shards them; then positions ``pos.weight[s0:s1]`` are added (gpt; their gradient is partial)."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        device = device or ranks.device()
        self.cfg, self.name = cfg, "embed"
        self.tok = nn.Module()
        self.tok.weight = local_param(cfg, "embed.tok.weight", device)
        if cfg.style == "gpt":
            self.pos = nn.Module()
            self.pos.weight = mark_sequence_parallel(local_param(cfg, "embed.pos.weight", device))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        start, stop = vocab_range(self.cfg.vocab_size)
        # TODO: like lab 4's lookup, then reduce_scatter_to_sequence_parallel_region
        raise NotImplementedError("not implemented yet: sp.SPEmbedding.forward")


class SPModel(nn.Module):
    """SPEmbedding, SPBlocks, the final norm on shards, the vocab-parallel head (its input
    all-gathered) and loss. Call ``sync_sequence_parallel_grads(model)`` after ``backward()``."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        # TODO: validate (sequence_parallel=True); embed, blocks, norm_f (sp_norm), head
        raise NotImplementedError("not implemented yet: sp.SPModel.__init__")

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, step: int = 0) -> torch.Tensor:
        # TODO: as lab 4's model; workbook.tensor_parallel.mappings has the vocab-parallel loss
        raise NotImplementedError("not implemented yet: sp.SPModel.forward")


def sync_sequence_parallel_grads(module: nn.Module) -> int:
    """After backward, sum over the ranks the gradients of the parameters tagged sequence-parallel
    (one all-reduce of them all, flattened). Each rank computed them from its S/n positions only;
    the sum is the reference's gradient, so the replicas stay equal. Returns how many were synced."""
    params = [p for p in module.parameters()
              if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if not params or tp_world_size() == 1:
        return len(params)
    # TODO: one flat buffer of every gradient, one all-reduce, copy each piece back
    raise NotImplementedError("not implemented yet: sp.sync_sequence_parallel_grads")
    return len(params)


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
