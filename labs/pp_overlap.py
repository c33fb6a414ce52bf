# Generated from solutions/pp_overlap.py by `workbook assign`: this is your file to edit.
# Replace each `raise NotImplementedError` with your code, then grade it with
#     workbook grade --lab pp_overlap
#
# Your tasks (30 pts in all):
#   1. gpipe (2 pts): Stage `stage`'s actions under GPipe: the `m` forwards in micro-batch order,
#      then the `m` backwards in the same order.
#   2. one_f_one_b (5 pts): Stage `stage`'s actions under 1F1B (PipeDream-Flush): a few forwards to
#      fill the pipeline, then one forward and one backward in turn, then the drain.
#   3. BlockingExecutor.exchange, .take_received, .forward_step and .backward_step (10 pts): One
#      stage's steps, each transfer waited for at once.
#   4. OverlappedExecutor.post_receive, .prefetch, .take_received, .exchange and .finish (13 pts):
#      The same steps, the transfers hidden: at the start of action k the receive that action k + 1
#      needs is posted, so its data travels while action k computes; a send is posted with `isend`
#      and waited for only in `finish`, after the last action.
"""Lab `pp_overlap`: pipeline parallelism, its point-to-point traffic hidden in the steady state.

Lesson 10 (``lessons/10_pp_overlap.py``) explains it. Rank s holds stage s, a run of consecutive
layers of the reference model; the batch is cut into ``m`` micro-batches that flow forward
through the stages and back. You write, in order:

1. the schedules, as pure functions graded at once without ranks: ``gpipe`` (every forward, then
   every backward: Huang et al. 2019, arXiv 1811.06965) and ``one_f_one_b`` (a few forwards to
   fill the pipeline, then one forward and one backward in turn, then the drain: PipeDream-Flush,
   Narayanan et al. 2021, arXiv 2104.04473); both idle ``(p - 1) / (m + p - 1)`` of the time, but
   1F1B keeps at most ``p - s`` micro-batches' activations on stage s, not ``m``;
2. ``BlockingExecutor``: one stage's forward and backward steps, every transfer waited for as
   soon as it is posted (a send and the next receive posted together, or neighbours would wait
   for each other for ever);
3. ``OverlappedExecutor``: the receive of the next action's input posted *before* the current
   action computes, and every send left in flight (``isend``) until the step ends, so the
   steady state's transfers travel while the stage computes (what NeMo does by default).

Given pieces: ``workbook/pipeline.py`` (stages, micro-batches, ``check_schedule``, ``simulate``,
``StageExecutor``). Run: ``workbook run pp_overlap``; grade: ``workbook grade --lab
pp_overlap``; compare: ``workbook bench pp_overlap``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from workbook.pipeline_parallel import B, F, StageExecutor


# --------------------------------------------------------------------------- 1. schedules
def gpipe(p: int, m: int, stage: int) -> list[tuple]:
    """Stage ``stage``'s actions under GPipe: the ``m`` forwards in micro-batch order, then
    the ``m`` backwards in the same order. Stage s keeps all ``m`` micro-batches' activations
    until its backward pass starts."""
    # TODO: a list of ("F", i) for every micro-batch, then ("B", i) for every micro-batch, both in
    #       order 0..m-1
    raise NotImplementedError("not implemented yet: pp_overlap.gpipe")


def one_f_one_b(p: int, m: int, stage: int) -> list[tuple]:
    """Stage ``stage``'s actions under 1F1B (PipeDream-Flush): a few forwards to fill the
    pipeline, then one forward and one backward in turn, then the drain.

    * warm-up: ``w = min(p - 1 - stage, m)`` forwards, just enough to fill the stages after it
      (the last stage starts its first backward right after its first forward);
    * steady state: ``m - w`` pairs ``F(w + j), B(j)``: one forward, then the oldest backward;
    * cool-down: the ``w`` backwards left, oldest first.

    Micro-batches enter every pass in order 0, 1, ..., so they leave it in the same order."""
    # TODO: warm-up forwards F(0)..F(w-1); then for j in range(m - w): F(w + j), B(j); then the
    #       backwards B(m - w)..B(m - 1)
    raise NotImplementedError("not implemented yet: pp_overlap.one_f_one_b")


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}


def all_stages(schedule, p: int, m: int) -> list[list[tuple]]:
    """Every stage's actions: what ``workbook.pipeline_parallel.check_schedule`` and ``simulate`` read."""
    return [schedule(p, m, s) for s in range(p)]


# --------------------------------------------------------------------------- 2. blocking p2p
class BlockingExecutor(StageExecutor):
    """One stage's steps, each transfer waited for at once.

    Forward of micro-batch i: take the input (stage 0: the tokens; else the received activation
    ``[b, S, H]``), run ``self.stage``, keep input and output for the backward (the last stage
    keeps the loss, ``self.stage.loss(logits, targets, self.m)``, and appends it to
    ``self.losses``), then ``exchange``: send the output to ``self.next``. Backward of
    micro-batch i: the last stage backpropagates its loss, every other stage the received
    gradient of its output; then ``exchange``: send the input's gradient to ``self.prev``.

    Why ``exchange`` sends *and* receives: gloo's (and NCCL's) send returns only once the peer
    has posted the matching receive. In 1F1B's steady state two neighbours send to each other at
    the same moment (stage s its activation, stage s + 1 a gradient): two blocking sends would
    wait for each other for ever. So after each action a stage posts its send and the receive
    of its *next* action together, then waits for both (Megatron's
    ``send_forward_recv_backward``)."""

    def exchange(self, tensor, peer) -> None:
        """Send ``tensor`` to ``peer`` (None: nothing to send) and receive the next action's
        input (``self.receive_for(self.position + 1)``) into ``self.inbox``: both posted, then
        both waited for."""
        # TODO: works = [dist.isend(tensor.detach().contiguous(), peer)] if there is a tensor;
        #       nxt = self.receive_for(self.position + 1); if nxt: keep its buffer in self.inbox
        #       and add dist.irecv(buffer, src); wait for every work
        raise NotImplementedError("not implemented yet: pp_overlap.BlockingExecutor.exchange")

    def take_received(self) -> torch.Tensor:
        """This action's received tensor: the one ``exchange`` left in ``self.inbox``, or, for
        the first action (no exchange before it), received now."""
        # TODO: if self.inbox is None: src, buffer = self.receive_for(self.position) and
        #       dist.recv(buffer, src); else take self.inbox (and set it to None)
        raise NotImplementedError("not implemented yet: pp_overlap.BlockingExecutor.take_received")

    def forward_step(self, i: int) -> None:
        # TODO: x: the tokens self.batches[i][0] on stage 0, else
        #       self.take_received().requires_grad_(); out = self.stage(x); the last stage turns
        #       out into the loss (self.losses gets it); keep x and out
        #       (self.inputs / self.outputs); self.exchange(out, self.next) (None on the last
        #       stage)
        raise NotImplementedError("not implemented yet: pp_overlap.BlockingExecutor.forward_step")

    def backward_step(self, i: int) -> None:
        # TODO: pop micro-batch i's input and output; out.backward() on the last stage, else
        #       out.backward(self.take_received()); then self.exchange(x.grad, self.prev) (None on
        #       stage 0)
        raise NotImplementedError("not implemented yet: pp_overlap.BlockingExecutor.backward_step")

    def step(self, tokens, targets, actions):
        self.inbox = None
        return super().step(tokens, targets, actions)


# --------------------------------------------------------------------------- 3. overlapped p2p
class OverlappedExecutor(BlockingExecutor):
    """The same steps, the transfers hidden: at the start of action k the receive that action
    k + 1 needs is posted, so its data travels while action k computes; a send is posted with
    ``isend`` and waited for only in ``finish``, after the last action. Only the first receive
    (nothing computes before it) and the last send stay exposed."""

    def post_receive(self, k: int) -> None:
        """Post, without waiting, action ``k``'s receive (if it has one and it is not posted
        yet); keep ``(buffer, work)`` in ``self.receives[k]``."""
        # TODO: skip k already in self.receives; nxt = self.receive_for(k); if nxt: src,
        #       buffer = nxt and self.receives[k] = (buffer, dist.irecv(buffer, src))
        raise NotImplementedError("not implemented yet: pp_overlap.OverlappedExecutor.post_receive")

    def prefetch(self) -> None:
        """At the start of every action: this action's receive (a no-op once prefetched), then
        the next one's, in that order: gloo hands a peer's messages to the receives in the order
        they were posted."""
        # TODO: self.post_receive(self.position), then self.post_receive(self.position + 1)
        raise NotImplementedError("not implemented yet: pp_overlap.OverlappedExecutor.prefetch")

    def take_received(self) -> torch.Tensor:
        # TODO: pop (buffer, work) of self.position from self.receives; wait on the work; return
        #       the buffer
        raise NotImplementedError("not implemented yet: pp_overlap.OverlappedExecutor.take_received")

    def exchange(self, tensor, peer) -> None:
        # TODO: only the send: dist.isend the detached, contiguous tensor, kept with its work in
        #       self.sends; no wait (the next receive is already posted)
        raise NotImplementedError("not implemented yet: pp_overlap.OverlappedExecutor.exchange")

    def finish(self) -> None:
        # TODO: wait for every send in self.sends, then empty it
        raise NotImplementedError("not implemented yet: pp_overlap.OverlappedExecutor.finish")

    def forward_step(self, i: int) -> None:
        self.prefetch()
        super().forward_step(i)

    def backward_step(self, i: int) -> None:
        self.prefetch()
        super().backward_step(i)

    def step(self, tokens, targets, actions):
        self.receives, self.sends = {}, []
        return super().step(tokens, targets, actions)


EXECUTORS = {"blocking": BlockingExecutor, "overlapped": OverlappedExecutor}
VARIANTS = {"gpipe": ("gpipe", "blocking"), "1f1b": ("1f1b", "blocking"),
            "1f1b_overlap": ("1f1b", "overlapped")}


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
