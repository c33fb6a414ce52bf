# Generated from solutions/pp_overlap.py by `workbook assign` (level: standard): this is your file to edit.
# Replace each `raise NotImplementedError` with your code; check it with `workbook run pp_overlap`
# (or `workbook watch pp_overlap`). Stuck on task N? `workbook hint pp_overlap N`, one hint at a time.
#
# Your tasks (33 pts in all):
#   1. gpipe (2 pts): Stage `stage`'s actions (of `p` stages, `m` micro-batches) under GPipe.
#   2. one_f_one_b (5 pts): Stage `stage`'s actions (of `p` stages, `m` micro-batches) under 1F1B.
#   3. BlockingExecutor.exchange, .take_received, .forward_step and .backward_step (10 pts): One
#      stage's forward and backward steps on its rank, each transfer waited for before the stage
#      goes on.
#   4. OverlappedExecutor.post_receive, .prefetch, .take_received, .exchange and .finish (13 pts):
#      The blocking executor's steps with the transfers hidden.
#   5. predict_step_ms (3 pts): Predict, before running it, the step time in ms of your 1F1B
#      schedule with overlapped p2p (`OverlappedExecutor`) on `p` stages and `m` micro-batches, on
#      the simulated `link`.
"""Lab `pp_overlap`: pipeline parallelism, its point-to-point traffic hidden in the steady state.

Lesson 10 (``lessons/10_pp_overlap.py``) explains everything this lab builds. Rank s holds stage
s, a run of consecutive layers of the reference model; the batch is cut into ``m`` micro-batches
that flow forward through the stages and back. You build, in order:

1. the two schedules, as pure functions graded at once without ranks: GPipe (Huang et al. 2019,
   arXiv 1811.06965) and 1F1B (PipeDream-Flush, Narayanan et al. 2021, arXiv 2104.04473);
2. ``BlockingExecutor``: one stage's steps on its rank, every transfer waited for before the
   stage moves on, and no deadlock;
3. ``OverlappedExecutor``: the same steps with the steady state's transfers travelling while the
   stage computes (what NeMo does by default);
4. ``predict_step_ms``: before you run it, the step time of your overlapped 1F1B on the simulated
   link, from the link's figures and the measured compute.

Given pieces: ``workbook/pipeline_parallel/pipeline_parallel.py`` (the stages, the micro-batches,
the schedule checker, the simulator on paper, and ``StageExecutor``, the base of the executors:
read it first). Run: ``workbook run pp_overlap``; grade: ``workbook grade --lab pp_overlap``;
compare the variants: ``workbook bench pp_overlap``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from workbook.pipeline_parallel import B, F, StageExecutor, simulate


# --------------------------------------------------------------------------- 1. schedules
def gpipe(p: int, m: int, stage: int) -> list[tuple]:
    """Stage ``stage``'s actions (of ``p`` stages, ``m`` micro-batches) under GPipe.

    Lesson 10, section 2 ("Schedules as data"). Returns the stage's list of actions, each a
    pair: the kind, the string F for a forward or B for a backward (the family exports both as
    constants), and the index of the micro-batch. Every micro-batch's forward and backward exactly
    once, in GPipe's order, micro-batches taken in the order they entered. The family's schedule
    checker must accept the stages' lists together."""
    raise NotImplementedError("not implemented yet: pp_overlap.gpipe")


def one_f_one_b(p: int, m: int, stage: int) -> list[tuple]:
    """Stage ``stage``'s actions (of ``p`` stages, ``m`` micro-batches) under 1F1B.

    Lesson 10, section 2 ("Schedules as data") and "What 1F1B buys: activations in flight". The
    same action format as ``gpipe``, for PipeDream-Flush, the schedule Megatron-LM and NeMo run: a
    fill of forwards, a steady state where forwards and backwards alternate, a drain of the
    backwards left. Contract: every micro-batch's forward and backward once, each forward before
    its backward; micro-batches leave each pass in the order they entered it; at most ``p -
    stage`` micro-batches in flight on the stage (forward run, backward not yet), never more
    than it needs to keep the stages after it busy; the stages' lists together cannot deadlock
    (lesson 10, section 3, "A schedule that cannot finish"). Any ``m >= 1``, also ``m < p``."""
    raise NotImplementedError("not implemented yet: pp_overlap.one_f_one_b")


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}


def all_stages(schedule, p: int, m: int) -> list[list[tuple]]:
    """Every stage's actions: what ``workbook.pipeline_parallel.check_schedule`` and ``simulate`` read."""
    return [schedule(p, m, s) for s in range(p)]


# --------------------------------------------------------------------------- 2. blocking p2p
class BlockingExecutor(StageExecutor):
    """One stage's forward and backward steps on its rank, each transfer waited for before the
    stage goes on. Lesson 10, section 3 ("Two blocking sends") and section 5 ("On your ranks").

    ``StageExecutor.step`` (given; read it) calls the steps in the order of the stage's actions
    and gives you the micro-batches, the neighbours, the position of the running action, and
    which peer and buffer each action receives from. Contract:

    * forward of micro-batch ``i``: its input is the micro-batch's tokens on the first stage,
      else the activation ``[b, S, H]`` the previous stage sent for it; the stage's output goes to
      the next stage; on the last stage the output becomes the micro-batch's loss (the stage
      module's own loss method, which scales it so that the micro-batches' losses add up to the
      batch's mean loss), recorded in the list of losses the base class sums and returns;
    * backward of micro-batch ``i``: the last stage backpropagates its loss, every other stage the
      gradient of its output that the next stage sent; the gradient of the stage's input goes
      back to the previous stage; after the step every parameter's gradient equals single-device
      training on the whole batch (fp64, 2 and 4 stages);
    * traffic: one activation per micro-batch to the next stage, one gradient of the same shape
      back, nothing else (counted from the trace);
    * no deadlock with gloo or NCCL, whose send returns only once the peer has posted the matching
      receive: in 1F1B's steady state two neighbours send to each other at the same moment.
      Only point-to-point ops, no collectives."""

    def exchange(self, tensor, peer) -> None:
        """After an action: send ``tensor`` to rank ``peer`` (``tensor`` None: nothing to send)
        and receive the input of the stage's *next* action, if it has one, so that the next
        action finds it; return only when both transfers are complete. Must not deadlock with the
        neighbour doing the same at the same moment (lesson 10, "Two blocking sends")."""
        raise NotImplementedError("not implemented yet: pp_overlap.BlockingExecutor.exchange")

    def take_received(self) -> torch.Tensor:
        """The tensor the running action receives: the one the previous ``exchange`` already
        brought in, or, for the stage's first action that receives anything (no exchange ran
        before it), received now."""
        raise NotImplementedError("not implemented yet: pp_overlap.BlockingExecutor.take_received")

    def forward_step(self, i: int) -> None:
        """Micro-batch ``i``'s forward on this stage, then its transfers (the class's contract)."""
        raise NotImplementedError("not implemented yet: pp_overlap.BlockingExecutor.forward_step")

    def backward_step(self, i: int) -> None:
        """Micro-batch ``i``'s backward on this stage, then its transfers (the class's contract)."""
        raise NotImplementedError("not implemented yet: pp_overlap.BlockingExecutor.backward_step")

    def step(self, tokens, targets, actions):
        """The base class's training step, anything this executor keeps between actions reset
        first (a runner takes several steps)."""
        self.inbox = None
        return super().step(tokens, targets, actions)


# --------------------------------------------------------------------------- 3. overlapped p2p
class OverlappedExecutor(BlockingExecutor):
    """The blocking executor's steps with the transfers hidden. Lesson 10, section 4 ("What the
    transfers cost, on paper") and section 5 ("The trace, and the hidden share").

    Contract: the same numbers and the same traffic as ``BlockingExecutor``; and on the link,
    (a) the input of every action but the stage's first is already on its way while the action
    before it computes, and (b) no send is waited for until the stage's last action is done
    (``finish``, which ``StageExecutor.step`` calls after it). So only the first receive (nothing
    computes before it) and the last send are exposed. Receives from one peer must be posted in
    the order their actions run: gloo hands a peer's messages to the receives in the order they
    were posted. Every transfer is waited for before the step returns. The grader reads this
    structure from the link's log of one step on 2 stages, then asks for a share of the steady
    state's link time hidden behind compute (lesson 10, "The trace, and the hidden share")."""

    def post_receive(self, k: int) -> None:
        """Post, without waiting, the receive of the stage's action ``k`` (if that action
        receives anything and its receive is not posted yet), and keep it for when action
        ``k`` runs."""
        raise NotImplementedError("not implemented yet: pp_overlap.OverlappedExecutor.post_receive")

    def prefetch(self) -> None:
        """At the start of every action: make sure the running action's receive and the next
        action's receive are both posted, in the order the actions run (the class's contract)."""
        raise NotImplementedError("not implemented yet: pp_overlap.OverlappedExecutor.prefetch")

    def take_received(self) -> torch.Tensor:
        """The running action's input, once it has arrived (its receive was posted earlier)."""
        raise NotImplementedError("not implemented yet: pp_overlap.OverlappedExecutor.take_received")

    def exchange(self, tensor, peer) -> None:
        """After an action: send ``tensor`` to ``peer`` (None: nothing to send) without waiting;
        the next action's receive is already posted (the class's contract)."""
        raise NotImplementedError("not implemented yet: pp_overlap.OverlappedExecutor.exchange")

    def finish(self) -> None:
        """After the stage's last action: every send still in flight has completed."""
        raise NotImplementedError("not implemented yet: pp_overlap.OverlappedExecutor.finish")

    def forward_step(self, i: int) -> None:
        """Micro-batch ``i``'s forward, computed as the blocking executor's, the receives posted
        as the class's contract asks before it computes."""
        self.prefetch()
        super().forward_step(i)

    def backward_step(self, i: int) -> None:
        """Micro-batch ``i``'s backward, the same way."""
        self.prefetch()
        super().backward_step(i)

    def step(self, tokens, targets, actions):
        """The base class's training step, no receive posted and no send kept from an earlier
        step."""
        self.receives, self.sends = {}, []
        return super().step(tokens, targets, actions)


EXECUTORS = {"blocking": BlockingExecutor, "overlapped": OverlappedExecutor}
VARIANTS = {"gpipe": ("gpipe", "blocking"), "1f1b": ("1f1b", "blocking"),
            "1f1b_overlap": ("1f1b", "overlapped")}


# --------------------------------------------------------------------------- 4. prediction
def predict_step_ms(link, p: int, m: int, shape: tuple, itemsize: int, t_fwd_ms: float,
                    t_bwd_ms: float) -> float:
    """Predict, before running it, the step time in ms of your 1F1B schedule with overlapped p2p
    (``OverlappedExecutor``) on ``p`` stages and ``m`` micro-batches, on the simulated ``link``.

    Lesson 10, section 4 ("What the transfers cost, on paper" and "Predicting your step").

    * ``link``: a ``workbook.link.cost_model.Link``, the simulated link the step runs on; its
      alpha-beta figures are the latency of one operation in seconds and the bandwidth in bytes
      per second;
    * ``shape``: the activation that crosses a stage boundary, three sizes (rows, sequence
      length, hidden size), of elements of ``itemsize`` bytes;
    * ``t_fwd_ms`` / ``t_bwd_ms``: the measured compute of one micro-batch's forward / backward
      on one stage.

    Returns the step time in ms of the paper model of section 4: a stage runs its actions in
    order, each as soon as the stage is free and its input has arrived; a tensor arrives one
    transfer time after the action that made it ends; sends never block. The grader compares it
    with the model's value on two pipelines and two links; ``workbook run pp_overlap`` prints
    it beside the model and the measured step."""
    raise NotImplementedError("not implemented yet: pp_overlap.predict_step_ms")


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
