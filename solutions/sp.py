"""Lab 5 — sequence parallelism: tensor parallelism whose replicated parts are cut along the sequence.

In vanilla tensor parallelism (lab 4) everything *between* the parallel regions -- the two
LayerNorms, the two dropouts, the residual adds -- runs on the full ``[B, S, H]`` activation,
identically on every rank: n copies of the same work and the same stored activations.
Korthikanti et al. (2022, "Reducing Activation Recomputation in Large Transformer Models",
arXiv 2205.05198, sec. 4.2.2) noticed that these operations are independent per position, so
rank r can do them on its own S/n positions only. The all-reduce at the end of a parallel region
then becomes a **reduce-scatter** along the sequence (sum the partial outputs, but each rank
keeps only its S/n positions), and the identity at the start becomes an **all-gather** along the
sequence (every rank needs every position for the column-parallel matmuls and attention):

=============================================  ======================  ======================
operator                                       forward                 backward
=============================================  ======================  ======================
``gather_from_sequence_parallel_region``       all-gather (sequence)   reduce-scatter
``reduce_scatter_to_sequence_parallel_region`` reduce-scatter          all-gather
=============================================  ======================  ======================

They are conjugate, like f and g: the all-gathered input feeds each rank's column slice, so
each rank's gradient of it is a partial sum that must be added over the ranks, and each rank
only needs its own positions of that sum -- a reduce-scatter. The reduce-scattered output
holds S/n positions; the full-sequence gradient every rank's matmul needs is the all-gather of
the n shards' gradients.

Same bytes: with the nccl-tests convention (an all-reduce of S bytes moves 2(n-1)/n * S per
rank; an all-gather or a reduce-scatter of the full S-byte buffer moves (n-1)/n * S), one
all-reduce costs exactly one reduce-scatter plus one all-gather. Per block sequence
parallelism makes 2 all-gathers + 2 reduce-scatters forward and the same backward, in place
of 2 + 2 all-reduces: the same traffic, split differently.

Less memory: what the norms, dropouts and residuals save for backward shrinks by n. Megatron
goes further (the column layer keeps only its input shard and all-gathers it again in backward);
here the gathered input is kept, so the traffic stays exactly that of lab 4.

Two new duties:

* **dropout** on a shard must reproduce the reference: draw the full ``[B, S, H]`` mask of the
  site and step (``workbook.model.dropout_mask``) and use positions ``s0:s1``, so every shard
  gets a different part of the one mask;
* **gradients of the replicated parameters computed on shards** (the norms' gains and biases,
  the row-parallel biases, the learned positions) are *partial*: rank r only saw positions
  ``s0:s1``, and the true gradient is the sum over all positions. They must be all-reduced over
  the tensor-parallel ranks after backward (``sync_sequence_parallel_grads``), else the ranks'
  copies of these parameters drift apart at the first optimizer step. In vanilla TP they needed
  no sync: every rank saw every position.

Activations here are ``[B, S, H]``, so the sequence is dim 1 and a shard is ``x[:, s0:s1]``.
``all_gather_into_tensor`` and ``reduce_scatter_tensor`` work on dim 0, which is why
Megatron-LM keeps activations ``[S, B, H]``; this lab transposes around each collective instead.

Run it: ``workbook run sp`` (the grader's checks, then collectives and activation memory against
lab 4), ``python labs/sp.py --nproc 4`` or ``torchrun --nproc_per_node=4 labs/sp.py``
(``--trace-dir traces/sp`` adds a trace).
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
    return dist.get_rank() if dist.is_initialized() else 0


def tp_world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank_device() -> torch.device:
    """``cuda:LOCAL_RANK`` on NCCL, else ``cpu`` (from the launcher)."""
    try:
        from workbook import launch
        return launch.device()
    except RuntimeError:
        return torch.device("cpu")


def sequence_range(seq_len: int) -> tuple[int, int]:
    """``(s0, s1)``: the positions this rank holds between the parallel regions."""
    n = tp_world_size()
    if seq_len % n:
        raise ValueError(f"sequence length {seq_len} is not divisible by tp={n}")
    piece = seq_len // n
    return tp_rank() * piece, (tp_rank() + 1) * piece


def split_sequence(x: torch.Tensor) -> torch.Tensor:
    """This rank's positions of a full ``[B, S, ...]`` tensor: ``x[:, s0:s1]`` (a copy)."""
    s0, s1 = sequence_range(x.shape[1])
    return x[:, s0:s1].contiguous()


def mark_sequence_parallel(param: nn.Parameter) -> nn.Parameter:
    """Tag a replicated parameter whose gradient is computed from a sequence shard."""
    param.sequence_parallel = True
    return param


def reduce_from_tensor_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """g of lab 4 (all-reduce forward, identity backward), for the vocab-parallel loss."""
    return _AllReduceIdentityBackward.apply(x)


class _AllReduceIdentityBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.clone(memory_format=torch.contiguous_format)
        if tp_world_size() > 1:
            dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


# --------------------------------------------------------------------------- 1. sequence collectives
def all_gather_sequence(x: torch.Tensor) -> torch.Tensor:
    """``[B, S/n, ...] -> [B, S, ...]``: every rank's positions, in rank order.

    One ``dist.all_gather_into_tensor``; it concatenates along dim 0, so gather the tensor with
    the sequence moved to the front (``x.transpose(0, 1).contiguous()``) and move it back.
    Return a contiguous tensor: q, k and v each flatten their input for the matmul, and a
    transposed view would make each of them save its own copy (the memory test sees it)."""
    n = tp_world_size()
    if n == 1:
        return x
    ### BEGIN SOLUTION hint: gather [S/n, B, ...] pieces into an [S, B, ...] buffer
    xt = x.transpose(0, 1).contiguous()                                       # [S/n, B, H]
    full = torch.empty((n * xt.shape[0], *xt.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(full, xt)                                     # [S, B, H]
    return full.transpose(0, 1).contiguous()                                  # [B, S, H]
    ### END SOLUTION


def reduce_scatter_sequence(x: torch.Tensor) -> torch.Tensor:
    """``[B, S, ...] -> [B, S/n, ...]``: the sum over ranks, this rank's positions only.

    One ``dist.reduce_scatter_tensor`` on the sequence-first layout."""
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


class _GatherFromSequenceParallelRegion(torch.autograd.Function):
    """All-gather along the sequence forward; reduce-scatter of the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        ### BEGIN SOLUTION
        return all_gather_sequence(x)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION hint: each rank's gradient is a partial sum over its column slice
        return reduce_scatter_sequence(grad)
        ### END SOLUTION


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Reduce-scatter along the sequence forward; all-gather of the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        ### BEGIN SOLUTION
        return reduce_scatter_sequence(x)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        return all_gather_sequence(grad)
        ### END SOLUTION


def gather_from_sequence_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """Enter a parallel region from sequence shards: all-gather forward, reduce-scatter backward."""
    return _GatherFromSequenceParallelRegion.apply(x)


def reduce_scatter_to_sequence_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """Leave a parallel region to sequence shards: reduce-scatter forward, all-gather backward."""
    return _ReduceScatterToSequenceParallelRegion.apply(x)


# --------------------------------------------------------------------------- 2. the linears
def _param(cfg: ModelConfig, name: str, device) -> nn.Parameter:
    return nn.Parameter(local_weight(cfg, name, tp_rank(), tp_world_size(), device))


class SPColumnParallelLinear(nn.Module):
    """Column-parallel linear (``weight [out/n, in]``) whose input arrives as sequence shards
    ``[B, S/n, in]``: all-gathered to ``[B, S, in]`` (unless ``gather_input=False``: the caller
    gathered once for several layers, as for q, k, v), output ``[B, S, out/n]``."""

    def __init__(self, cfg: ModelConfig, name: str, in_features: int, out_features: int, *,
                 bias: bool | None = None, gather_input: bool = True, device=None):
        super().__init__()
        self.name, self.gather_input = name, gather_input
        device = device or rank_device()
        bias = cfg.style == "gpt" if bias is None else bias
        self.weight = _param(cfg, f"{name}.weight", device)
        self.bias = _param(cfg, f"{name}.bias", device) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        if self.gather_input:
            x = gather_from_sequence_parallel_region(x)
        return model_ops.linear(x, self.weight, self.bias)
        ### END SOLUTION


class SPRowParallelLinear(nn.Module):
    """Row-parallel linear (``weight [out, in/n]``): input ``[B, S, in/n]``, the partial products
    reduce-scattered to ``[B, S/n, out]``, then the replicated bias -- added on the shard, so its
    gradient is partial (mark it with ``mark_sequence_parallel``)."""

    def __init__(self, cfg: ModelConfig, name: str, in_features: int, out_features: int, *,
                 bias: bool | None = None, device=None):
        super().__init__()
        self.name = name
        device = device or rank_device()
        bias = cfg.style == "gpt" if bias is None else bias
        self.weight = _param(cfg, f"{name}.weight", device)
        ### BEGIN SOLUTION hint: the full bias, tagged
        self.bias = mark_sequence_parallel(_param(cfg, f"{name}.bias", device)) if bias else None
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
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
        self.local_heads = cfg.heads // tp_world_size()
        H = cfg.hidden
        for w in ("wq", "wk", "wv"):
            setattr(self, w, SPColumnParallelLinear(cfg, f"{self.name}.{w}", H, H,
                                                    gather_input=False, device=device))
        self.wo = SPRowParallelLinear(cfg, f"{self.name}.wo", H, H, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION hint: gather once, q k v, model_ops.causal_attention (RoPE on full positions), wo
        x = gather_from_sequence_parallel_region(x)                          # [B, S, H]
        rope = None
        if self.cfg.style == "llama":
            positions = torch.arange(x.shape[1], device=x.device)
            rope = model_ops.rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_base, x.dtype)
        ctx = model_ops.causal_attention(self.wq(x), self.wk(x), self.wv(x), self.local_heads, rope)
        return self.wo(ctx)                                                   # [B, S/n, H]
        ### END SOLUTION


class SPMLP(nn.Module):
    """``blocks.{layer}.mlp`` from sequence shards to sequence shards (one all-gather, one
    reduce-scatter)."""

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
        ### BEGIN SOLUTION
        x = gather_from_sequence_parallel_region(x)
        if self.cfg.style == "gpt":
            return self.fc2(model_ops.gelu(self.fc1(x)))
        return self.w_down(model_ops.silu(self.w_gate(x)) * self.w_up(x))
        ### END SOLUTION


def sp_norm(cfg: ModelConfig, name: str, device) -> nn.Module:
    """The reference norm ``name`` (full gain, and bias for gpt), its parameters tagged
    sequence-parallel: it runs on this rank's positions only."""
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
        device = device or rank_device()
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
        ### BEGIN SOLUTION
        x = x + self.dropout(self.attn(self.norm1(x)), "attn", step)
        x = x + self.dropout(self.mlp(self.norm2(x)), "mlp", step)
        return x
        ### END SOLUTION


# --------------------------------------------------------------------------- 4. the model
def vocab_range(vocab_size: int) -> tuple[int, int]:
    piece = vocab_size // tp_world_size()
    return tp_rank() * piece, (tp_rank() + 1) * piece


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, targets: torch.Tensor,
                                 vocab_size: int) -> torch.Tensor:
    """As in lab 4 (given): the mean loss from ``[B, S, V/n]`` logits, three small all-reduces."""
    start, stop = vocab_range(vocab_size)
    m = local_logits.detach().amax(dim=-1, keepdim=True)
    if tp_world_size() > 1:
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
    shifted = local_logits - m
    sum_exp = reduce_from_tensor_parallel_region(shifted.exp().sum(dim=-1))
    mine = (targets >= start) & (targets < stop)
    local_t = (targets - start).clamp(0, stop - start - 1)
    picked = shifted.gather(-1, local_t.unsqueeze(-1)).squeeze(-1) * mine.to(shifted.dtype)
    return (sum_exp.log() - reduce_from_tensor_parallel_region(picked)).mean()


class SPEmbedding(nn.Module):
    """``embed`` ending in sequence shards: the vocab-parallel lookup gives every rank a partial
    ``[B, S, H]`` (its vocab rows only), which a reduce-scatter sums *and* shards in one go;
    then the positions ``pos.weight[s0:s1]`` are added (gpt; their gradient is partial)."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        device = device or rank_device()
        self.cfg, self.name = cfg, "embed"
        self.tok = nn.Module()
        self.tok.weight = _param(cfg, "embed.tok.weight", device)
        if cfg.style == "gpt":
            self.pos = nn.Module()
            self.pos.weight = mark_sequence_parallel(_param(cfg, "embed.pos.weight", device))

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
    """Sequence-parallel model: SPEmbedding, SPBlocks, the final norm on shards, the head
    (column/vocab-parallel, its input all-gathered) and the vocab-parallel loss. Call
    ``sync_sequence_parallel_grads(model)`` after ``backward()``."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        ### BEGIN SOLUTION hint: validate (sequence_parallel=True); embed, blocks, norm_f (sp_norm), head
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        device = device or rank_device()
        self.cfg, self.name = cfg, ""
        self.embed = SPEmbedding(cfg, device)
        self.blocks = nn.ModuleList(SPBlock(cfg, i, device) for i in range(cfg.n_layers))
        self.norm_f = sp_norm(cfg, "norm_f", device)
        self.head = SPColumnParallelLinear(cfg, "head", cfg.hidden, cfg.vocab_size, bias=False,
                                           device=device)
        ### END SOLUTION

    def local_logits(self, tokens: torch.Tensor, step: int = 0) -> torch.Tensor:
        ### BEGIN SOLUTION
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h, step)
        return self.head(self.norm_f(h))                                     # [B, S, V/n]
        ### END SOLUTION

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, step: int = 0) -> torch.Tensor:
        return vocab_parallel_cross_entropy(self.local_logits(tokens, step), targets,
                                            self.cfg.vocab_size)


def sync_sequence_parallel_grads(module: nn.Module) -> int:
    """After backward: sum the gradients of every parameter tagged sequence-parallel over the
    ranks (one all-reduce of them all, flattened together). Returns how many were synced.

    Why: such a parameter is replicated, but each rank computed its gradient from S/n positions
    only; the reference's gradient sums over all S. Summing the partial gradients gives the
    true one, identical on every rank, so the replicas stay equal after the optimizer step."""
    params = [p for p in module.parameters()
              if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if not params or tp_world_size() == 1:
        return len(params)
    ### BEGIN SOLUTION hint: torch.cat of the flattened grads, dist.all_reduce, copy the pieces back
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        k = p.grad.numel()
        p.grad.copy_(flat[offset:offset + k].view_as(p.grad))
        offset += k
    ### END SOLUTION
    return len(params)


# --------------------------------------------------------------------------- activation memory (given)
def saved_activation_bytes(run, module: nn.Module, parallel_types: tuple) -> tuple:
    """Run ``run()`` and measure what autograd saves for backward: ``(result, {region: bytes})``.

    Each saved tensor's storage counts once (q, k and v save the same input); parameters are
    not activations and are left out. A tensor first saved while a module of ``parallel_types``
    (attention, MLP) runs counts as ``"parallel"``, any other as ``"sequence"`` (norms, dropout,
    residual: the part sequence parallelism shards)."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict = {}
    region = ["sequence"]
    hooks = []
    def enter(*_):
        region.append("parallel")

    def leave(*_):
        region.pop()                      # (a forward hook that returns a value replaces the output)

    for m in module.modules():
        if isinstance(m, parallel_types):
            hooks.append(m.register_forward_pre_hook(enter))
            hooks.append(m.register_forward_hook(leave))

    def pack(t):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in params and ptr not in seen:
            seen[ptr] = (region[-1], storage.nbytes())
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            result = run()
    finally:
        for h in hooks:
            h.remove()
    out = {"parallel": 0, "sequence": 0}
    for kind, nbytes in seen.values():
        out[kind] += nbytes
    return result, out


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
