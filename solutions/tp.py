"""Lab 4 -- tensor parallelism (Megatron-LM, arXiv 1909.08053 sec. 3): split every matrix over n ranks.

Lesson 4 explains it: column-parallel matrices keep ``out/n`` output features, row-parallel ones
``in/n`` input features, and two conjugate operators, f and g, carry all the communication. Weights
come from the reference model (given helpers: ``workbook/tp.py``), so every result is compared with
one device. Run: ``workbook run tp`` or ``torchrun --nproc_per_node=4 labs/tp.py``; grade:
``workbook grade --lab tp``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from workbook.model import ModelConfig, dropout_mask
from workbook.model import ops as model_ops    # (not "ops": cloudpickle would mistake it for torch.ops)
from workbook.model.reference import make_norm, rope_tables
from workbook.tensor_parallel.mappings import all_reduce_sum, conjugate_op, gather_last_dim, local_param, split_last_dim, tp_world_size, vocab_range
from workbook.runtime import ranks


# --------------------------------------------------------------------------- 1. the conjugate ops
class _CopyToTensorParallelRegion(torch.autograd.Function):
    """f: identity forward; all-reduce backward (each rank's dL/dx covers only its column slice)."""
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)                    # (given) the input is already on every rank

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION hint: each rank holds only its slice's share of dL/dx
        return all_reduce_sum(grad)
        ### END SOLUTION


class _ReduceFromTensorParallelRegion(torch.autograd.Function):
    """g: all-reduce forward (sum the partial outputs); identity backward (dL/dy is replicated)."""
    @staticmethod
    def forward(ctx, x):
        ### BEGIN SOLUTION hint: add the partial sums of every rank
        return all_reduce_sum(x)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        return grad                            # (given) the output is replicated, so is dL/dy


copy_to_tensor_parallel_region = _CopyToTensorParallelRegion.apply          # f
reduce_from_tensor_parallel_region = _ReduceFromTensorParallelRegion.apply  # g


def scatter_to_tensor_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """Keep this rank's slice of the last dim; backward all-gathers the slices' gradients."""
    ### BEGIN SOLUTION hint: workbook.tensor_parallel.mappings.conjugate_op(x, forward, backward) with the two given helpers
    return conjugate_op(x, forward=split_last_dim, backward=gather_last_dim)
    ### END SOLUTION


def gather_from_tensor_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """All-gather along the last dim (forward); keep this rank's slice of the gradient
    (backward): the mirror image of scatter."""
    ### BEGIN SOLUTION hint: as scatter, the other way round
    return conjugate_op(x, forward=gather_last_dim, backward=split_last_dim)
    ### END SOLUTION


# --------------------------------------------------------------------------- 2. parallel linears
class ColumnParallelLinear(nn.Module):
    """y = x W^T + b, W ``[out, in]`` split by rows: rank r computes output features ``r*out/n :
    (r+1)*out/n``. ``copy_input``: apply f first (False when the caller applied f once for several
    layers, as for q, k, v); ``gather_output``: all-gather the slices into ``[..., out]``."""

    def __init__(self, cfg: ModelConfig, name: str, in_features: int, out_features: int, *,
                 bias: bool | None = None, gather_output: bool = False, copy_input: bool = True,
                 device=None):
        super().__init__()
        self.name, self.gather_output, self.copy_input = name, gather_output, copy_input
        bias = cfg.style == "gpt" if bias is None else bias
        ### BEGIN SOLUTION hint: self.weight [out/n, in] and self.bias [out/n] (or None), with local_param
        self.weight = local_param(cfg, f"{name}.weight", device)
        self.bias = local_param(cfg, f"{name}.bias", device) if bias else None
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION hint: f (if copy_input), the local linear, gather (if gather_output)
        if self.copy_input:
            x = copy_to_tensor_parallel_region(x)
        y = model_ops.linear(x, self.weight, self.bias)                  # [..., out/n]
        return gather_from_tensor_parallel_region(y) if self.gather_output else y
        ### END SOLUTION


class RowParallelLinear(nn.Module):
    """y = x W^T + b, W ``[out, in]`` split by columns: rank r multiplies input features ``r*in/n
    : (r+1)*in/n``, g sums the partial products, then the replicated bias is added once (before
    g it would count n times). ``input_is_parallel=False``: scatter a full input first."""

    def __init__(self, cfg: ModelConfig, name: str, in_features: int, out_features: int, *,
                 bias: bool | None = None, input_is_parallel: bool = True, device=None):
        super().__init__()
        self.name, self.input_is_parallel = name, input_is_parallel
        bias = cfg.style == "gpt" if bias is None else bias
        ### BEGIN SOLUTION hint: self.weight [out, in/n]; self.bias [out], the full (replicated) bias
        self.weight = local_param(cfg, f"{name}.weight", device)
        self.bias = local_param(cfg, f"{name}.bias", device) if bias else None
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION hint: scatter (unless input_is_parallel), local matmul, g, then the bias
        if not self.input_is_parallel:
            x = scatter_to_tensor_parallel_region(x)
        y = reduce_from_tensor_parallel_region(model_ops.linear(x, self.weight))    # [..., out]
        return y + self.bias if self.bias is not None else y
        ### END SOLUTION


# --------------------------------------------------------------------------- 3. MLP, attention, block
class TPMLP(nn.Module):
    """``blocks.{layer}.mlp`` over n ranks, one f at the input and one g at the output. gpt:
    fc2(gelu(fc1 x)); llama: w_down(silu(w_gate x) * w_up x); the middle runs on F/n features."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size())
        self.cfg, self.name = cfg, f"blocks.{layer}.mlp"
        H, F = cfg.hidden, cfg.ffn_hidden
        ### BEGIN SOLUTION hint: attributes named like the reference: fc1, fc2 / w_gate, w_up, w_down
        col = dict(copy_input=False, device=device)
        if cfg.style == "gpt":
            self.fc1 = ColumnParallelLinear(cfg, f"{self.name}.fc1", H, F, **col)
            self.fc2 = RowParallelLinear(cfg, f"{self.name}.fc2", F, H, device=device)
        else:
            self.w_gate = ColumnParallelLinear(cfg, f"{self.name}.w_gate", H, F, **col)
            self.w_up = ColumnParallelLinear(cfg, f"{self.name}.w_up", H, F, **col)
            self.w_down = RowParallelLinear(cfg, f"{self.name}.w_down", F, H, device=device)
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION hint: f once for all column layers, then the reference's formula
        x = copy_to_tensor_parallel_region(x)                         # f: [B, S, H] replicated
        if self.cfg.style == "gpt":
            return self.fc2(model_ops.gelu(self.fc1(x)))                    # [B,S,F/n] -> g -> [B,S,H]
        return self.w_down(model_ops.silu(self.w_gate(x)) * self.w_up(x))
        ### END SOLUTION


class TPAttention(nn.Module):
    """Causal self-attention of ``blocks.{layer}`` on heads/n heads per rank: wq, wk, wv
    column-parallel (their output features are whole heads), wo row-parallel."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size())
        self.cfg, self.name = cfg, f"blocks.{layer}.attn"
        H, self.local_heads = cfg.hidden, cfg.heads // tp_world_size()
        ### BEGIN SOLUTION hint: wq, wk, wv (ColumnParallelLinear, copy_input=False), wo (row)
        for w in ("wq", "wk", "wv"):
            setattr(self, w, ColumnParallelLinear(cfg, f"{self.name}.{w}", H, H, copy_input=False,
                                                  device=device))
        self.wo = RowParallelLinear(cfg, f"{self.name}.wo", H, H, device=device)
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION hint: f once, q k v on the local heads, model_ops.causal_attention (rope_tables), wo
        x = copy_to_tensor_parallel_region(x)
        ctx = model_ops.causal_attention(self.wq(x), self.wk(x), self.wv(x), self.local_heads,
                                         rope_tables(self.cfg, x))
        return self.wo(ctx)                                           # [B,S,H/n] -> g -> [B,S,H]
        ### END SOLUTION


class TPBlock(nn.Module):
    """Pre-norm block ``blocks.{layer}``: TPAttention and TPMLP between replicated norms, dropouts
    and residual adds (every rank does them on the whole, identical activation)."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size())
        device = device or ranks.device()
        self.cfg, self.layer, self.name = cfg, layer, f"blocks.{layer}"
        self.norm1 = make_norm(cfg, f"{self.name}.norm1").to(device)
        self.norm2 = make_norm(cfg, f"{self.name}.norm2").to(device)
        ### BEGIN SOLUTION hint: the two parallel sublayers, named like the reference's
        self.attn = TPAttention(cfg, layer, device)
        self.mlp = TPMLP(cfg, layer, device)
        ### END SOLUTION

    def dropout(self, x: torch.Tensor, site: str, step: int) -> torch.Tensor:
        """The reference's dropout: the same mask on every rank (the activation is replicated)."""
        if not self.training or self.cfg.dropout == 0.0:
            return x
        return x * dropout_mask(self.cfg, f"{self.name}.{site}.dropout", x.shape, step, x.device)

    def forward(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
        ### BEGIN SOLUTION hint: pre-norm residuals, as in workbook.model.Block
        x = x + self.dropout(self.attn(self.norm1(x)), "attn", step)
        x = x + self.dropout(self.mlp(self.norm2(x)), "mlp", step)
        return x
        ### END SOLUTION


# --------------------------------------------------------------------------- 4. vocab-parallel model
class VocabParallelEmbedding(nn.Module):
    """``embed``: token rows split by vocab (V/n per rank) and replicated positions (gpt). A rank
    looks up the tokens it holds, writes zeros for the others; g adds the n partial embeddings."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size())
        self.cfg, self.name = cfg, "embed"
        self.tok = nn.Module()
        self.tok.weight = local_param(cfg, "embed.tok.weight", device)        # [V/n, H]
        if cfg.style == "gpt":
            self.pos = nn.Module()
            self.pos.weight = local_param(cfg, "embed.pos.weight", device)    # [S, H], replicated

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        start, stop = vocab_range(self.cfg.vocab_size)
        ### BEGIN SOLUTION hint: local ids = tokens - start, zeros outside [start, stop), g, then + positions (gpt)
        mine = (tokens >= start) & (tokens < stop)                            # [B, S]
        local_ids = (tokens - start).clamp(0, stop - start - 1)
        h = self.tok.weight[local_ids] * mine.unsqueeze(-1).to(self.tok.weight.dtype)
        h = reduce_from_tensor_parallel_region(h)                             # [B, S, H]
        if self.cfg.style == "gpt":
            h = h + self.pos.weight[: tokens.shape[1]]
        return h
        ### END SOLUTION


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, targets: torch.Tensor,
                                 vocab_size: int) -> torch.Tensor:
    """Mean over tokens of ``log sum_v exp(z_v - m) - (z_target - m)`` from this rank's logits
    ``[B, S, V/n]``, m the max over the whole vocabulary: one all-reduce (MAX) for m, one g each
    for the sum of exponentials and the target logit (one rank holds it). No full logits."""
    start, stop = vocab_range(vocab_size)
    ### BEGIN SOLUTION hint: m needs no gradient (the loss does not depend on it); mask the target
    m = local_logits.detach().amax(dim=-1, keepdim=True)                      # [B, S, 1]
    if tp_world_size() > 1:
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
    shifted = local_logits - m
    sum_exp = reduce_from_tensor_parallel_region(shifted.exp().sum(dim=-1))   # [B, S]
    is_mine = (targets >= start) & (targets < stop)
    local_t = (targets - start).clamp(0, stop - start - 1)
    picked = shifted.gather(-1, local_t.unsqueeze(-1)).squeeze(-1) * is_mine.to(shifted.dtype)
    return (sum_exp.log() - reduce_from_tensor_parallel_region(picked)).mean()
    ### END SOLUTION


class TPModel(nn.Module):
    """``ReferenceModel`` over n ranks, parameter names unchanged: vocab-parallel embedding, TP
    blocks, replicated final norm, vocab-parallel head (column-parallel, no bias) and loss."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size())
        device = device or ranks.device()
        self.cfg, self.name = cfg, ""
        ### BEGIN SOLUTION hint: embed, blocks (nn.ModuleList), norm_f (make_norm), head
        self.embed = VocabParallelEmbedding(cfg, device)
        self.blocks = nn.ModuleList(TPBlock(cfg, i, device) for i in range(cfg.n_layers))
        self.norm_f = make_norm(cfg, "norm_f").to(device)
        self.head = ColumnParallelLinear(cfg, "head", cfg.hidden, cfg.vocab_size, bias=False,
                                         device=device)
        ### END SOLUTION

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, step: int = 0) -> torch.Tensor:
        ### BEGIN SOLUTION hint: embed, every block (with the step), final norm, head, the vocab-parallel loss
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h, step)
        local_logits = self.head(self.norm_f(h))                             # [B, S, V/n]
        return vocab_parallel_cross_entropy(local_logits, targets, self.cfg.vocab_size)
        ### END SOLUTION


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
