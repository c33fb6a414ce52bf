"""The given pieces of tensor parallelism, shared by the tp, sp and domino labs.

Lab 4 (``labs/tp.py``) is where a learner writes tensor parallelism. What a *later* lab needs
from it as given code lives here, written once, so that a later lab never hands out an earlier
lab's answer and one TP bug never costs points twice (lab 4's grader checks the learner's own):

* where this rank stands: ``tp_rank``, ``tp_world_size`` (a rank's device: ``workbook.runtime.ranks.device()``);
* which slice of the reference model it holds: ``local_param``, ``vocab_range``,
  ``sequence_range``, ``mark_sequence_parallel``, ``row_parallel_name`` (the row-parallel matrix
  of each sublayer), and ``split_last_dim`` / ``gather_last_dim``;
* ``conjugate_op(x, forward, backward)``: an autograd op from a pair of functions, and with it
  Megatron's conjugate pair (Shoeybi et al. 2019, arXiv 1909.08053, Fig. 3) as a reference:
  ``copy_to_tensor_parallel_region`` (f: identity forward, all-reduce backward) and
  ``reduce_from_tensor_parallel_region`` (g: all-reduce forward, identity backward);
* the vocab-parallel cross-entropy, the loss of a head that keeps ``V/n`` logits per rank.

The tensor-parallel group is the whole world here (one group of ``n`` ranks).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from workbook.runtime import ranks

SUBLAYERS = ("attn", "mlp")


# --------------------------------------------------------------------------- where this rank stands
def tp_rank() -> int:
    """This rank's index r in the tensor-parallel group (0 outside a launched rank)."""
    return dist.get_rank() if dist.is_initialized() else 0


def tp_world_size() -> int:
    """The number n of tensor-parallel ranks (1 outside a launched rank)."""
    return dist.get_world_size() if dist.is_initialized() else 1




# --------------------------------------------------------------------------- which slice it holds
def local_param(cfg, name: str, device=None) -> nn.Parameter:
    """This rank's piece of the reference parameter ``name`` (``blocks.0.mlp.fc1.weight``),
    sliced by its shard spec (``workbook.model.shard_spec``): rows for a column-parallel
    weight, columns for a row-parallel one, the whole tensor for a replicated one."""
    from workbook.model import local_weight
    try:
        weight = local_weight(cfg, name, tp_rank(), tp_world_size(), device or ranks.device())
    except ValueError as exc:                  # a shape that does not split over the ranks
        raise ValueError(f"{name}: {exc}") from None
    return nn.Parameter(weight)


def _piece(length: int, what: str) -> tuple[int, int]:
    n, r = tp_world_size(), tp_rank()
    if length % n:
        raise ValueError(f"{what} {length} is not divisible by tp={n}")
    piece = length // n
    return r * piece, (r + 1) * piece


def vocab_range(vocab_size: int) -> tuple[int, int]:
    """``(start, stop)``: the token ids whose embedding rows and logits this rank holds."""
    return _piece(vocab_size, "vocab_size")


def sequence_range(seq_len: int) -> tuple[int, int]:
    """``(s0, s1)``: the positions this rank holds between sequence-parallel regions."""
    return _piece(seq_len, "seq_len")


def row_parallel_name(cfg, sublayer: str) -> str:
    """The row-parallel matrix that ends ``sublayer`` (``"attn"`` or ``"mlp"``) of a block:
    ``attn.wo``, and ``mlp.fc2`` (gpt) or ``mlp.w_down`` (llama)."""
    if sublayer not in SUBLAYERS:
        raise ValueError(f"sublayer must be one of {SUBLAYERS}, not {sublayer!r}")
    if sublayer == "attn":
        return "attn.wo"
    return "mlp.fc2" if cfg.style == "gpt" else "mlp.w_down"


def mark_sequence_parallel(param: nn.Parameter) -> nn.Parameter:
    """Tag a replicated parameter whose gradient a rank computes from its sequence shard only
    (lab 5): such gradients are partial sums, added over the ranks after backward."""
    param.sequence_parallel = True
    return param


# --------------------------------------------------------------------------- f and g (reference)
def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over the tensor-parallel ranks, as a new contiguous tensor."""
    out = x.clone(memory_format=torch.contiguous_format)
    if tp_world_size() > 1:
        dist.all_reduce(out)
    return out


class _ConjugateOp(torch.autograd.Function):
    """``forward(x)`` in the forward pass, ``backward(grad)`` in the backward pass."""

    @staticmethod
    def forward(ctx, x, forward, backward):
        ctx.conjugate = backward
        y = forward(x)
        return x.view_as(x) if y is x else y       # autograd wants a new tensor object

    @staticmethod
    def backward(ctx, grad):
        return ctx.conjugate(grad), None, None


def conjugate_op(x: torch.Tensor, forward, backward) -> torch.Tensor:
    """Apply ``forward`` to ``x``, and ``backward`` to its gradient in the backward pass.

    Every communication operator of tensor parallelism is such a pair, each direction the
    other's conjugate: f = (identity, all-reduce), g = (all-reduce, identity), scatter =
    (split, all-gather), gather = (all-gather, split), and sequence parallelism's (all-gather,
    reduce-scatter) and (reduce-scatter, all-gather)."""
    return _ConjugateOp.apply(x, forward, backward)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def copy_to_tensor_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """f (enter a parallel region): identity forward, all-reduce of the gradient backward. The
    input is replicated, but each rank's dL/dx only covers its own column slice."""
    return conjugate_op(x, _identity, all_reduce_sum)


def reduce_from_tensor_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """g (leave a parallel region): all-reduce forward, identity backward (every rank already
    holds the whole dL/dy of the replicated output)."""
    return conjugate_op(x, all_reduce_sum, _identity)


# --------------------------------------------------------------------------- the vocab-parallel loss
def vocab_parallel_cross_entropy(local_logits: torch.Tensor, targets: torch.Tensor,
                                 vocab_size: int) -> torch.Tensor:
    """The mean next-token loss from this rank's logits ``[B, S, V/n]`` (ids ``vocab_range(V)``).

    loss = mean over tokens of ``log sum_v exp(z_v - m) - (z_target - m)``, with m the maximum
    over the whole vocabulary: one all-reduce (MAX) of ``[B, S]`` for m, and one g each for the
    sum of exponentials and for the target's logit (only the rank holding the target id
    contributes it). No rank ever holds the full ``[B, S, V]`` logits."""
    global_max = local_logits.detach().amax(dim=-1, keepdim=True)             # [B, S, 1]
    if tp_world_size() > 1:
        dist.all_reduce(global_max, op=dist.ReduceOp.MAX)                     # m cancels: no gradient
    z = local_logits - global_max                                             # [B, S, V/n]
    log_sum_exp = reduce_from_tensor_parallel_region(z.exp().sum(dim=-1)).log()
    target_logit = reduce_from_tensor_parallel_region(_held_logit(z, targets, vocab_size))
    return (log_sum_exp - target_logit).mean()


def _held_logit(z: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``z[b, s, target]`` where this rank holds the target id, else 0: ``[B, S]``."""
    start, stop = vocab_range(vocab_size)
    held = ((targets >= start) & (targets < stop)).to(z.dtype)
    local_ids = (targets - start).clamp(0, stop - start - 1).unsqueeze(-1)
    return z.gather(-1, local_ids).squeeze(-1) * held


# --------------------------------------------------------------------------- split and join the last dim
def split_last_dim(x: torch.Tensor) -> torch.Tensor:
    """This rank's contiguous 1/n piece of ``x`` along its last dim (no communication)."""
    n = tp_world_size()
    if x.shape[-1] % n:
        raise ValueError(f"cannot split a last dim of {x.shape[-1]} over tp={n} ranks")
    return x.chunk(n, dim=-1)[tp_rank()].contiguous()


def gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Every rank's ``x`` joined along the last dim, in rank order: ``[..., k] -> [..., n*k]``.

    ``dist.all_gather_into_tensor`` concatenates along dim 0 (gloo wants the output shaped
    ``[n * x.shape[0], ...]``), so the result is viewed as ``[n, *x.shape]`` and the rank dim
    moved next to the last one."""
    n = tp_world_size()
    if n == 1:
        return x
    x = x.contiguous()
    joined = torch.empty((n * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(joined, x)                                   # rank r at rows r*d0:
    stacked = joined.view(n, *x.shape)                                       # [n, ..., k]
    return stacked.movedim(0, -2).reshape(*x.shape[:-1], n * x.shape[-1])   # [..., n*k]
