# Generated from solutions/pp_schedules.py by `workbook assign` (level: standard): this is your file to edit.
# Replace each `raise NotImplementedError` with your code; check it with `workbook run pp_schedules`
# (or `workbook watch pp_schedules`). Stuck on task N? `workbook hint pp_schedules N`, one hint at a time.
#
# Your tasks (41 pts in all):
#   1. interleaved_1f1b (5 pts): Rank `rank`'s actions (of `p` ranks holding `v` chunks each, `m`
#      micro-batches) under Megatron-LM's interleaved 1F1B, the backward not split (each B is the
#      whole backward).
#   2. zb_h1 (5 pts): Rank `rank`'s actions under ZB-H1: 1F1B with each backward split into B (the
#      input gradient, sent upstream at once) and W (the weight gradient, which can wait).
#   3. zbv (5 pts): Rank `rank`'s actions under ZBV, the V schedule with the backward split.
#   4. OverlappedChunkedExecutor.post_receive, .prefetch, .take_input, .send, .forward_step,
#      .backward_step and .finish (23 pts): A rank's chunks running a chunked schedule, the
#      transfers travelling while it computes.
#   5. predict_step_ms (3 pts): Predict, before running it, the step time in ms of your schedule
#      `schedule` (a key of `SCHEDULES`) on `p` ranks holding `v` chunks each, `m` micro-batches,
#      run by `OverlappedChunkedExecutor` on the simulated `link`.
"""Lab `pp_schedules`: pipelines with (almost) no bubble: virtual stages, the split backward, a V.

Lesson 12 (``lessons/12_pp_schedules.py``) explains everything this lab builds. Lab 10 gave each
rank one stage and left it idle for (p - 1)/(m + p - 1) of the step. Here each rank holds ``v``
model chunks (virtual stages), and the backward pass is split in two: B, the gradient of the
stage's input, sent upstream at once, and W, the weight gradient, which can wait. You build, as
pure functions graded at once without ranks (each returns one rank's list of actions):

1. ``interleaved_1f1b``: Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, arXiv
   2104.04473, section 2.2), chunk c of rank r being stage c*p + r;
2. ``zb_h1``: zero bubble with 1F1B's activation memory (Qi et al. 2023, "Zero Bubble Pipeline
   Parallelism", arXiv 2401.10241, section 3), the W's deferred into the drain's idle time;
3. ``zbv``: the V schedule of the same paper (section 6), two chunks per rank in a V, chunk 0
   of rank r being stage r and chunk 1 stage 2p - 1 - r;

and then, on ranks:

4. ``OverlappedChunkedExecutor``: a rank's chunks running any of these schedules, each action's
   input already travelling while the action before it computes, the sends waited for only at
   the end (lab 10's overlapped executor, with chunks and the split backward);
5. ``predict_step_ms``: before you run it, the step time of one of your schedules on your
   executor over the simulated link, from the link's figures and the measured compute.

An action is a triple ``(kind, micro_batch, chunk)``, kind F (forward), B (backward: the input
gradient in a schedule that has W's, the whole backward in one that has none) or W (weight
gradient). Given pieces: ``workbook/pipeline_parallel/virtual_stages.py`` (the placements, the
checker ``check_chunked_schedule`` that proves a schedule complete and free of deadlock on
paper, ``simulate_chunked`` that times it and counts activations in flight), then
``split_backward.py`` (B and W of a chunk's backward) and ``chunked_executor.py``
(``ChunkedExecutor``, the base of section 4): read them first.
"""
from __future__ import annotations

from collections import deque

import torch
import torch.distributed as dist

from workbook.pipeline_parallel import (B, F, INTERLEAVED, V_SHAPE, W, ChunkedExecutor,
                                        check_interleaved_shape, simulate_chunked)


# --------------------------------------------------------------------------- 1. interleaved 1F1B
def interleaved_1f1b(p: int, v: int, m: int, rank: int) -> list[tuple]:
    """Rank ``rank``'s actions (of ``p`` ranks holding ``v`` chunks each, ``m`` micro-batches)
    under Megatron-LM's interleaved 1F1B, the backward not split (each B is the whole backward).

    Lesson 12, sections 2 ("Virtual stages") and 3 ("Megatron's order"), derives the order from
    the pipeline's dependencies; the grader compares yours, action by action, with the order
    PyTorch's ``ScheduleInterleaved1F1B`` runs. Contract:

    * a list of (kind, micro-batch, chunk) triples, kind F or B; chunk c of rank r is stage
      c*p + r;
    * the ranks' lists together pass ``check_chunked_schedule(..., placement="interleaved")``;
    * Megatron-LM's order exactly, including its warm-up count; ``v = 1`` is lab 10's
      ``one_f_one_b`` (Megatron-LM runs plain 1F1B when there are no virtual stages);
    * ``v > 1`` with ``m`` not a multiple of ``p``: the one-line ``ValueError`` of the given shape
      check (Megatron-LM's rule, in ``virtual_stages``)."""
    raise NotImplementedError("not implemented yet: pp_schedules.interleaved_1f1b")


# --------------------------------------------------------------------------- 2. ZB-H1
def zb_h1(p: int, v: int, m: int, rank: int) -> list[tuple]:
    """Rank ``rank``'s actions under ZB-H1: 1F1B with each backward split into B (the input
    gradient, sent upstream at once) and W (the weight gradient, which can wait).

    Lesson 12, sections 4 ("The backward in two") and 5 ("ZB-H1: the drain filled"); Qi et al.
    2023, section 3. ``v = 1`` is the paper's ZB-H1; ``v > 1`` interleaves it as
    ``interleaved_1f1b`` does. The grader compares yours, action by action, with the order
    PyTorch's ``ScheduleInterleavedZeroBubble`` runs. Contract:

    * kinds F, B and W; the F's and B's in 1F1B's order, chunks switched as in
      ``interleaved_1f1b`` (the warm-up is not Megatron's: lesson 12, section 5);
    * each W as soon as it can run without growing the rank's activations in flight beyond
      1F1B's rank 0's, in the order of the B's; on paper (``simulate_chunked``, equal costs)
      each rank then idles a third of what 1F1B idles;
    * the ranks' lists together pass ``check_chunked_schedule(..., placement="interleaved")``;
      the same shapes refused as ``interleaved_1f1b``."""
    raise NotImplementedError("not implemented yet: pp_schedules.zb_h1")


# --------------------------------------------------------------------------- 3. ZBV
def zbv(p: int, v: int, m: int, rank: int) -> list[tuple]:
    """Rank ``rank``'s actions under ZBV, the V schedule with the backward split.

    Lesson 12, section 6 ("The V"); Qi et al. 2023, section 6. ``v`` must be 2: chunk 0 of rank r
    is stage r (the micro-batch goes down the ranks), chunk 1 is stage ``2p - 1 - r`` (and comes
    back up), so rank p - 1 turns each micro-batch round without a transfer and rank 0 holds both
    the first stage and the last. The grader compares yours, action by action, with the order
    PyTorch's ``ScheduleZBVZeroBubble`` runs. Contract:

    * kinds F, B and W; the ranks' lists pass ``check_chunked_schedule(..., placement="v")``;
    * on paper (``simulate_chunked``, equal costs, ``m >= 2p``) every rank idles only
      ``(p - 1) t_F``, the least any schedule can, and holds at most ``2p`` chunk-activations
      (p whole stages: 1F1B's peak);
    * with fewer than ``2p - 1`` micro-batches: the order made for ``2p - 1``, the actions of the
      micro-batches that do not exist left out;
    * ``v != 2``: a one-line ``ValueError``."""
    raise NotImplementedError("not implemented yet: pp_schedules.zbv")


SCHEDULES = {"interleaved_1f1b": (interleaved_1f1b, INTERLEAVED), "zb_h1": (zb_h1, INTERLEAVED),
             "zbv": (zbv, V_SHAPE)}


def all_ranks(schedule, p: int, v: int, m: int) -> list[list[tuple]]:
    """Every rank's actions: what ``check_chunked_schedule`` and ``simulate_chunked`` read."""
    return [schedule(p, v, m, r) for r in range(p)]


# --------------------------------------------------------------------------- 4. the executor
class OverlappedChunkedExecutor(ChunkedExecutor):
    """A rank's chunks running a chunked schedule, the transfers travelling while it computes.
    Lesson 12, section 7 ("On your ranks"); lab 10's ``OverlappedExecutor`` is the same idea on
    one stage per rank.

    ``ChunkedExecutor.step`` (given; read it) checks the schedules, calls your steps in the
    order of the rank's actions (F inside its chunk's micro-batch tag, W given), and tells you
    for each action where its input comes from and where its output goes (``source`` /
    ``destination``: a rank and the action there) and, per peer, the order that peer's messages
    arrive in (``arrivals`` / ``arrival``). Contract:

    * numbers: the loss (on the rank holding the last stage) and every parameter's gradient
      equal single-device training on the whole batch (fp64), for ``interleaved_1f1b``,
      ``zb_h1`` and ``zbv``, GPT and Llama, on 2 and 4 ranks;
    * forward of micro-batch ``i`` on chunk ``c``: its input is the tokens on stage 0, else the
      activation its source made (made to require a gradient); on the last stage the output
      becomes the micro-batch's loss (the chunk's loss method), recorded in the losses the base
      sums; else it goes to its destination; backward: the loss or the received gradient drives
      it; the input's gradient goes to its destination unless the chunk holds stage 0;
    * transfers: a tensor whose destination is on this rank is handed over in memory (no
      point-to-point op); one for another rank is sent without waiting, and every send is
      waited for only in ``finish``; a receive is posted before the action before it computes,
      and receives from one peer are posted in the order that peer sends (``arrivals``), so
      each message lands in its own buffer and nothing deadlocks;
    * only point-to-point ops, no collectives; every transfer is waited for before the step
      returns."""

    def post_receive(self, k) -> None:
        """Post, without waiting, the receive of action ``k`` (None, or an action fed by no
        other rank: nothing to do), and first every receive from the same peer that comes
        before it in that peer's sending order and is not posted yet; keep each one under the
        position of the action it feeds."""
        raise NotImplementedError("not implemented yet: pp_schedules.OverlappedChunkedExecutor.post_receive")

    def prefetch(self) -> None:
        """At the start of a forward or backward: the running action's receive and that of the
        next action fed by another rank are both posted (the class's contract)."""
        raise NotImplementedError("not implemented yet: pp_schedules.OverlappedChunkedExecutor.prefetch")

    def take_input(self) -> torch.Tensor:
        """The running action's input, once it is there: handed over in memory when its source
        is on this rank, else its posted receive, waited for now."""
        raise NotImplementedError("not implemented yet: pp_schedules.OverlappedChunkedExecutor.take_input")

    def send(self, tensor: torch.Tensor) -> None:
        """Deliver what the running action made to its destination: in memory on this rank,
        else a send not waited for (kept until ``finish``)."""
        raise NotImplementedError("not implemented yet: pp_schedules.OverlappedChunkedExecutor.send")

    def forward_step(self, i: int, c: int) -> None:
        """Micro-batch ``i``'s forward on chunk ``c``, then its output delivered (the class's
        contract)."""
        raise NotImplementedError("not implemented yet: pp_schedules.OverlappedChunkedExecutor.forward_step")

    def backward_step(self, i: int, c: int) -> None:
        """Micro-batch ``i``'s backward on chunk ``c`` (B: the input gradient; the base runs W),
        then the input's gradient delivered (the class's contract)."""
        raise NotImplementedError("not implemented yet: pp_schedules.OverlappedChunkedExecutor.backward_step")

    def finish(self) -> None:
        """After the rank's last action: every send still in flight has completed."""
        raise NotImplementedError("not implemented yet: pp_schedules.OverlappedChunkedExecutor.finish")

    def step(self, tokens, targets, schedules):
        """The base class's step, nothing kept from an earlier step: no receive posted or
        counted, no send in flight, nothing handed over."""
        self.receives, self.posted, self.sends, self.handed = {}, {}, [], {}
        return super().step(tokens, targets, schedules)


# --------------------------------------------------------------------------- 5. prediction
def predict_step_ms(link, schedule: str, p: int, v: int, m: int, shape: tuple, itemsize: int,
                    t_f_ms: float, t_b_ms: float, t_w_ms: float) -> float:
    """Predict, before running it, the step time in ms of your schedule ``schedule`` (a key of
    ``SCHEDULES``) on ``p`` ranks holding ``v`` chunks each, ``m`` micro-batches, run by
    ``OverlappedChunkedExecutor`` on the simulated ``link``.

    Lesson 12, section 7 ("Predict your step").

    * ``link``: a ``workbook.link.cost_model.Link``; its alpha-beta figures are the latency of
      one operation in seconds and the bandwidth in bytes per second;
    * ``shape``: the activation that crosses a boundary between two stages (its gradient has the
      same shape), three sizes (rows, sequence length, hidden size), elements of ``itemsize``
      bytes;
    * ``t_f_ms`` / ``t_b_ms`` / ``t_w_ms``: the measured compute of one micro-batch's forward /
      input-gradient backward (B) / weight-gradient backward (W) through a rank's WHOLE share of
      the model (all its chunks together: lab 10's stage).

    Returns the step time in ms of the paper model of ``simulate_chunked``: a rank runs its
    actions in order, each as soon as the rank is free and its input is there; an input made on
    another rank arrives one transfer time after the action that made it ends, one made on the
    same rank at once; sends never block. The grader compares it with the model's value on
    several pipelines and links; ``workbook run pp_schedules`` prints it beside the model and
    the measured step."""
    raise NotImplementedError("not implemented yet: pp_schedules.predict_step_ms")
