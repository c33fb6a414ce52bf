"""Running a two-micro-batch schedule on the ranks: the executor's machinery.

A given piece of lab ``ep_overlap`` (lesson 13, section 7, "Two micro-batches against each other").
A schedule (:mod:`workbook.expert_parallel.two_batch`) orders the actions of micro-batches ``A``
(the first half of a rank's rows) and ``B`` (the second half). Autograd cannot follow such an
order: one ``loss.backward()`` runs the whole graph in an order of its own. So the executor keeps
each *piece* of a micro-batch's layer (router, experts, the combine's arithmetic) in a graph of its
own, the pieces meeting at leaves across the exchanges, and runs each piece's backward by hand, in
the backward schedule's order. ``TwoBatchExecutor`` does the bookkeeping around that:

* ``executor(x)``: an autograd op over the whole layer: its forward cuts ``x [T, H]`` into the
  two micro-batches and runs ``forward_action`` for each action of the forward schedule; its
  backward hands each micro-batch its output's gradient and runs ``backward_action`` for each
  action of the backward schedule; the input's gradient is the two leaves' ``grad``;
* ``self.mb["A"]`` / ``self.mb["B"]``: a dict per micro-batch, holding ``"x"`` (a leaf), then
  what the actions leave there (the learner's subclass decides; the forward's last action must
  leave the output under ``"y"``), and ``"grad"``, the output's gradient, in the backward;
* ``exchange``: issue one all-to-all without waiting, its handle under ``"work"``;
* each action runs in a profiler range, ``ep:<kind> <mb>.<step>`` (``ep_wait:<mb>.<step>`` for a
  wait), which the trace reads.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from .deferred_wgrad import ExpertGradStore
from .two_batch import Action, check_schedule


class TwoBatchExecutor:
    """Two micro-batches through a layer in the schedules' order (module docstring); subclass
    it and write ``forward_action`` and ``backward_action``. The schedules are checked
    (``check_schedule``) before anything runs; ``deferred_wgrad`` gives the executor a
    ``store`` (an ``ExpertGradStore``) for the experts' weight gradients."""

    def __init__(self, forward_schedule: Sequence[Action], backward_schedule: Sequence[Action],
                 group=None, deferred_wgrad: bool = False):
        check_schedule(forward_schedule, "forward")
        check_schedule(backward_schedule, "backward", deferred_wgrad)
        self.forward_schedule = [tuple(a) for a in forward_schedule]
        self.backward_schedule = [tuple(a) for a in backward_schedule]
        self.group = group
        self.store = ExpertGradStore() if deferred_wgrad else None
        self.mb: dict = {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's output for this rank's tokens ``x [..., H]`` (an even number of rows)."""
        return _TwoBatch.apply(x, self)

    def exchange(self, s: dict, key: str, rows: torch.Tensor, out_splits, in_splits) -> None:
        """Issue the all-to-all of ``rows [N, H]`` (``in_splits`` rows to each rank) into a new
        buffer ``s[key]`` (``sum(out_splits)`` rows) without waiting; the handle is
        ``s["work"]``. The rows are sent as values: their graph stays on this side."""
        if s.get("work") is not None:
            raise RuntimeError(f"an exchange is already in flight for this micro-batch: wait for "
                               f"it before starting {key!r}")
        s[key] = rows.new_empty((sum(out_splits), rows.shape[-1]))          # [M, H], unfilled
        s["work"] = dist.all_to_all_single(s[key], rows.detach().contiguous(), list(out_splits),
                                           list(in_splits), group=self.group, async_op=True)

    def wait(self, s: dict) -> None:
        """Wait for the micro-batch's exchange in flight."""
        s.pop("work").wait()

    def forward_action(self, kind: str, mb: str, step: str) -> None:
        raise NotImplementedError("a TwoBatchExecutor subclass runs each forward action")

    def backward_action(self, kind: str, mb: str, step: str) -> None:
        raise NotImplementedError("a TwoBatchExecutor subclass runs each backward action")

    def run(self, schedule: Sequence[Action], action) -> None:
        """Run ``action(kind, mb, step)`` for each action of ``schedule``, each in its range."""
        for kind, mb, step in schedule:
            label = f"ep_wait:{mb}.{step}" if kind == "wait" else f"ep:{kind} {mb}.{step}"
            with torch.profiler.record_function(label):
                action(kind, mb, step)


class _TwoBatch(torch.autograd.Function):
    """A ``TwoBatchExecutor``'s forward schedule, with its backward schedule as the backward."""

    @staticmethod
    def forward(ctx, x, executor):
        ctx.executor, shape = executor, x.shape
        x2 = x.reshape(-1, shape[-1])                                       # [T, H]
        if x2.shape[0] % 2:
            raise ValueError(f"{x2.shape[0]} tokens do not split into two micro-batches: use an "
                             f"even number of tokens per rank")
        half = x2.shape[0] // 2
        executor.mb = {"A": {"x": x2[:half].detach().requires_grad_()},
                       "B": {"x": x2[half:].detach().requires_grad_()}}
        with torch.enable_grad():                   # each piece keeps its graph
            executor.run(executor.forward_schedule, executor.forward_action)
        y = torch.cat([executor.mb["A"]["y"], executor.mb["B"]["y"]])       # [T, H]
        return y.detach().reshape(shape)

    @staticmethod
    def backward(ctx, grad):
        executor, shape = ctx.executor, grad.shape
        g2 = grad.reshape(-1, shape[-1])
        half = g2.shape[0] // 2
        executor.mb["A"]["grad"], executor.mb["B"]["grad"] = g2[:half], g2[half:]
        executor.run(executor.backward_schedule, executor.backward_action)
        gx = torch.cat([executor.mb[m]["x"].grad for m in ("A", "B")]).reshape(shape)
        executor.mb = {}
        return gx, None
