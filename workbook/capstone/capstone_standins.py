"""The package's stand-ins for the earlier labs' pieces the capstone composes.

The capstone runs the learner's own answers (``capstone.pieces`` loads them). Where one is
unfinished, one of these stands in, so that the capstone's own tasks can still be built and
checked; the grader withholds the points that rest on a stand-in. They are plain, correct and
unhurried (no overlap), never the earlier lab's answer file:

* ``plain_sp_block``: the sequence-parallel block with blocking collectives (lab ``sp``'s
  layout, Korthikanti et al. 2022, arXiv 2205.05198): the column-parallel GEMM all-gathers its
  input forward and again backward (Megatron keeps only the shard), so it moves the same bytes
  as ``tp_overlap``'s ``OverlapBlock`` with the ``Overlap()`` default, nothing hidden;
* ``buckets_in_backward_order``: lab ``dp_overlap``'s bucketing rule (PyTorch DDP, Li et al.
  2020, arXiv 2006.15704);
* ``one_f_one_b``: lab ``pp_overlap``'s 1F1B order (PipeDream-Flush, Narayanan et al. 2021,
  arXiv 2104.04473);
* ``PairedExchangeExecutor``: a stage executor whose transfers are posted together and waited
  at once after every action (Megatron-LM's paired exchange, no overlap).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from workbook.model import ModelConfig
from workbook.model import ops as model_ops
from workbook.model.reference import rope_tables
from workbook.pipeline_parallel import B, F, StageExecutor
from workbook.runtime import ranks
from workbook.tensor_parallel import (
    SequenceParallelBlock,
    ShardedLinear,
    all_gather_sequence,
    reduce_scatter_sequence,
    tp_world_size,
)


def _wgrad(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return dy.flatten(0, -2).T @ x.flatten(0, -2)                 # [.., out], [.., in] -> [out, in]


class _ColumnMatmul(torch.autograd.Function):
    """``AG(x) W^T`` from a sequence shard ``[b, S/n, in]``; backward re-gathers ``x``."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return all_gather_sequence(x) @ weight.T                    # [b, S, out/n]

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        x_full = all_gather_sequence(x)                             # [b, S, in]
        dx = reduce_scatter_sequence(dy @ weight)                   # [b, S/n, in]
        return dx, _wgrad(dy, x_full)


class _RowMatmul(torch.autograd.Function):
    """``RS(a W^T)`` from ``[b, S, in/n]`` to this rank's shard ``[b, S/n, out]``."""

    @staticmethod
    def forward(ctx, a, weight):
        ctx.save_for_backward(a, weight)
        return reduce_scatter_sequence(a @ weight.T)

    @staticmethod
    def backward(ctx, dy):
        a, weight = ctx.saved_tensors
        dy_full = all_gather_sequence(dy.contiguous())              # [b, S, out]
        return dy_full @ weight, _wgrad(dy_full, a)


def _column(x: torch.Tensor, linears: list) -> list:
    y = _ColumnMatmul.apply(x, torch.cat([lin.weight for lin in linears]))
    outs = y.split([lin.weight.shape[0] for lin in linears], dim=-1)
    return [o if lin.bias is None else o + lin.bias for o, lin in zip(outs, linears)]


def _row(a: torch.Tensor, linear: ShardedLinear) -> torch.Tensor:
    y = _RowMatmul.apply(a, linear.weight)
    return y if linear.bias is None else y + linear.bias


class _Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, device):
        super().__init__()
        self.cfg, self.local_heads = cfg, cfg.heads // tp_world_size()
        for w in ("wq", "wk", "wv"):
            setattr(self, w, ShardedLinear(cfg, f"blocks.{layer}.attn.{w}", "column", device))
        self.wo = ShardedLinear(cfg, f"blocks.{layer}.attn.wo", "row", device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = _column(x, [self.wq, self.wk, self.wv])                     # [b, S, H/n]
        ctx = model_ops.causal_attention(q, k, v, self.local_heads, rope_tables(self.cfg, q))
        return _row(ctx, self.wo)                                           # [b, S/n, H]


class _MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, device):
        super().__init__()
        self.cfg = cfg
        names = ("fc1", "fc2") if cfg.style == "gpt" else ("w_gate", "w_up", "w_down")
        for w in names:
            setattr(self, w, ShardedLinear(cfg, f"blocks.{layer}.mlp.{w}",
                                           "row" if w in ("fc2", "w_down") else "column", device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cfg.style == "gpt":
            h, = _column(x, [self.fc1])
            return _row(model_ops.gelu(h), self.fc2)
        gate, up = _column(x, [self.w_gate, self.w_up])
        return _row(model_ops.silu(gate) * up, self.w_down)


def plain_sp_block(cfg: ModelConfig, layer: int = 0, device=None) -> nn.Module:
    """Block ``blocks.{layer}`` on sequence shards, blocking collectives (see the docstring)."""
    device = device or ranks.device()
    return SequenceParallelBlock(cfg, layer, _Attention(cfg, layer, device),
                                 _MLP(cfg, layer, device), device)


def buckets_in_backward_order(params: list[nn.Parameter], bucket_bytes: int) -> list[list]:
    """The parameters (in order of use) from the last, in buckets of at most ``bucket_bytes``
    (a bigger parameter alone)."""
    buckets, size = [[]], 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if buckets[-1] and size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes
    return buckets


def one_f_one_b(p: int, m: int, stage: int) -> list[tuple]:
    """Stage ``stage``'s 1F1B actions: ``min(p - 1 - stage, m)`` warm-up forwards, then one
    forward and one backward in turn, then the backwards left."""
    warmup = min(p - 1 - stage, m)
    actions = [(F, i) for i in range(warmup)]
    for j in range(m - warmup):
        actions += [(F, warmup + j), (B, j)]
    return actions + [(B, j) for j in range(m - warmup, m)]


class PairedExchangeExecutor(StageExecutor):
    """One stage's actions; after each, its send and the next action's receive are posted
    together and both waited on (no deadlock, nothing hidden)."""

    def step(self, tokens, targets, actions):
        self.inbox = None
        return super().step(tokens, targets, actions)

    def _exchange(self, tensor, peer) -> None:
        works = [] if tensor is None else [dist.isend(tensor.detach().contiguous(), peer)]
        nxt = self.receive_for(self.position + 1)
        if nxt is not None:
            src, self.inbox = nxt
            works.append(dist.irecv(self.inbox, src))
        for work in works:
            work.wait()

    def _received(self) -> torch.Tensor:
        if self.inbox is None:
            src, buffer = self.receive_for(self.position)
            dist.recv(buffer, src)
            return buffer
        buffer, self.inbox = self.inbox, None
        return buffer

    def forward_step(self, i: int) -> None:
        x = self.batches[i][0] if self.prev is None else self._received().requires_grad_()
        out = self.stage(x)
        if self.next is None:
            out = self.stage.loss(out, self.batches[i][1], self.m)
            self.losses.append(out.detach())
        self.inputs[i], self.outputs[i] = x, out
        self._exchange(out if self.next is not None else None, self.next)

    def backward_step(self, i: int) -> None:
        x, out = self.inputs.pop(i), self.outputs.pop(i)
        out.backward() if self.next is None else out.backward(self._received())
        self._exchange(x.grad if self.prev is not None else None, self.prev)
