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
    ### BEGIN SOLUTION hint: sequence first, gather the [S/n, B, ...] pieces into an [S, B, ...] buffer, back
    xt = x.transpose(0, 1).contiguous()                                       # [S/n, B, H]
    full = torch.empty((n * xt.shape[0], *xt.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(full, xt)                                     # [S, B, H]
    return full.transpose(0, 1).contiguous()                                  # [B, S, H]
    ### END SOLUTION


def reduce_scatter_sequence(x: torch.Tensor) -> torch.Tensor:
    """``[B, S, ...] -> [B, S/n, ...]``: the sum over ranks, this rank's positions only (one
    ``dist.reduce_scatter_tensor`` on the sequence-first layout)."""
    n = tp_world_size()
    if n == 1:
        return x
    ### BEGIN SOLUTION hint: reduce-scatter [S, B, ...] into an [S/n, B, ...] buffer
    xt = x.transpose(0, 1).contiguous()                                       # [S, B, H]
    if xt.shape[0] % n:
        raise ValueError(f"sequence length {xt.shape[0]} is not divisible by tp={n}")
    mine = torch.empty((xt.shape[0] // n, *xt.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(mine, xt)                                      # [S/n, B, H]
    return mine.transpose(0, 1).contiguous()                                  # [B, S/n, H]
    ### END SOLUTION


def gather_from_sequence_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """Enter a parallel region from sequence shards: all-gather forward; reduce-scatter backward
    (each rank's gradient of the gathered input is a partial sum over its column slice)."""
    ### BEGIN SOLUTION hint: workbook.tensor_parallel.mappings.conjugate_op(x, forward, backward) with the functions above
    return conjugate_op(x, forward=all_gather_sequence, backward=reduce_scatter_sequence)
    ### END SOLUTION


def reduce_scatter_to_sequence_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """Leave a parallel region to sequence shards: reduce-scatter forward, all-gather backward."""
    ### BEGIN SOLUTION hint: the conjugate of the one above
    return conjugate_op(x, forward=reduce_scatter_sequence, backward=all_gather_sequence)
    ### END SOLUTION


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
        ### BEGIN SOLUTION hint: the full sequence (unless the caller gathered it), then the local linear
        if self.gather_input:
            x = gather_from_sequence_parallel_region(x)
        return model_ops.linear(x, self.weight, self.bias)
        ### END SOLUTION


class SPRowParallelLinear(nn.Module):
    """Row-parallel linear (``weight [out, in/n]``): ``[B, S, in/n]`` in, partial products reduce-scattered
    to ``[B, S/n, out]``, plus the replicated bias -- added on a shard, so its gradient is partial."""

    def __init__(self, cfg: ModelConfig, name: str, in_features: int, out_features: int, *,
                 bias: bool | None = None, device=None):
        super().__init__()
        self.name = name
        bias = cfg.style == "gpt" if bias is None else bias
        self.weight = local_param(cfg, f"{name}.weight", device)
        ### BEGIN SOLUTION hint: the full bias, tagged
        self.bias = mark_sequence_parallel(local_param(cfg, f"{name}.bias", device)) if bias else None
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION hint: the local matmul leaves the region as a sequence shard; then the bias
        y = reduce_scatter_to_sequence_parallel_region(model_ops.linear(x, self.weight))
        return y + self.bias if self.bias is not None else y
        ### END SOLUTION


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
        ### BEGIN SOLUTION hint: gather once, q k v, model_ops.causal_attention (rope_tables of the full sequence), wo
        x = gather_from_sequence_parallel_region(x)                          # [B, S, H]
        ctx = model_ops.causal_attention(self.wq(x), self.wk(x), self.wv(x), self.local_heads,
                                         rope_tables(self.cfg, x))
        return self.wo(ctx)                                                   # [B, S/n, H]
        ### END SOLUTION


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
        ### BEGIN SOLUTION hint: lab 4's MLP, entered from sequence shards
        x = gather_from_sequence_parallel_region(x)
        if self.cfg.style == "gpt":
            return self.fc2(model_ops.gelu(self.fc1(x)))
        return self.w_down(model_ops.silu(self.w_gate(x)) * self.w_up(x))
        ### END SOLUTION


def sp_norm(cfg: ModelConfig, name: str, device) -> nn.Module:
    """The reference norm ``name``, its parameters tagged: it runs on this rank's positions only."""
    norm = make_norm(cfg, name).to(device)
    ### BEGIN SOLUTION hint: mark_sequence_parallel on each of its parameters
    for p in norm.parameters():
        mark_sequence_parallel(p)
    ### END SOLUTION
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
        ### BEGIN SOLUTION hint: dropout_mask of shape [B, S, H] (S the full length), then [:, s0:s1]
        S = x.shape[1] * tp_world_size()
        s0, s1 = sequence_range(S)
        mask = dropout_mask(self.cfg, f"{self.name}.{site}.dropout", (x.shape[0], S, x.shape[2]),
                            step, x.device)
        return x * mask[:, s0:s1].contiguous()      # a copy: a view would keep the full mask alive
        ### END SOLUTION

    def forward(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
        ### BEGIN SOLUTION hint: the same residual stream as lab 4, on shards
        x = x + self.dropout(self.attn(self.norm1(x)), "attn", step)
        x = x + self.dropout(self.mlp(self.norm2(x)), "mlp", step)
        return x
        ### END SOLUTION


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
        ### BEGIN SOLUTION hint: like lab 4's lookup, then reduce_scatter_to_sequence_parallel_region
        mine = (tokens >= start) & (tokens < stop)
        local_ids = (tokens - start).clamp(0, stop - start - 1)
        h = self.tok.weight[local_ids] * mine.unsqueeze(-1).to(self.tok.weight.dtype)
        h = reduce_scatter_to_sequence_parallel_region(h)                    # [B, S/n, H]
        if self.cfg.style == "gpt":
            s0, s1 = sequence_range(tokens.shape[1])
            h = h + self.pos.weight[s0:s1]
        return h
        ### END SOLUTION


class SPModel(nn.Module):
    """SPEmbedding, SPBlocks, the final norm on shards, the vocab-parallel head (its input
    all-gathered) and loss. Call ``sync_sequence_parallel_grads(model)`` after ``backward()``."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        ### BEGIN SOLUTION hint: validate (sequence_parallel=True); embed, blocks, norm_f (sp_norm), head
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        device = device or ranks.device()
        self.cfg, self.name = cfg, ""
        self.embed = SPEmbedding(cfg, device)
        self.blocks = nn.ModuleList(SPBlock(cfg, i, device) for i in range(cfg.n_layers))
        self.norm_f = sp_norm(cfg, "norm_f", device)
        self.head = SPColumnParallelLinear(cfg, "head", cfg.hidden, cfg.vocab_size, bias=False,
                                           device=device)
        ### END SOLUTION

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, step: int = 0) -> torch.Tensor:
        ### BEGIN SOLUTION hint: as lab 4's model; workbook.tensor_parallel.mappings has the vocab-parallel loss
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h, step)
        local_logits = self.head(self.norm_f(h))                             # [B, S, V/n]
        return vocab_parallel_cross_entropy(local_logits, targets, self.cfg.vocab_size)
        ### END SOLUTION


def sync_sequence_parallel_grads(module: nn.Module) -> int:
    """After backward, sum over the ranks the gradients of the parameters tagged sequence-parallel
    (one all-reduce of them all, flattened). Each rank computed them from its S/n positions only;
    the sum is the reference's gradient, so the replicas stay equal. Returns how many were synced."""
    params = [p for p in module.parameters()
              if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if not params or tp_world_size() == 1:
        return len(params)
    ### BEGIN SOLUTION hint: one flat buffer of every gradient, one all-reduce, copy each piece back
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    for p, summed in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(summed.view_as(p.grad))
    ### END SOLUTION
    return len(params)


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
