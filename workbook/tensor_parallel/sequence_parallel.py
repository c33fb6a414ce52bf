"""The given pieces of sequence parallelism, for the labs after ``sp`` (``tp_overlap`` first).

Lab 5 (``labs/sp.py``) is where a learner writes sequence-parallel TP (Korthikanti et al. 2022,
arXiv 2205.05198, sec. 4.2.2). A later lab that builds *on* that layout takes these pieces as
given code, so that it never hands out lab 5's answer and is graded on its own:

* the two sequence collectives, blocking or started asynchronously (``Pending``):
  ``all_gather_sequence`` ``[B, S/n, ...] -> [B, S, ...]`` and ``reduce_scatter_sequence``
  ``[B, S, ...] -> [B, S/n, ...]`` (the sum over ranks, this rank's positions). The collectives
  join and cut dim 0, so both run on the sequence-first layout ``[S, B, ...]`` and transpose back;
* ``ShardedLinear``: one linear's parameters, this rank's Megatron slice of the reference's
  (column: rows of ``weight`` and ``bias``; row: columns of ``weight``, the whole bias, tagged
  sequence-parallel because it is added on a shard);
* ``SequenceParallelBlock``: the pre-norm block on sequence shards around any attention and MLP
  sublayers: norms, dropout (this rank's slice of the reference mask) and residual adds on
  ``[B, S/n, H]``;
* ``sync_sequence_parallel_grads``: after backward, the sum over ranks of the gradients that
  each rank computed from its own positions only.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from workbook.model import ModelConfig, dropout_mask
from workbook.model.reference import make_norm
from workbook.tensor_parallel.mappings import local_param, mark_sequence_parallel, sequence_range, tp_world_size
from workbook.runtime import ranks


# --------------------------------------------------------------------------- the sequence collectives
class Pending:
    """A sequence collective in flight: ``wait()`` returns its result in the ``[B, ...]`` layout.
    On one rank there is nothing to wait for."""

    def __init__(self, work, buffer: torch.Tensor):
        self._work, self._buffer = work, buffer

    def wait(self) -> torch.Tensor:
        if self._work is not None:
            self._work.wait()
            self._work = None
        return self._buffer.transpose(0, 1).contiguous()         # [S or S/n, B, ...] -> [B, ...]


def start_all_gather_sequence(x: torch.Tensor) -> Pending:
    """Start ``[B, S/n, ...] -> [B, S, ...]`` (every rank's positions in rank order); returns at once."""
    n = tp_world_size()
    xt = x.transpose(0, 1).contiguous()                                       # [S/n, B, ...]
    if n == 1:
        return Pending(None, xt)
    full = torch.empty((n * xt.shape[0], *xt.shape[1:]), dtype=x.dtype, device=x.device)
    return Pending(dist.all_gather_into_tensor(full, xt, async_op=True), full)   # [S, B, ...]


def start_reduce_scatter_sequence(x: torch.Tensor) -> Pending:
    """Start ``[B, S, ...] -> [B, S/n, ...]``: the sum over ranks of this rank's positions."""
    n = tp_world_size()
    xt = x.transpose(0, 1).contiguous()                                       # [S, B, ...]
    if n == 1:
        return Pending(None, xt)
    if xt.shape[0] % n:
        raise ValueError(f"sequence length {xt.shape[0]} is not divisible by tp={n}")
    mine = torch.empty((xt.shape[0] // n, *xt.shape[1:]), dtype=x.dtype, device=x.device)
    return Pending(dist.reduce_scatter_tensor(mine, xt, async_op=True), mine)    # [S/n, B, ...]


def all_gather_sequence(x: torch.Tensor) -> torch.Tensor:
    """``[B, S/n, ...] -> [B, S, ...]``, waited on at once."""
    return start_all_gather_sequence(x).wait()


def reduce_scatter_sequence(x: torch.Tensor) -> torch.Tensor:
    """``[B, S, ...] -> [B, S/n, ...]`` (summed over ranks), waited on at once."""
    return start_reduce_scatter_sequence(x).wait()


# --------------------------------------------------------------------------- parameters
class ShardedLinear(nn.Module):
    """The parameters of the reference linear ``name`` on this rank (``kind``: ``"column"`` or
    ``"row"``), no forward of its own: a lab decides how it multiplies and communicates.
    ``weight`` is ``[out/n, in]`` (column) or ``[out, in/n]`` (row); ``bias`` (gpt only) is
    ``[out/n]`` (column) or the whole ``[out]`` (row: tagged sequence-parallel)."""

    def __init__(self, cfg: ModelConfig, name: str, kind: str, device=None):
        super().__init__()
        if kind not in ("column", "row"):
            raise ValueError(f"kind must be 'column' or 'row', not {kind!r}")
        self.name, self.kind = name, kind
        self.weight = local_param(cfg, f"{name}.weight", device)
        self.bias = None
        if cfg.style == "gpt":
            self.bias = local_param(cfg, f"{name}.bias", device)
            if kind == "row":
                mark_sequence_parallel(self.bias)


# --------------------------------------------------------------------------- the block around the sublayers
class SequenceParallelBlock(nn.Module):
    """Pre-norm block ``blocks.{layer}`` on sequence shards ``[B, S/n, H] -> [B, S/n, H]``::

        x = x + dropout(attn(norm1(x)))        attn, mlp: sequence shards in and out
        x = x + dropout(mlp(norm2(x)))

    The norms' parameters are tagged sequence-parallel (their gradients are partial sums); the
    dropout mask is this rank's positions of the reference's full mask."""

    def __init__(self, cfg: ModelConfig, layer: int, attn: nn.Module, mlp: nn.Module, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        device = device or ranks.device()
        self.cfg, self.layer, self.name = cfg, layer, f"blocks.{layer}"
        self.norm1 = make_norm(cfg, f"{self.name}.norm1").to(device)
        self.attn = attn
        self.norm2 = make_norm(cfg, f"{self.name}.norm2").to(device)
        self.mlp = mlp
        for norm in (self.norm1, self.norm2):
            for p in norm.parameters():
                mark_sequence_parallel(p)

    def dropout(self, x: torch.Tensor, site: str, step: int) -> torch.Tensor:
        if not self.training or self.cfg.dropout == 0.0:
            return x
        S = x.shape[1] * tp_world_size()
        s0, s1 = sequence_range(S)
        mask = dropout_mask(self.cfg, f"{self.name}.{site}.dropout", (x.shape[0], S, x.shape[2]),
                            step, x.device)
        return x * mask[:, s0:s1].contiguous()

    def forward(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.norm1(x)), "attn", step)          # [B, S/n, H]
        x = x + self.dropout(self.mlp(self.norm2(x)), "mlp", step)
        return x


def all_reduce_grads(grads: list) -> None:
    """Sum each of ``grads`` over the ranks, in place, with one flat all-reduce."""
    if grads and tp_world_size() > 1:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        for g, summed in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(summed.view_as(g))


def sync_sequence_parallel_grads(module: nn.Module) -> int:
    """Sum over the ranks the gradients of the parameters tagged sequence-parallel (one flat
    all-reduce). Returns how many there were."""
    params = [p for p in module.parameters()
              if getattr(p, "sequence_parallel", False) and p.grad is not None]
    all_reduce_grads([p.grad for p in params])
    return len(params)
