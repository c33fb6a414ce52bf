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
        ### BEGIN SOLUTION
        ### hint 1: the input fed every rank's slice of the layer; lesson 4, "The conjugate pair f
        ###     and g" says what its gradient is
        ### hint 2: each rank's gradient counts only the paths through its own slice: add them up
        ###     over all ranks and return the total
        ### hint 3: return all_reduce_sum(grad)   (the given sum over the tensor-parallel ranks)
        return all_reduce_sum(grad)
        ### END SOLUTION


class _ReduceFromTensorParallelRegion(torch.autograd.Function):
    """g, the operator that leaves a parallel region (lesson 4, "The conjugate pair f and g").

    Forward (yours): each rank holds a partial result of the same shape; return the full
    result, the same on every rank. Backward (given): the gradient passes through unchanged."""
    @staticmethod
    def forward(ctx, x):
        ### BEGIN SOLUTION
        ### hint 1: a row-split product leaves each rank one term of the output; lesson 4,
        ###     "Splitting a linear layer"
        ### hint 2: combine the ranks' terms into their total, on every rank, as a new tensor
        ### hint 3: return all_reduce_sum(x)
        return all_reduce_sum(x)
        ### END SOLUTION

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
    ### BEGIN SOLUTION
    ### hint 1: an operator is a pair of functions, one per pass; the given mappings module builds
    ###     an autograd op from such a pair
    ### hint 2: forward: cut out this rank's piece of the last dim; backward: join every rank's
    ###     piece of the gradient back along the last dim
    ### hint 3: conjugate_op(x, forward=split_last_dim, backward=gather_last_dim)
    return conjugate_op(x, forward=split_last_dim, backward=gather_last_dim)
    ### END SOLUTION


def gather_from_tensor_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """Leave a parallel region by joining the ranks' slices of the last dim: the mirror image of
    the scatter above (lesson 4, "The conjugate pair f and g").

    Forward: ``[..., k]`` on each rank to ``[..., n*k]`` on every rank, rank r's piece at
    features ``r*k : (r+1)*k``. Backward: this rank's piece of the gradient."""
    ### BEGIN SOLUTION
    ### hint 1: the scatter's two directions, swapped
    ### hint 2: forward joins every rank's piece along the last dim; backward keeps this rank's
    ###     piece of the gradient
    ### hint 3: conjugate_op(x, forward=gather_last_dim, backward=split_last_dim)
    return conjugate_op(x, forward=gather_last_dim, backward=split_last_dim)
    ### END SOLUTION


# --------------------------------------------------------------------------- 2. parallel linears
### BEGIN CHALLENGE: ColumnParallelLinear, RowParallelLinear and TPMLP: the tensor-parallel MLP, whole (lesson 4, "Splitting a linear layer")
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
        ### BEGIN SOLUTION
        ### hint 1: the given mappings module hands out this rank's piece of any reference
        ###     parameter, by its full name
        ### hint 2: make the weight from the parameter called "<name>.weight"; the bias the same
        ###     way if there is one, else leave it None
        ### hint 3: self.weight = local_param(cfg, f"{name}.weight", device); self.bias likewise
        ###     (or None)
        self.weight = local_param(cfg, f"{name}.weight", device)
        self.bias = local_param(cfg, f"{name}.bias", device) if bias else None
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        ### hint 1: a column layer sits at the entrance of a parallel region; lesson 4, "The
        ###     conjugate pair f and g"
        ### hint 2: enter the region (if this layer is asked to), apply the local slice of the
        ###     layer, join the slices (if asked to)
        ### hint 3: f if copy_input; model_ops.linear(x, self.weight, self.bias);
        ###     gather_from_tensor_parallel_region if gather_output
        if self.copy_input:
            x = copy_to_tensor_parallel_region(x)
        y = model_ops.linear(x, self.weight, self.bias)                  # [..., out/n]
        return gather_from_tensor_parallel_region(y) if self.gather_output else y
        ### END SOLUTION


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
        ### BEGIN SOLUTION
        ### hint 1: as the column layer's parameters; the given helper knows each parameter's split
        ### hint 2: the weight from "<name>.weight" (this rank's columns), the bias from
        ###     "<name>.bias" (whole) if there is one
        ### hint 3: self.weight = local_param(cfg, f"{name}.weight", device); self.bias =
        ###     local_param(...) if bias else None
        self.weight = local_param(cfg, f"{name}.weight", device)
        self.bias = local_param(cfg, f"{name}.bias", device) if bias else None
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        ### hint 1: a row layer ends a parallel region with a sum over ranks; lesson 4, "Splitting
        ###     a linear layer", and mind the bias rule
        ### hint 2: take this rank's slice of a full input (only when asked to), multiply by the
        ###     local weight without the bias, leave the region, then add the bias once
        ### hint 3: scatter unless input_is_parallel; g(model_ops.linear(x, self.weight)); +
        ###     self.bias after g
        if not self.input_is_parallel:
            x = scatter_to_tensor_parallel_region(x)
        y = reduce_from_tensor_parallel_region(model_ops.linear(x, self.weight))    # [..., out]
        return y + self.bias if self.bias is not None else y
        ### END SOLUTION


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
        ### BEGIN SOLUTION
        ### hint 1: the MLP's first matrices are column-parallel, its last row-parallel; lesson 4,
        ###     "Splitting a linear layer"
        ### hint 2: per style, one submodule per reference matrix, with the reference's name; the
        ###     first ones must not enter the region themselves (the MLP enters once)
        ### hint 3: gpt: fc1 = ColumnParallelLinear(..., copy_input=False), fc2 =
        ###     RowParallelLinear; llama: w_gate, w_up (column), w_down (row)
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
        ### BEGIN SOLUTION
        ### hint 1: the reference MLP's formula, on each rank's slice of the hidden features
        ### hint 2: enter the region once, then compute exactly as the reference does; the last
        ###     matrix leaves the region
        ### hint 3: x = copy_to_tensor_parallel_region(x); gpt:
        ###     self.fc2(model_ops.gelu(self.fc1(x))); llama: w_down(silu(w_gate x) * w_up x)
        x = copy_to_tensor_parallel_region(x)                         # f: [B, S, H] replicated
        if self.cfg.style == "gpt":
            return self.fc2(model_ops.gelu(self.fc1(x)))                    # [B,S,F/n] -> g -> [B,S,H]
        return self.w_down(model_ops.silu(self.w_gate(x)) * self.w_up(x))
        ### END SOLUTION
### END CHALLENGE


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
        ### BEGIN SOLUTION
        ### hint 1: queries, keys and values are column-parallel (whole heads per rank), the output
        ###     projection row-parallel
        ### hint 2: four submodules named as the reference's; the three column ones must not enter
        ###     the region themselves
        ### hint 3: wq, wk, wv = ColumnParallelLinear(cfg, f"{self.name}.wq", H, H,
        ###     copy_input=False, ...); wo = RowParallelLinear
        for w in ("wq", "wk", "wv"):
            setattr(self, w, ColumnParallelLinear(cfg, f"{self.name}.{w}", H, H, copy_input=False,
                                                  device=device))
        self.wo = RowParallelLinear(cfg, f"{self.name}.wo", H, H, device=device)
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        ### hint 1: attention runs on each rank's own heads with no communication; lesson 4,
        ###     "Attention and the vocabulary"
        ### hint 2: enter the region once, project to this rank's queries, keys and values, run the
        ###     reference's causal attention on the local heads (with the RoPE tables of the
        ###     input), project out
        ### hint 3: x = f(x); ctx = model_ops.causal_attention(self.wq(x), self.wk(x), self.wv(x),
        ###     self.local_heads, rope_tables(self.cfg, x)); return self.wo(ctx)
        x = copy_to_tensor_parallel_region(x)
        ctx = model_ops.causal_attention(self.wq(x), self.wk(x), self.wv(x), self.local_heads,
                                         rope_tables(self.cfg, x))
        return self.wo(ctx)                                           # [B,S,H/n] -> g -> [B,S,H]
        ### END SOLUTION


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
        ### BEGIN SOLUTION
        ### hint 1: the block holds this lab's two parallel sublayers; the reference block names
        ###     them
        ### hint 2: build the attention and the MLP of this layer, on this device, under the
        ###     reference's names
        ### hint 3: self.attn = TPAttention(cfg, layer, device); self.mlp = TPMLP(cfg, layer,
        ###     device)
        self.attn = TPAttention(cfg, layer, device)
        self.mlp = TPMLP(cfg, layer, device)
        ### END SOLUTION

    def dropout(self, x: torch.Tensor, site: str, step: int) -> torch.Tensor:
        """The reference's dropout: the same mask on every rank (the activation is replicated)."""
        if not self.training or self.cfg.dropout == 0.0:
            return x
        return x * dropout_mask(self.cfg, f"{self.name}.{site}.dropout", x.shape, step, x.device)

    def forward(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
        ### BEGIN SOLUTION
        ### hint 1: the reference block's forward, unchanged: the parallel regions are inside the
        ###     sublayers
        ### hint 2: two residual steps, each: normalise, run the sublayer, drop out (the given
        ###     method, with its site and the step), add to the stream
        ### hint 3: x = x + self.dropout(self.attn(self.norm1(x)), "attn", step); the same with
        ###     norm2, mlp, "mlp"
        x = x + self.dropout(self.attn(self.norm1(x)), "attn", step)
        x = x + self.dropout(self.mlp(self.norm2(x)), "mlp", step)
        return x
        ### END SOLUTION


# --------------------------------------------------------------------------- 4. vocab-parallel model
### BEGIN CHALLENGE: VocabParallelEmbedding and vocab_parallel_cross_entropy: the vocabulary split over ranks (lesson 4, "Attention and the vocabulary")
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
        ### BEGIN SOLUTION
        ### hint 1: each rank can only look up the tokens it holds; lesson 4, "Attention and the
        ###     vocabulary"
        ### hint 2: find which tokens fall in this rank's id range, look them up by their local row
        ###     (any valid row for the others), zero the others, sum over the ranks, then add the
        ###     positions (gpt)
        ### hint 3: mine = (tokens >= start) & (tokens < stop); local ids = (tokens -
        ###     start).clamp(0, stop - start - 1); h = weight[ids] * mine; g(h); + pos.weight[:S]
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
    ### BEGIN SOLUTION
    ### hint 1: the loss is a log-sum-exp minus the target's logit, each assembled from per-rank
    ###     pieces; lesson 4, "Attention and the vocabulary"
    ### hint 2: the maximum over the whole vocabulary (kept out of autograd: the loss does not
    ###     depend on it) shifts the logits; sum the exponentials over ranks; pick the target's
    ###     shifted logit on the rank that holds it (zero elsewhere) and sum over ranks; average
    ###     log-sum minus target logit
    ### hint 3: m = local_logits.detach().amax(-1, keepdim=True), dist.all_reduce(m, op=MAX);
    ###     g(shifted.exp().sum(-1)); g(gathered target logit * is_mine); (sum_exp.log() -
    ###     picked).mean()
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
### END CHALLENGE


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
        ### BEGIN SOLUTION
        ### hint 1: the same parts as the reference model, each replaced by its parallel version
        ###     from this lab
        ### hint 2: the embedding, one block per layer in a module list, the given final norm (on
        ###     this device), and a head layer split by vocabulary that keeps its logits split and
        ###     has no bias
        ### hint 3: embed = VocabParallelEmbedding; blocks = nn.ModuleList(TPBlock(cfg, i, device)
        ###     ...); norm_f = make_norm(cfg, "norm_f").to(device); head =
        ###     ColumnParallelLinear(cfg, "head", H, V, bias=False)
        self.embed = VocabParallelEmbedding(cfg, device)
        self.blocks = nn.ModuleList(TPBlock(cfg, i, device) for i in range(cfg.n_layers))
        self.norm_f = make_norm(cfg, "norm_f").to(device)
        self.head = ColumnParallelLinear(cfg, "head", cfg.hidden, cfg.vocab_size, bias=False,
                                         device=device)
        ### END SOLUTION

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, step: int = 0) -> torch.Tensor:
        ### BEGIN SOLUTION
        ### hint 1: the reference model's forward, with this lab's loss on the split logits
        ### hint 2: embed, run every block (passing the step), normalise, project to this rank's
        ###     logits, return the vocab-parallel loss
        ### hint 3: h = self.embed(tokens); for block in self.blocks: h = block(h, step);
        ###     vocab_parallel_cross_entropy(self.head(self.norm_f(h)), targets, V)
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h, step)
        local_logits = self.head(self.norm_f(h))                             # [B, S, V/n]
        return vocab_parallel_cross_entropy(local_logits, targets, self.cfg.vocab_size)
        ### END SOLUTION


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
