"""The experts' backward in two: the input gradient now, the weight gradients later.

A given piece of lab ``ep_overlap`` (lesson 13, section 6, "Deferred weight gradients"). Every
matrix of an expert MLP is a linear layer ``y = x A^T + b`` (``A [out, in]``), whose backward is
two independent products (Megatron-LM's ``delay_wgrad_compute``; the same split as zero-bubble
pipelines, Qi et al. 2023, arXiv 2401.10241, section 2)::

    dgrad:  dx = dy A                  [N, out] @ [out, in] -> [N, in]    the all-to-all waits on it
    wgrad:  dA = dy^T x, db = sum_n dy [out, N] @ [N, in] -> [out, in]    nobody waits on it

In an MoE layer's backward the experts' ``dx`` must travel home (the dispatch's backward, an
exchange in the combine's direction) before the router and the input can have their gradients,
but the weight gradients are needed by nobody until the optimizer step. So the experts' backward
computes ``dx`` alone and *stashes* ``(x, dy)`` for every linear; once the all-to-all of ``dx``
is in flight, ``ExpertGradStore.flush`` turns the stashes into ``dA`` and ``db``: one ``mm`` and
one sum per linear, work that hides the transfer.

This is a small version of ``workbook.pipeline_parallel.split_backward`` (a family never imports
another family): the experts are run by :func:`run_experts_deferred` instead of being rewired.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, List

import torch
from torch import nn

from workbook.model import ops


class ExpertGradStore:
    """The stashed ``(x, dy)`` pairs of the experts' linears, by key (a micro-batch, or None).

    The experts' forward runs inside ``store.deferring(key)``; their backward stashes under that
    key instead of computing weight gradients; ``flush(key)`` computes them (the wgrad)."""

    def __init__(self):
        self.key = "default"
        self._stash: dict = {}                       # key -> [(weight, bias, x, dy), ...]

    @contextmanager
    def deferring(self, key="default"):
        """Tag the linears the experts run inside this block with ``key``."""
        before, self.key = self.key, key
        try:
            yield self
        finally:
            self.key = before

    def stash(self, key, weight, bias, x: torch.Tensor, dy: torch.Tensor) -> None:
        self._stash.setdefault(key, []).append((weight, bias, x, dy))

    def pending(self) -> list:
        """The keys whose dgrad has run and whose wgrad has not, in stash order."""
        return list(self._stash)

    @torch.no_grad()
    def flush(self, key="default") -> int:
        """The wgrad of ``key``: add ``dy^T x`` to each stashed weight's gradient (``sum dy`` to
        its bias's), free the stash, return how many linears it updated (0 when the experts got
        no gradient under that key: an expert with no token still stashes its empty rows)."""
        work = self._stash.pop(key, [])
        for weight, bias, x, dy in work:
            x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])   # [N, in], [N, out]
            _accumulate(weight, dy2.T @ x2)                # [out, N] @ [N, in] -> [out, in]
            if bias is not None:
                _accumulate(bias, dy2.sum(0))              # [out]
        return len(work)


def _accumulate(param: nn.Parameter, grad: torch.Tensor) -> None:
    if param.grad is None:
        param.grad = grad
    else:
        param.grad += grad


class _DeferredLinear(torch.autograd.Function):
    """``y = x A^T + b`` whose backward returns only ``dx = dy A`` and stashes ``(x, dy)``."""

    @staticmethod
    def forward(ctx, x, weight, bias, store):
        ctx.store, ctx.key, ctx.bias = store, store.key, bias
        ctx.save_for_backward(x, weight)
        return ops.linear(x, weight, bias)                 # [N, in] -> [N, out]

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        ctx.store.stash(ctx.key, weight, ctx.bias, x, dy)
        return dy @ weight, None, None, None               # [N, out] @ [out, in] -> [N, in]


def _linear(layer: nn.Module, x: torch.Tensor, store: ExpertGradStore) -> torch.Tensor:
    return _DeferredLinear.apply(x, layer.weight, layer.bias, store)


def mlp_deferred(mlp: nn.Module, x: torch.Tensor, store: ExpertGradStore) -> torch.Tensor:
    """``mlp(x)`` (a ``workbook.model`` MLP, gpt or llama) with its weight gradients deferred to
    ``store``: the same products and activations as ``MLP.forward``."""
    if mlp.cfg.style == "gpt":
        return _linear(mlp.fc2, ops.gelu(_linear(mlp.fc1, x, store)), store)      # [N,H]->[N,F]->[N,H]
    gate, up = _linear(mlp.w_gate, x, store), _linear(mlp.w_up, x, store)         # [N,H]->[N,F]
    return _linear(mlp.w_down, ops.silu(gate) * up, store)                        # [N,F]->[N,H]


def run_experts_deferred(experts: List[nn.Module], x_sorted: torch.Tensor, counts: Iterable[int],
                         store: ExpertGradStore) -> torch.Tensor:
    """``run_experts`` (``workbook.model.moe``) whose backward computes only the input gradient;
    the experts' weight gradients wait in ``store`` (under its current key) for ``flush``."""
    pieces = torch.split(x_sorted, [int(c) for c in counts])
    return torch.cat([mlp_deferred(expert.mlp, piece, store)
                      for expert, piece in zip(experts, pieces)])                # [N, H]
