"""The backward of a model chunk in two: B (the input gradient) now, W (the weight gradients) later.

A given piece of lab ``pp_schedules`` (lesson 12, section 4, "The backward in two"). Zero-bubble
pipelines (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv 2401.10241, section 2)
start from one observation about a linear layer ``y = x A^T + b`` (``A [out, in]``)::

    B:  dx = dy A                  [N, out] @ [out, in] -> [N, in]    the previous stage waits
    W:  dA = dy^T x, db = sum_n dy [out, N] @ [N, in] -> [out, in]    nobody waits (until the step)

(``N`` = the rows of the micro-batch, batch times sequence). The backward of a chunk is a chain
of B's: each layer's ``dx`` is the ``dy`` of the layer before it, so B must run in order and at
once, but every W only needs its own layer's ``x`` (saved by the forward) and ``dy`` (made by
B). So B runs the chunk's backward computing ``dx`` alone and *stashes* ``(x, dy)`` for every
linear; W, any time later, turns each stash into ``dA`` and ``db`` with one matmul and a sum. W
redoes none of B's work and never enters autograd: it is one ``mm`` per linear, in any order of
micro-batches, after their B's.

What this module gives:

* ``WeightGradStore``: one chunk's stashes, by micro-batch. ``with store.micro_batch(i):`` around
  micro-batch i's *forward* tags every split linear it runs; their backward (B, started by a
  plain ``out.backward(dy)``) stashes under that tag; ``store.weight_grads(i)`` is W(i).
* ``SplitLinear``: a linear (a reference ``Linear`` or the ``LMHead``) whose autograd function
  computes only ``dx`` when tagged, and the usual full backward when not (so a module with split
  linears still trains as before outside a pipeline).
* ``split_linears(module, store)``: swap every linear of a chunk for a ``SplitLinear`` sharing
  its parameters (their names and values do not change).

Only the linears are split (q, k, v, o, the MLP's matrices and the head: nearly all of the
FLOPs and parameters). The other parameters -- the norms' gains and biases and the embedding
tables -- get their gradients during B, from autograd as usual: they are cheap vectors or a
scatter-add, and the paper splits only the matmuls too.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from workbook.model import Linear, LMHead
from workbook.model import ops


class WeightGradStore:
    """The deferred weight gradients (W's) of one model chunk, by micro-batch.

    ``key`` is the micro-batch whose forward runs now (None outside ``micro_batch``); the stash
    of micro-batch i holds one ``(layer, x [N, in], dy [N, out])`` per split linear its B went
    through, until ``weight_grads(i)`` turns them into gradients."""

    def __init__(self):
        self.key = None
        self._stash: dict = {}                  # micro-batch -> [(SplitLinear, x, dy), ...]

    @contextmanager
    def micro_batch(self, key):
        """Tag the split linears that run inside this block (micro-batch ``key``'s forward):
        their B will stash for ``key`` instead of computing weight gradients."""
        if self.key is not None:
            raise RuntimeError(f"micro-batch {key}'s forward starts inside micro-batch "
                               f"{self.key}'s: run one chunk forward at a time")
        self.key = key
        try:
            yield self
        finally:
            self.key = None

    def stash(self, key, layer: "SplitLinear", x: torch.Tensor, dy: torch.Tensor) -> None:
        """B's part for one linear: keep its input and output gradient for W (called from the
        linear's backward)."""
        self._stash.setdefault(key, []).append((layer, x, dy))

    def pending(self) -> list:
        """The micro-batches whose B has run and W not yet, in the order of their first stash."""
        return list(self._stash)

    @torch.no_grad()
    def weight_grads(self, key) -> int:
        """W(key): add ``dy^T x`` to every stashed linear's weight gradient (and ``sum dy`` to its
        bias's), free the stash, return how many linears it updated. Raises if micro-batch
        ``key`` has nothing stashed (its B has not run, or its W already did)."""
        if key not in self._stash:
            raise RuntimeError(f"W({key}) has nothing to compute: its B has not run on this chunk "
                               f"(or its W already ran); stashed: {self.pending()}")
        work = self._stash.pop(key)
        for layer, x, dy in work:
            x2 = x.reshape(-1, x.shape[-1])                  # [N, in]
            dy2 = dy.reshape(-1, dy.shape[-1])               # [N, out]
            _accumulate(layer.weight, dy2.T @ x2)            # [out, N] @ [N, in] -> [out, in]
            if layer.bias is not None:
                _accumulate(layer.bias, dy2.sum(0))          # [out]
        return len(work)


def _accumulate(param: nn.Parameter, grad: torch.Tensor) -> None:
    if param.grad is None:
        param.grad = grad
    else:
        param.grad += grad


class _SplitLinearFunction(torch.autograd.Function):
    """``y = x A^T + b`` whose backward, when the forward was tagged with a micro-batch, returns
    only ``dx = dy A`` and stashes ``(x, dy)``; untagged, it returns ``dx, dA, db`` as usual."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        ctx.layer, ctx.key = layer, layer.store.key
        ctx.save_for_backward(x, weight)
        return ops.linear(x, weight, bias)                   # [..., in] -> [..., out]

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dx = dy @ weight if ctx.needs_input_grad[0] else None   # [.., out] @ [out, in] -> [.., in]
        if ctx.key is not None:                                  # B: W comes later
            ctx.layer.store.stash(ctx.key, ctx.layer, x, dy)
            return dx, None, None, None
        x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        dw = dy2.T @ x2 if ctx.needs_input_grad[1] else None    # [out, N] @ [N, in]
        db = dy2.sum(0) if ctx.needs_input_grad[2] else None
        return dx, dw, db, None


class SplitLinear(nn.Module):
    """A reference ``Linear`` (or the ``LMHead``) with its backward split: the same parameter
    objects (``weight [out, in]``, ``bias [out]`` or None) and ``name``, and ``store``, the
    chunk's ``WeightGradStore``."""

    def __init__(self, linear: nn.Module, store: WeightGradStore):
        super().__init__()
        if not isinstance(linear, (Linear, LMHead)):
            raise TypeError(f"SplitLinear takes a workbook.model Linear or LMHead, got "
                            f"{type(linear).__name__}")
        self.name, self.store = linear.name, store
        self.weight = linear.weight
        self.bias = getattr(linear, "bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SplitLinearFunction.apply(x, self.weight, self.bias, self)

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The head's loss (``LMHead.loss``), so a split head still answers it."""
        return LMHead.loss(logits, targets)


def split_linears(module: nn.Module, store: WeightGradStore) -> int:
    """Replace every ``Linear`` and ``LMHead`` inside ``module`` by a ``SplitLinear`` on
    ``store`` that shares its parameters; return how many were replaced. Parameter names
    (``blocks.3.attn.wq.weight``) and values do not change."""
    count = 0
    for parent in list(module.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, (Linear, LMHead)):
                setattr(parent, child_name, SplitLinear(child, store))
                count += 1
    if count == 0:
        raise ValueError(f"{type(module).__name__} holds no Linear or LMHead to split: give it a "
                         f"model chunk (a PipelineStage)")
    return count
