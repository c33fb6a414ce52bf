# Generated from solutions/tp.py by `workbook assign` (level: standard): this is your file to edit.
# Replace each `raise NotImplementedError` with your code; check it with `workbook run tp`
# (or `workbook watch tp`). Stuck on task N? `workbook hint tp N`, one hint at a time.
#
# Your tasks (28 pts in all):
#    1. _CopyToTensorParallelRegion.backward (0.75 pts): f, the operator that enters a parallel
#       region (lesson 4, "The conjugate pair f and g").
#    2. _ReduceFromTensorParallelRegion.forward (0.75 pts): g, the operator that leaves a parallel
#       region (lesson 4, "The conjugate pair f and g").
#    3. scatter_to_tensor_parallel_region (0.75 pts): Enter a parallel region from a replicated
#       tensor by keeping this rank's slice of its last dim (lesson 4, "The conjugate pair f and
#       g", the scatter and gather pair).
#    4. gather_from_tensor_parallel_region (0.75 pts): Leave a parallel region by joining the
#       ranks' slices of the last dim: the mirror image of the scatter above (lesson 4, "The
#       conjugate pair f and g").
#    5. ColumnParallelLinear.__init__ and .forward (1.5 pts): A linear layer of the reference model
#       with its weight split by output features (lesson 4, "Splitting a linear layer").
#    6. RowParallelLinear.__init__ and .forward (1.5 pts): A linear layer of the reference model
#       with its weight split by input features (lesson 4, "Splitting a linear layer", and the bias
#       rule under it).
#    7. TPMLP.__init__ and .forward (3 pts): The reference's MLP `blocks.{layer}.mlp`
#       (`workbook.model.reference.MLP`, both styles) over n ranks (lesson 4, "Splitting a linear
#       layer": why one column layer and one row layer).
#    8. TPAttention.__init__ and .forward (3 pts): The reference's causal self-attention
#       `blocks.{layer}.attn` (`workbook.model.reference.Attention`) on `heads/n` heads per rank
#       (lesson 4, "Attention and the vocabulary").
#    9. TPBlock.__init__ and .forward (9 pts): The reference's pre-norm block of the given layer
#       (`workbook.model.reference.Block`) over n ranks (lesson 4, "The conjugate pair f and g",
#       the block figure).
#   10. VocabParallelEmbedding.forward (1.33 pts): The reference's embedding `embed` with its token
#       table split by vocabulary rows (lesson 4, "Attention and the vocabulary").
#   11. vocab_parallel_cross_entropy (2.33 pts): The mean next-token cross-entropy over all `B*S`
#       tokens, from this rank's slice of the logits (lesson 4, "Attention and the vocabulary").
#   12. TPModel.__init__ and .forward (3.33 pts): The reference model
#       (`workbook.model.ReferenceModel`) over n ranks, every parameter under its reference name
#       (lesson 4, "Attention and the vocabulary").
"""Lab 4 -- tensor parallelism (Megatron-LM, arXiv 1909.08053 sec. 3): the reference transformer
split over n ranks, every result equal to one device's.

You build, in order: the four communication operators of a parallel region; the column- and
row-parallel linear layers; the MLP, the attention and the pre-norm block on 1/n of the weights;
then the vocab-parallel embedding and loss and the whole model. Each task's docstring is its
spec; lesson 4 (``lessons/04_tensor_parallel``) teaches the ideas, and ``workbook hint tp TASK``
gives hints, one rung at a time.

Given: the reference model (``workbook.model``: its maths in ``workbook.model.ops``, norms and
RoPE tables in ``workbook.model.reference``) and the pieces in ``workbook.tensor_parallel.mappings``
(where this rank stands, which slice of a reference parameter it holds, an autograd operator made
of a forward and a backward function). Run: ``workbook run tp`` or
``torchrun --nproc_per_node=4 labs/tp.py``; grade: ``workbook grade --lab tp``.
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
    """f, the operator that enters a parallel region (lesson 4, "The conjugate pair f and g").

    Forward (given): the replicated input, unchanged. Backward (yours): from this rank's gradient
    of the output, the gradient of the input, which must be the single-device gradient on every
    rank. Same shape both ways; any dtype."""
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)                    # (given) the input is already on every rank

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("not implemented yet: tp._CopyToTensorParallelRegion.backward")


class _ReduceFromTensorParallelRegion(torch.autograd.Function):
    """g, the operator that leaves a parallel region (lesson 4, "The conjugate pair f and g").

    Forward (yours): each rank holds a partial result of the same shape; return the full
    result, the same on every rank. Backward (given): the gradient passes through unchanged."""
    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError("not implemented yet: tp._ReduceFromTensorParallelRegion.forward")

    @staticmethod
    def backward(ctx, grad):
        return grad                            # (given) the output is replicated, so is dL/dy


copy_to_tensor_parallel_region = _CopyToTensorParallelRegion.apply          # f
reduce_from_tensor_parallel_region = _ReduceFromTensorParallelRegion.apply  # g


def scatter_to_tensor_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """Enter a parallel region from a replicated tensor by keeping this rank's slice of its last
    dim (lesson 4, "The conjugate pair f and g", the scatter and gather pair).

    Forward: ``[..., n*k]``, the same on every rank, to ``[..., k]``, the k features of rank r in
    rank order, with no communication. Backward: the gradient of the replicated input, whole, as
    one device would compute it. Works for n = 1 (identity)."""
    raise NotImplementedError("not implemented yet: tp.scatter_to_tensor_parallel_region")


def gather_from_tensor_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """Leave a parallel region by joining the ranks' slices of the last dim: the mirror image of
    the scatter above (lesson 4, "The conjugate pair f and g").

    Forward: ``[..., k]`` on each rank to ``[..., n*k]`` on every rank, rank r's piece at
    features ``r*k : (r+1)*k``. Backward: this rank's piece of the gradient."""
    raise NotImplementedError("not implemented yet: tp.gather_from_tensor_parallel_region")


# --------------------------------------------------------------------------- 2. parallel linears
class ColumnParallelLinear(nn.Module):
    """A linear layer of the reference model with its weight split by output features
    (lesson 4, "Splitting a linear layer").

    * Parameters: this rank's pieces of the reference layer ``name``'s parameters, under the
      names the reference ``Linear`` gives them: rank r holds output features ``r*out/n :
      (r+1)*out/n`` of the weight and of the bias. A bias exists if asked for; by default
      (None) as in the reference, for the gpt style only.
    * Input ``[..., in]``, the same on every rank. Output ``[..., out/n]``, this rank's
      features; or, with the output-gathering option, the full ``[..., out]`` on every rank.
    * Communication: the layer enters the parallel region itself (f) unless its input-copy
      option is off, which a caller that enters once for several layers (q, k and v) uses.
    * Gradients of the input and of the local parameters equal the matching slices of one
      device's."""

    def __init__(self, cfg: ModelConfig, name: str, in_features: int, out_features: int, *,
                 bias: bool | None = None, gather_output: bool = False, copy_input: bool = True,
                 device=None):
        super().__init__()
        self.name, self.gather_output, self.copy_input = name, gather_output, copy_input
        bias = cfg.style == "gpt" if bias is None else bias
        raise NotImplementedError("not implemented yet: tp.ColumnParallelLinear.__init__")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("not implemented yet: tp.ColumnParallelLinear.forward")


class RowParallelLinear(nn.Module):
    """A linear layer of the reference model with its weight split by input features
    (lesson 4, "Splitting a linear layer", and the bias rule under it).

    * Parameters: under the reference ``Linear``'s names, rank r holds input features
      ``r*in/n : (r+1)*in/n`` of the weight; the bias (if any; by default as in the reference)
      is replicated, whole on every rank.
    * Input ``[..., in/n]``, this rank's features (or, with the input-is-parallel option off,
      the full ``[..., in]`` on every rank, from which the layer takes its own slice).
      Output ``[..., out]``, the single-device output, on every rank.
    * Communication: the layer leaves the parallel region itself (g), once per forward.
    * Gradients equal the matching slices of one device's."""

    def __init__(self, cfg: ModelConfig, name: str, in_features: int, out_features: int, *,
                 bias: bool | None = None, input_is_parallel: bool = True, device=None):
        super().__init__()
        self.name, self.input_is_parallel = name, input_is_parallel
        bias = cfg.style == "gpt" if bias is None else bias
        raise NotImplementedError("not implemented yet: tp.RowParallelLinear.__init__")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("not implemented yet: tp.RowParallelLinear.forward")


# --------------------------------------------------------------------------- 3. MLP, attention, block
class TPMLP(nn.Module):
    """The reference's MLP ``blocks.{layer}.mlp`` (``workbook.model.reference.MLP``, both
    styles) over n ranks (lesson 4, "Splitting a linear layer": why one column layer and one
    row layer).

    * Built from this rank's pieces of the reference's parameters; the submodules are named
      as the reference's, so every parameter has the reference's full name. Shapes that do
      not split over the ranks raise the configuration's one-line ValueError.
    * Input and output [B, S, H], replicated; the hidden activation stays split (F/n of its
      features per rank) and is never gathered.
    * Communication: one f at the input, shared by every first-layer matrix, and one g at
      the output: one all-reduce of B*S*H numbers per pass."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size())
        self.cfg, self.name = cfg, f"blocks.{layer}.mlp"
        H, F = cfg.hidden, cfg.ffn_hidden
        raise NotImplementedError("not implemented yet: tp.TPMLP.__init__")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("not implemented yet: tp.TPMLP.forward")


class TPAttention(nn.Module):
    """The reference's causal self-attention ``blocks.{layer}.attn``
    (``workbook.model.reference.Attention``) on ``heads/n`` heads per rank (lesson 4,
    "Attention and the vocabulary").

    * Built from this rank's pieces of the reference's parameters, submodules named as the
      reference's; each rank's heads are whole heads. Shapes that do not split raise the
      configuration's one-line ValueError (given).
    * Input and output [B, S, H], replicated; llama rotates queries and keys as the
      reference does (the given RoPE tables).
    * Communication: one f for the three input projections together and one g at the output."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size())
        self.cfg, self.name = cfg, f"blocks.{layer}.attn"
        H, self.local_heads = cfg.hidden, cfg.heads // tp_world_size()
        raise NotImplementedError("not implemented yet: tp.TPAttention.__init__")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("not implemented yet: tp.TPAttention.forward")


class TPBlock(nn.Module):
    """The reference's pre-norm block of the given layer (``workbook.model.reference.Block``)
    over n ranks (lesson 4, "The conjugate pair f and g", the block figure).

    * Submodules named as the reference's: the given norms, and this lab's parallel attention
      and MLP. Everything outside the two parallel regions (norms, dropouts, residual adds) runs
      whole on every rank, on the same activation.
    * Forward: [B, S, H] replicated in and out, equal to the reference's for the same step
      number (which selects the dropout masks, in training mode).
    * Communication: two all-reduces of B*S*H numbers in the forward pass and two in the
      backward pass, nothing else."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size())
        device = device or ranks.device()
        self.cfg, self.layer, self.name = cfg, layer, f"blocks.{layer}"
        self.norm1 = make_norm(cfg, f"{self.name}.norm1").to(device)
        self.norm2 = make_norm(cfg, f"{self.name}.norm2").to(device)
        raise NotImplementedError("not implemented yet: tp.TPBlock.__init__")

    def dropout(self, x: torch.Tensor, site: str, step: int) -> torch.Tensor:
        """The reference's dropout: the same mask on every rank (the activation is replicated)."""
        if not self.training or self.cfg.dropout == 0.0:
            return x
        return x * dropout_mask(self.cfg, f"{self.name}.{site}.dropout", x.shape, step, x.device)

    def forward(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
        raise NotImplementedError("not implemented yet: tp.TPBlock.forward")


# --------------------------------------------------------------------------- 4. vocab-parallel model
class VocabParallelEmbedding(nn.Module):
    """The reference's embedding ``embed`` with its token table split by vocabulary rows
    (lesson 4, "Attention and the vocabulary").

    * Parameters: rank r's rows of the token table, V/n of them (the ids of ``vocab_range``),
      and for gpt the learned positions, replicated, under the names the reference
      ``Embedding`` gives them.
    * Forward: token ids [B, S] (any id below V, the same on every rank) to [B, S, H], the
      reference's embedding, on every rank.
    * Communication: one g of B*S*H numbers in forward, none in backward; each rank's table gets
      the gradient of its own rows only."""

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
        raise NotImplementedError("not implemented yet: tp.VocabParallelEmbedding.forward")


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, targets: torch.Tensor,
                                 vocab_size: int) -> torch.Tensor:
    """The mean next-token cross-entropy over all ``B*S`` tokens, from this rank's slice of the
    logits (lesson 4, "Attention and the vocabulary").

    * In: this rank's logits [B, S, V/n], for its vocabulary ids (``vocab_range``), and the
      target ids [B, S], below V, the same on every rank.
    * Returns the scalar loss of the reference (``workbook.model.ops``' cross-entropy on the
      full logits), on every rank, numerically stable for large logits; its gradient is this
      rank's slice of the reference's.
    * Communication: only reductions over the ranks of tensors of B*S numbers, at most three
      in the forward pass and none in the backward pass; no rank builds or saves a tensor as
      wide as the vocabulary."""
    start, stop = vocab_range(vocab_size)
    raise NotImplementedError("not implemented yet: tp.vocab_parallel_cross_entropy")


class TPModel(nn.Module):
    """The reference model (``workbook.model.ReferenceModel``) over n ranks, every parameter
    under its reference name (lesson 4, "Attention and the vocabulary").

    * Parts: this lab's vocab-parallel embedding and blocks, the replicated final norm, a
      column-parallel head without bias whose logits stay split by vocabulary, and this lab's
      vocab-parallel loss. Shapes that do not split raise the configuration's one-line
      ValueError (given).
    * Forward: token ids and target ids [B, S] and the step number in, the reference's scalar
      loss out, on every rank; gradients are this rank's pieces of the reference's.
    * Communication: all-reduces only, two of B*S*H numbers per block in each pass plus one at the
      embedding (forward) and one at the head (backward), and the loss's small ones."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size())
        device = device or ranks.device()
        self.cfg, self.name = cfg, ""
        raise NotImplementedError("not implemented yet: tp.TPModel.__init__")

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, step: int = 0) -> torch.Tensor:
        raise NotImplementedError("not implemented yet: tp.TPModel.forward")


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
