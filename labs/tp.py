# Generated from solutions/tp.py by `workbook assign`: this is your file to edit.
# Replace each `raise NotImplementedError` with your code, then grade it with
#     workbook grade --lab tp
#
# Your tasks (28 pts in all):
#    1. _CopyToTensorParallelRegion.backward (0.75 pts): f: identity forward; all-reduce backward
#       (each rank's dL/dx covers only its column slice).
#    2. _ReduceFromTensorParallelRegion.forward (0.75 pts): g: all-reduce forward (sum the partial
#       outputs); identity backward (dL/dy is replicated).
#    3. scatter_to_tensor_parallel_region (0.75 pts): Keep this rank's slice of the last dim;
#       backward all-gathers the slices' gradients.
#    4. gather_from_tensor_parallel_region (0.75 pts): All-gather along the last dim (forward);
#       keep this rank's slice of the gradient (backward): the mirror image of scatter.
#    5. ColumnParallelLinear.__init__ and .forward (1.5 pts): y = x W^T + b, W `[out, in]` split by
#       rows: rank r computes output features `r*out/n : (r+1)*out/n`.
#    6. RowParallelLinear.__init__ and .forward (1.5 pts): y = x W^T + b, W `[out, in]` split by
#       columns: rank r multiplies input features `r*in/n : (r+1)*in/n`, g sums the partial
#       products, then the replicated bias is added once (before g it would count n times).
#    7. TPMLP.__init__ and .forward (3 pts): `blocks.{layer}.mlp` over n ranks, one f at the input
#       and one g at the output.
#    8. TPAttention.__init__ and .forward (3 pts): Causal self-attention of `blocks.{layer}` on
#       heads/n heads per rank: wq, wk, wv column-parallel (their output features are whole heads),
#       wo row-parallel.
#    9. TPBlock.__init__ and .forward (9 pts): Pre-norm block `blocks.{layer}`: TPAttention and
#       TPMLP between replicated norms, dropouts and residual adds (every rank does them on the
#       whole, identical activation).
#   10. VocabParallelEmbedding.forward (1.33 pts): `embed`: token rows split by vocab (V/n per
#       rank) and replicated positions (gpt).
#   11. vocab_parallel_cross_entropy (2.33 pts): Mean over tokens of
#       `log sum_v exp(z_v - m) - (z_target - m)` from this rank's logits `[B, S, V/n]`, m the max
#       over the whole vocabulary: one all-reduce (MAX) for m, one g each for the sum of
#       exponentials and the target logit (one rank holds it).
#   12. TPModel.__init__ and .forward (3.33 pts): `ReferenceModel` over n ranks, parameter names
#       unchanged: vocab-parallel embedding, TP blocks, replicated final norm, vocab-parallel head
#       (column-parallel, no bias) and loss.
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
        # TODO: each rank holds only its slice's share of dL/dx
        raise NotImplementedError("not implemented yet: tp._CopyToTensorParallelRegion.backward")


class _ReduceFromTensorParallelRegion(torch.autograd.Function):
    """g: all-reduce forward (sum the partial outputs); identity backward (dL/dy is replicated)."""
    @staticmethod
    def forward(ctx, x):
        # TODO: add the partial sums of every rank
        raise NotImplementedError("not implemented yet: tp._ReduceFromTensorParallelRegion.forward")

    @staticmethod
    def backward(ctx, grad):
        return grad                            # (given) the output is replicated, so is dL/dy


copy_to_tensor_parallel_region = _CopyToTensorParallelRegion.apply          # f
reduce_from_tensor_parallel_region = _ReduceFromTensorParallelRegion.apply  # g


def scatter_to_tensor_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """Keep this rank's slice of the last dim; backward all-gathers the slices' gradients."""
    # TODO: workbook.tensor_parallel.mappings.conjugate_op(x, forward, backward) with the two given
    #       helpers
    raise NotImplementedError("not implemented yet: tp.scatter_to_tensor_parallel_region")


def gather_from_tensor_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """All-gather along the last dim (forward); keep this rank's slice of the gradient
    (backward): the mirror image of scatter."""
    # TODO: as scatter, the other way round
    raise NotImplementedError("not implemented yet: tp.gather_from_tensor_parallel_region")


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
        # TODO: self.weight [out/n, in] and self.bias [out/n] (or None), with local_param
        raise NotImplementedError("not implemented yet: tp.ColumnParallelLinear.__init__")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO: f (if copy_input), the local linear, gather (if gather_output)
        raise NotImplementedError("not implemented yet: tp.ColumnParallelLinear.forward")


class RowParallelLinear(nn.Module):
    """y = x W^T + b, W ``[out, in]`` split by columns: rank r multiplies input features ``r*in/n
    : (r+1)*in/n``, g sums the partial products, then the replicated bias is added once (before
    g it would count n times). ``input_is_parallel=False``: scatter a full input first."""

    def __init__(self, cfg: ModelConfig, name: str, in_features: int, out_features: int, *,
                 bias: bool | None = None, input_is_parallel: bool = True, device=None):
        super().__init__()
        self.name, self.input_is_parallel = name, input_is_parallel
        bias = cfg.style == "gpt" if bias is None else bias
        # TODO: self.weight [out, in/n]; self.bias [out], the full (replicated) bias
        raise NotImplementedError("not implemented yet: tp.RowParallelLinear.__init__")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO: scatter (unless input_is_parallel), local matmul, g, then the bias
        raise NotImplementedError("not implemented yet: tp.RowParallelLinear.forward")


# --------------------------------------------------------------------------- 3. MLP, attention, block
class TPMLP(nn.Module):
    """``blocks.{layer}.mlp`` over n ranks, one f at the input and one g at the output. gpt:
    fc2(gelu(fc1 x)); llama: w_down(silu(w_gate x) * w_up x); the middle runs on F/n features."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size())
        self.cfg, self.name = cfg, f"blocks.{layer}.mlp"
        H, F = cfg.hidden, cfg.ffn_hidden
        # TODO: attributes named like the reference: fc1, fc2 / w_gate, w_up, w_down
        raise NotImplementedError("not implemented yet: tp.TPMLP.__init__")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO: f once for all column layers, then the reference's formula
        raise NotImplementedError("not implemented yet: tp.TPMLP.forward")


class TPAttention(nn.Module):
    """Causal self-attention of ``blocks.{layer}`` on heads/n heads per rank: wq, wk, wv
    column-parallel (their output features are whole heads), wo row-parallel."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size())
        self.cfg, self.name = cfg, f"blocks.{layer}.attn"
        H, self.local_heads = cfg.hidden, cfg.heads // tp_world_size()
        # TODO: wq, wk, wv (ColumnParallelLinear, copy_input=False), wo (row)
        raise NotImplementedError("not implemented yet: tp.TPAttention.__init__")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO: f once, q k v on the local heads, model_ops.causal_attention (rope_tables), wo
        raise NotImplementedError("not implemented yet: tp.TPAttention.forward")


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
        # TODO: the two parallel sublayers, named like the reference's
        raise NotImplementedError("not implemented yet: tp.TPBlock.__init__")

    def dropout(self, x: torch.Tensor, site: str, step: int) -> torch.Tensor:
        """The reference's dropout: the same mask on every rank (the activation is replicated)."""
        if not self.training or self.cfg.dropout == 0.0:
            return x
        return x * dropout_mask(self.cfg, f"{self.name}.{site}.dropout", x.shape, step, x.device)

    def forward(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
        # TODO: pre-norm residuals, as in workbook.model.Block
        raise NotImplementedError("not implemented yet: tp.TPBlock.forward")


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
        # TODO: local ids = tokens - start, zeros outside [start, stop), g, then + positions (gpt)
        raise NotImplementedError("not implemented yet: tp.VocabParallelEmbedding.forward")


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, targets: torch.Tensor,
                                 vocab_size: int) -> torch.Tensor:
    """Mean over tokens of ``log sum_v exp(z_v - m) - (z_target - m)`` from this rank's logits
    ``[B, S, V/n]``, m the max over the whole vocabulary: one all-reduce (MAX) for m, one g each
    for the sum of exponentials and the target logit (one rank holds it). No full logits."""
    start, stop = vocab_range(vocab_size)
    # TODO: m needs no gradient (the loss does not depend on it); mask the target
    raise NotImplementedError("not implemented yet: tp.vocab_parallel_cross_entropy")


class TPModel(nn.Module):
    """``ReferenceModel`` over n ranks, parameter names unchanged: vocab-parallel embedding, TP
    blocks, replicated final norm, vocab-parallel head (column-parallel, no bias) and loss."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size())
        device = device or ranks.device()
        self.cfg, self.name = cfg, ""
        # TODO: embed, blocks (nn.ModuleList), norm_f (make_norm), head
        raise NotImplementedError("not implemented yet: tp.TPModel.__init__")

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, step: int = 0) -> torch.Tensor:
        # TODO: embed, every block (with the step), final norm, head, the vocab-parallel loss
        raise NotImplementedError("not implemented yet: tp.TPModel.forward")


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
