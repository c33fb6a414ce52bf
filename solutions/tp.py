"""Lab 4 — tensor parallelism (Megatron-LM): split every matrix of a block over n ranks.

Megatron-LM (Shoeybi et al. 2019, arXiv 1909.08053, sec. 3 and Fig. 3) cuts a transformer
block so that each half of it costs one all-reduce forward and one backward:

* the first matrices of a half (``wq wk wv`` of attention, ``fc1`` / ``w_gate w_up`` of the
  MLP) are **column-parallel**: rank r keeps output features ``r*out/n : (r+1)*out/n``, so it
  computes its slice of the output from the *whole* input. For q/k/v those features are whole
  heads, so attention itself runs on ``heads/n`` heads per rank with no communication;
* the last matrix (``wo``, ``fc2`` / ``w_down``) is **row-parallel**: rank r keeps input
  features ``r*in/n : (r+1)*in/n`` -- exactly the slice the column-parallel layer left it --
  and produces a *partial sum* of the output. One all-reduce adds the n partial sums.

Two autograd functions carry that communication, and they are each other's conjugate (the
forward of one is the backward of the other):

====================================  ================  =================
operator                              forward           backward
====================================  ================  =================
f  ``copy_to_tensor_parallel_region``  identity          all-reduce (sum)
g  ``reduce_from_tensor_parallel_region`` all-reduce (sum) identity
====================================  ================  =================

Why f all-reduces in backward: the input x of a half is replicated, and every rank uses it
for *its* slice of the column-parallel output, so each rank's dL/dx is only the part that
flows through its own slice. The true gradient is the sum over ranks. Why g is the identity
in backward: its output is replicated and every rank holds the same dL/dy, which is the
gradient of each partial sum as well.

Per block (batch B, sequence S, hidden H): 2 all-reduces of B*S*H elements forward (g after
attention, g after the MLP) and 2 backward (f before each half), nothing else.

The vocabulary is split the same way: the embedding table and the LM head keep V/n rows each
(vocab-parallel), and the cross-entropy is computed from the local logits with three small
all-reduces of B*S numbers (max, sum of exponentials, target logit), so no rank ever holds
the full ``[B, S, V]`` logits.

Everything is built from the reference model's weights (``workbook.model``): rank r's piece
of ``blocks.0.attn.wq.weight`` is ``local_weight(cfg, name, r, n)``, so outputs and every
gradient can be compared with the single-device model.

Run it: ``workbook run tp`` (the grader's checks, then collectives and activation memory per
rank), ``python labs/tp.py --nproc 4`` or ``torchrun --nproc_per_node=4 labs/tp.py``
(``--trace-dir traces/tp`` adds a trace).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from workbook.model import ModelConfig, dropout_mask, local_weight
from workbook.model import ops as model_ops    # (not "ops": cloudpickle would mistake it for torch.ops)
from workbook.model.reference import make_norm


# --------------------------------------------------------------------------- helpers (given)
def tp_rank() -> int:
    """This rank's index in the tensor-parallel group (here: the whole world)."""
    return dist.get_rank() if dist.is_initialized() else 0


def tp_world_size() -> int:
    """Number of tensor-parallel ranks n."""
    return dist.get_world_size() if dist.is_initialized() else 1


def rank_device() -> torch.device:
    """``cuda:LOCAL_RANK`` on NCCL, else ``cpu`` (from the launcher)."""
    try:
        from workbook import launch
        return launch.device()
    except RuntimeError:                       # outside a launched rank (a plain script)
        return torch.device("cpu")


def split_last_dim(x: torch.Tensor) -> torch.Tensor:
    """This rank's contiguous 1/n piece of ``x`` along its last dim (no communication)."""
    n = tp_world_size()
    if x.shape[-1] % n:
        raise ValueError(f"cannot split a last dim of {x.shape[-1]} over {n} ranks")
    return x.chunk(n, dim=-1)[tp_rank()].contiguous()


def gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Every rank's ``x`` joined along the last dim, in rank order: ``[..., k] -> [..., n*k]``.

    Use ``dist.all_gather_into_tensor``: it concatenates the ranks' tensors along dim 0 (gloo
    wants the output shaped ``[n * x.shape[0], ...]``), so view the result as ``[n, *x.shape]``
    and move the rank dim next to the last one."""
    n = tp_world_size()
    if n == 1:
        return x
    ### BEGIN SOLUTION hint: gather into an [n*d0, d1, ...] buffer, view it [n, *x.shape], movedim
    x = x.contiguous()
    joined = torch.empty((n * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(joined, x)                                   # rank r at rows r*d0:
    stacked = joined.view(n, *x.shape)                                       # [n, ..., k]
    return stacked.movedim(0, -2).reshape(*x.shape[:-1], n * x.shape[-1])   # [..., n*k]
    ### END SOLUTION


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over the ranks, as a new tensor (``x`` itself is not changed)."""
    out = x.clone(memory_format=torch.contiguous_format)
    if tp_world_size() > 1:
        dist.all_reduce(out)
    return out


# --------------------------------------------------------------------------- 1. the conjugate ops
class _CopyToTensorParallelRegion(torch.autograd.Function):
    """f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        ### BEGIN SOLUTION hint: the input is already on every rank
        return x.view_as(x)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION hint: each rank holds only its slice's share of dL/dx
        return all_reduce_sum(grad)
        ### END SOLUTION


class _ReduceFromTensorParallelRegion(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        ### BEGIN SOLUTION hint: add the partial sums of every rank
        return all_reduce_sum(x)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION hint: the output is replicated, so is its gradient
        return grad
        ### END SOLUTION


class _ScatterToTensorParallelRegion(torch.autograd.Function):
    """Keep this rank's slice of the last dim; backward gathers the slices' gradients."""

    @staticmethod
    def forward(ctx, x):
        ### BEGIN SOLUTION
        return split_last_dim(x)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        return gather_last_dim(grad)
        ### END SOLUTION


class _GatherFromTensorParallelRegion(torch.autograd.Function):
    """Join every rank's slice along the last dim; backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x):
        ### BEGIN SOLUTION
        return gather_last_dim(x)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        return split_last_dim(grad)
        ### END SOLUTION


def copy_to_tensor_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """f (enter a parallel region): forward identity, backward all-reduce."""
    return _CopyToTensorParallelRegion.apply(x)


def reduce_from_tensor_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """g (leave a parallel region): forward all-reduce, backward identity."""
    return _ReduceFromTensorParallelRegion.apply(x)


def scatter_to_tensor_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """Split the last dim (forward); all-gather the gradient (backward)."""
    return _ScatterToTensorParallelRegion.apply(x)


def gather_from_tensor_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """All-gather along the last dim (forward); keep this rank's slice of the gradient."""
    return _GatherFromTensorParallelRegion.apply(x)


# --------------------------------------------------------------------------- 2. parallel linears
def _param(cfg: ModelConfig, name: str, device) -> nn.Parameter:
    """Rank's piece of reference parameter ``name`` (sliced by its shard spec)."""
    return nn.Parameter(local_weight(cfg, name, tp_rank(), tp_world_size(), device))


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W ``[out, in]`` split by rows: rank r computes output features
    ``r*out/n : (r+1)*out/n`` of the whole input.

    ``name`` is the reference's name (``blocks.0.mlp.fc1``); the weight and bias are
    ``local_weight(cfg, name + ".weight", ...)`` etc. ``bias`` defaults to the style's (gpt:
    yes, llama: no). ``copy_input``: apply f to the input (set False when several column
    layers read the same input and the caller applied f once, as q, k and v do, so that
    backward all-reduces their summed gradient once). ``gather_output``: all-gather the
    output slices into the full ``[..., out]`` (otherwise each rank returns its slice)."""

    def __init__(self, cfg: ModelConfig, name: str, in_features: int, out_features: int, *,
                 bias: bool | None = None, gather_output: bool = False, copy_input: bool = True,
                 device=None):
        super().__init__()
        self.name, self.gather_output, self.copy_input = name, gather_output, copy_input
        n = tp_world_size()
        if out_features % n:
            raise ValueError(f"{name}: out_features={out_features} is not divisible by tp={n}")
        device = device or rank_device()
        bias = cfg.style == "gpt" if bias is None else bias
        ### BEGIN SOLUTION hint: self.weight [out/n, in] and self.bias [out/n] (or None) from _param
        self.weight = _param(cfg, f"{name}.weight", device)
        self.bias = _param(cfg, f"{name}.bias", device) if bias else None
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION hint: f (if copy_input), the local linear, gather (if gather_output)
        if self.copy_input:
            x = copy_to_tensor_parallel_region(x)
        y = model_ops.linear(x, self.weight, self.bias)                  # [..., out/n]
        return gather_from_tensor_parallel_region(y) if self.gather_output else y
        ### END SOLUTION


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W ``[out, in]`` split by columns: rank r multiplies input features
    ``r*in/n : (r+1)*in/n`` and the partial products are summed by g.

    ``input_is_parallel``: the input is already this rank's slice (the output of a column
    layer); otherwise it is the full input and is scattered first. The bias is replicated
    and must be added once, after the reduction (added before it, it would count n times)."""

    def __init__(self, cfg: ModelConfig, name: str, in_features: int, out_features: int, *,
                 bias: bool | None = None, input_is_parallel: bool = True, device=None):
        super().__init__()
        self.name, self.input_is_parallel = name, input_is_parallel
        n = tp_world_size()
        if in_features % n:
            raise ValueError(f"{name}: in_features={in_features} is not divisible by tp={n}")
        device = device or rank_device()
        bias = cfg.style == "gpt" if bias is None else bias
        ### BEGIN SOLUTION hint: self.weight [out, in/n]; self.bias [out], the full (replicated) bias
        self.weight = _param(cfg, f"{name}.weight", device)
        self.bias = _param(cfg, f"{name}.bias", device) if bias else None
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION hint: scatter (unless input_is_parallel), local matmul, g, then the bias
        if not self.input_is_parallel:
            x = scatter_to_tensor_parallel_region(x)
        y = reduce_from_tensor_parallel_region(model_ops.linear(x, self.weight))    # [..., out]
        return y + self.bias if self.bias is not None else y
        ### END SOLUTION


# --------------------------------------------------------------------------- 3. MLP and attention
class TPMLP(nn.Module):
    """The MLP of ``blocks.{layer}`` over n ranks: column layers, the elementwise middle on
    F/n features, the row layer. gpt: fc1 -> gelu -> fc2; llama: w_down(silu(w_gate x) * w_up x).
    One f at the input (shared by w_gate and w_up), one g at the output."""

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
        ### BEGIN SOLUTION
        x = copy_to_tensor_parallel_region(x)                         # f: [B, S, H] replicated
        if self.cfg.style == "gpt":
            return self.fc2(model_ops.gelu(self.fc1(x)))                    # [B,S,F/n] -> g -> [B,S,H]
        return self.w_down(model_ops.silu(self.w_gate(x)) * self.w_up(x))
        ### END SOLUTION


class TPAttention(nn.Module):
    """Causal self-attention of ``blocks.{layer}`` with heads/n heads per rank: wq, wk, wv
    column-parallel (one f for the three), attention on the local heads (``model_ops.causal_attention``,
    with RoPE for llama), wo row-parallel."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size())
        self.cfg, self.name = cfg, f"blocks.{layer}.attn"
        H = cfg.hidden
        self.local_heads = cfg.heads // tp_world_size()
        ### BEGIN SOLUTION hint: wq, wk, wv (ColumnParallelLinear, copy_input=False), wo (row)
        for w in ("wq", "wk", "wv"):
            setattr(self, w, ColumnParallelLinear(cfg, f"{self.name}.{w}", H, H, copy_input=False,
                                                  device=device))
        self.wo = RowParallelLinear(cfg, f"{self.name}.wo", H, H, device=device)
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        rope = None
        if cfg.style == "llama":
            positions = torch.arange(x.shape[1], device=x.device)
            rope = model_ops.rope_cos_sin(positions, cfg.head_dim, cfg.rope_base, x.dtype)
        ### BEGIN SOLUTION hint: f once, q k v on the local heads, model_ops.causal_attention, wo
        x = copy_to_tensor_parallel_region(x)
        ctx = model_ops.causal_attention(self.wq(x), self.wk(x), self.wv(x), self.local_heads, rope)
        return self.wo(ctx)                                           # [B,S,H/n] -> g -> [B,S,H]
        ### END SOLUTION


# --------------------------------------------------------------------------- 4. block and model
class TPBlock(nn.Module):
    """Pre-norm block ``blocks.{layer}``: the norms (replicated: every rank normalises the
    whole activation with the full gain), TPAttention, TPMLP and dropout with the reference's
    masks (``dropout_mask`` of the full ``[B, S, H]`` shape, site ``blocks.{layer}.attn.dropout``
    / ``.mlp.dropout``): every rank applies the same mask to the same replicated activation."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size())
        device = device or rank_device()
        self.cfg, self.layer, self.name = cfg, layer, f"blocks.{layer}"
        self.norm1 = make_norm(cfg, f"{self.name}.norm1").to(device)
        self.norm2 = make_norm(cfg, f"{self.name}.norm2").to(device)
        ### BEGIN SOLUTION
        self.attn = TPAttention(cfg, layer, device)
        self.mlp = TPMLP(cfg, layer, device)
        ### END SOLUTION

    def dropout(self, x: torch.Tensor, site: str, step: int) -> torch.Tensor:
        if not self.training or self.cfg.dropout == 0.0:
            return x
        ### BEGIN SOLUTION hint: multiply by the reference's mask for this site and step
        return x * dropout_mask(self.cfg, f"{self.name}.{site}.dropout", x.shape, step, x.device)
        ### END SOLUTION

    def forward(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
        ### BEGIN SOLUTION
        x = x + self.dropout(self.attn(self.norm1(x)), "attn", step)
        x = x + self.dropout(self.mlp(self.norm2(x)), "mlp", step)
        return x
        ### END SOLUTION


def vocab_range(vocab_size: int) -> tuple[int, int]:
    """``(start, stop)`` of the token ids this rank's vocab-parallel rows hold."""
    piece = vocab_size // tp_world_size()
    return tp_rank() * piece, (tp_rank() + 1) * piece


class VocabParallelEmbedding(nn.Module):
    """``embed``: token table ``tok.weight`` split by vocab rows (V/n per rank), plus the
    replicated learned positions ``pos.weight`` (gpt). A rank looks up the tokens it holds,
    writes zeros for the others, and g adds the n partial embeddings."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size())
        device = device or rank_device()
        self.cfg, self.name = cfg, "embed"
        self.tok = nn.Module()
        self.tok.weight = _param(cfg, "embed.tok.weight", device)             # [V/n, H]
        if cfg.style == "gpt":
            self.pos = nn.Module()
            self.pos.weight = _param(cfg, "embed.pos.weight", device)         # [S, H], replicated

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
    """Mean next-token loss from this rank's logits ``[B, S, V/n]`` (vocab rows
    ``vocab_range(V)``), without building the full logits.

    loss = mean over tokens of log(sum_v exp(z_v - m)) - (z_target - m), with m the max over
    the whole vocabulary: one all-reduce (MAX) for m, one (sum) for the sum of exponentials,
    one (sum) for the target's logit, which only one rank holds. Make the two sums with g
    (``reduce_from_tensor_parallel_region``) and autograd gets the gradient right: the loss is
    replicated, so g's identity backward gives each rank the gradient of its own logits."""
    start, stop = vocab_range(vocab_size)
    ### BEGIN SOLUTION hint: m needs no gradient (the loss does not depend on it); mask the target
    m = local_logits.detach().amax(dim=-1, keepdim=True)                      # [B, S, 1]
    if tp_world_size() > 1:
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
    shifted = local_logits - m
    sum_exp = reduce_from_tensor_parallel_region(shifted.exp().sum(dim=-1))   # [B, S]
    mine = (targets >= start) & (targets < stop)
    local_t = (targets - start).clamp(0, stop - start - 1)
    picked = shifted.gather(-1, local_t.unsqueeze(-1)).squeeze(-1) * mine.to(shifted.dtype)
    target_logit = reduce_from_tensor_parallel_region(picked)                 # [B, S]
    return (sum_exp.log() - target_logit).mean()
    ### END SOLUTION


class TPModel(nn.Module):
    """The reference model over n ranks: vocab-parallel embedding, TP blocks, replicated final
    norm, vocab-parallel head (a column-parallel linear without bias, output not gathered) and
    the vocab-parallel cross-entropy. Parameter names match ``ReferenceModel``'s, so
    ``grads_by_name(model)`` gives each rank's pieces under the reference names."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size())
        device = device or rank_device()
        self.cfg, self.name = cfg, ""
        ### BEGIN SOLUTION hint: embed, blocks (nn.ModuleList), norm_f (make_norm), head
        self.embed = VocabParallelEmbedding(cfg, device)
        self.blocks = nn.ModuleList(TPBlock(cfg, i, device) for i in range(cfg.n_layers))
        self.norm_f = make_norm(cfg, "norm_f").to(device)
        self.head = ColumnParallelLinear(cfg, "head", cfg.hidden, cfg.vocab_size, bias=False,
                                         device=device)
        ### END SOLUTION

    def local_logits(self, tokens: torch.Tensor, step: int = 0) -> torch.Tensor:
        """This rank's ``[B, S, V/n]`` logits."""
        ### BEGIN SOLUTION
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h, step)
        return self.head(self.norm_f(h))
        ### END SOLUTION

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, step: int = 0) -> torch.Tensor:
        return vocab_parallel_cross_entropy(self.local_logits(tokens, step), targets,
                                            self.cfg.vocab_size)


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
