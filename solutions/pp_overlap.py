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
    ### BEGIN SOLUTION
    ### hint 1: GPipe keeps the stage's forwards and its backwards apart (lesson 10, section 2, "Schedules as data").
    ### hint 2: all the forwards first, in micro-batch order, then all the backwards, in the same order; the stage index plays no part.
    ### hint 3: a list of ("F", i) for every micro-batch, then ("B", i) for every micro-batch, both in order 0..m-1
    return [(F, i) for i in range(m)] + [(B, i) for i in range(m)]
    ### END SOLUTION


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
    ### BEGIN SOLUTION
    ### hint 1: the fill must feed every stage behind this one before its first backward can come back (lesson 10, section 2, "Schedules as data", and section 3, "Deadlock").
    ### hint 2: count the warm-up forwards from the stages after this one (the last stage has none; never more than m); then pair the next forward with the oldest backward until the forwards run out; then the backwards left, oldest first.
    ### hint 3: w = min(p - 1 - stage, m) forwards F(0)..F(w-1); then for j in range(m - w): F(w + j), B(j); then the backwards B(m - w)..B(m - 1)
    warmup = min(p - 1 - stage, m)
    actions = [(F, i) for i in range(warmup)]
    for j in range(m - warmup):
        actions += [(F, warmup + j), (B, j)]
    return actions + [(B, j) for j in range(m - warmup, m)]
    ### END SOLUTION


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}


def all_stages(schedule, p: int, m: int) -> list[list[tuple]]:
    """Every stage's actions: what ``workbook.pipeline_parallel.check_schedule`` and ``simulate`` read."""
    return [schedule(p, m, s) for s in range(p)]


# --------------------------------------------------------------------------- 2. blocking p2p
### BEGIN CHALLENGE: BlockingExecutor, the whole class (one stage's forward and backward steps, blocking p2p)
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
        ### BEGIN SOLUTION
        ### hint 1: posting the send and the next receive together, then waiting, is what Megatron-LM's paired exchange does (lesson 10, section 3, "Two blocking sends").
        ### hint 2: start the send without waiting (if there is a tensor); ask the base class what the next action receives and, if anything, start that receive into a fresh buffer you keep for it; then wait for everything you started.
        ### hint 3: works = [dist.isend(tensor.detach().contiguous(), peer)] if there is a tensor; nxt = self.receive_for(self.position + 1); if nxt: keep its buffer in self.inbox and add dist.irecv(buffer, src); wait for every work
        works = [] if tensor is None else [dist.isend(tensor.detach().contiguous(), peer)]
        nxt = self.receive_for(self.position + 1)
        if nxt is not None:
            src, self.inbox = nxt
            works.append(dist.irecv(self.inbox, src))
        for work in works:
            work.wait()
        ### END SOLUTION

    def take_received(self) -> torch.Tensor:
        """The tensor the running action receives: the one the previous ``exchange`` already
        brought in, or, for the stage's first action that receives anything (no exchange ran
        before it), received now."""
        ### BEGIN SOLUTION
        ### hint 1: every action's input arrives during the exchange after the action before it, except the very first one (lesson 10, section 5).
        ### hint 2: if nothing is waiting from the last exchange, receive this action's input now (blocking), from the peer and into the buffer the base class names; otherwise hand over what the exchange kept and forget it.
        ### hint 3: if self.inbox is None: src, buffer = self.receive_for(self.position) and dist.recv(buffer, src); else take self.inbox (and set it to None)
        if self.inbox is None:
            src, buffer = self.receive_for(self.position)
            dist.recv(buffer, src)
            return buffer
        buffer, self.inbox = self.inbox, None
        return buffer
        ### END SOLUTION

    def forward_step(self, i: int) -> None:
        """Micro-batch ``i``'s forward on this stage, then its transfers (the class's contract)."""
        ### BEGIN SOLUTION
        ### hint 1: a stage's forward is the model's forward cut at the stage boundary; the input must track its gradient so the backward can send it back (lesson 10, section 1, and the class docstring).
        ### hint 2: take the input (the tokens on the first stage, else the received activation, made to require a gradient); run the stage; on the last stage turn the output into the micro-batch's loss and record it; keep input and output for the backward; then exchange, sending the output unless this is the last stage.
        ### hint 3: x: the tokens self.batches[i][0] on stage 0, else self.take_received().requires_grad_(); out = self.stage(x); the last stage: out = self.stage.loss(out, targets, self.m), appended detached to self.losses; keep x and out (self.inputs / self.outputs); self.exchange(out, self.next) (None on the last stage)
        x = self.batches[i][0] if self.prev is None else self.take_received().requires_grad_()
        out = self.stage(x)                                   # [b, S, H] (last stage: [b, S, V])
        if self.next is None:
            out = self.stage.loss(out, self.batches[i][1], self.m)
            self.losses.append(out.detach())
        self.inputs[i], self.outputs[i] = x, out
        self.exchange(out if self.next is not None else None, self.next)
        ### END SOLUTION

    def backward_step(self, i: int) -> None:
        """Micro-batch ``i``'s backward on this stage, then its transfers (the class's contract)."""
        ### BEGIN SOLUTION
        ### hint 1: the backward of a stage is driven by the gradient of its output, and produces the gradient of its input for the stage before (lesson 10, section 1).
        ### hint 2: take back what the forward of this micro-batch kept; backpropagate (the loss itself on the last stage, else the received gradient); then exchange, sending the input's gradient unless this is the first stage.
        ### hint 3: pop micro-batch i's input and output; out.backward() on the last stage, else out.backward(self.take_received()); then self.exchange(x.grad, self.prev) (None on stage 0)
        x, out = self.inputs.pop(i), self.outputs.pop(i)
        out.backward() if self.next is None else out.backward(self.take_received())
        self.exchange(x.grad if self.prev is not None else None, self.prev)
        ### END SOLUTION

    def step(self, tokens, targets, actions):
        """The base class's training step, anything this executor keeps between actions reset
        first (a runner takes several steps)."""
        self.inbox = None
        return super().step(tokens, targets, actions)
### END CHALLENGE


# --------------------------------------------------------------------------- 3. overlapped p2p
### BEGIN CHALLENGE: OverlappedExecutor, the whole class (the steady state's p2p hidden behind compute)
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
        ### BEGIN SOLUTION
        ### hint 1: a receive posted early travels while the stage computes; each one is posted once and found again by its action (lesson 10, section 4).
        ### hint 2: if action k's receive is already posted, stop; else ask the base class what action k receives and, if anything, start that receive without waiting and remember its buffer and its handle under k.
        ### hint 3: skip k already in self.receives; nxt = self.receive_for(k); if nxt: src, buffer = nxt and self.receives[k] = (buffer, dist.irecv(buffer, src))
        if k in self.receives:
            return
        nxt = self.receive_for(k)
        if nxt is not None:
            src, buffer = nxt
            self.receives[k] = (buffer, dist.irecv(buffer, src))
        ### END SOLUTION

    def prefetch(self) -> None:
        """At the start of every action: make sure the running action's receive and the next
        action's receive are both posted, in the order the actions run (the class's contract)."""
        ### BEGIN SOLUTION
        ### hint 1: posting one action ahead is what lets the next input travel while this action computes (lesson 10, section 5, "On your ranks").
        ### hint 2: post the receive of the running action first (a no-op when it was posted during the previous action), then the receive of the action after it.
        ### hint 3: self.post_receive(self.position), then self.post_receive(self.position + 1)
        self.post_receive(self.position)
        self.post_receive(self.position + 1)
        ### END SOLUTION

    def take_received(self) -> torch.Tensor:
        """The running action's input, once it has arrived (its receive was posted earlier)."""
        ### BEGIN SOLUTION
        ### hint 1: the receive was posted an action ago; only now is its data needed.
        ### hint 2: take the running action's posted receive out of what you kept, wait for it, hand over its buffer.
        ### hint 3: pop (buffer, work) of self.position from self.receives; wait on the work; return the buffer
        buffer, work = self.receives.pop(self.position)
        work.wait()
        return buffer
        ### END SOLUTION

    def exchange(self, tensor, peer) -> None:
        """After an action: send ``tensor`` to ``peer`` (None: nothing to send) without waiting;
        the next action's receive is already posted (the class's contract)."""
        ### BEGIN SOLUTION
        ### hint 1: a send left in flight costs the stage nothing; its buffer must stay alive and untouched until it is waited for (lesson 10, section 5).
        ### hint 2: if there is a tensor, start its send without waiting and keep both the tensor sent and the handle until the step ends.
        ### hint 3: only the send: dist.isend the detached, contiguous tensor, kept with its work in self.sends; no wait
        if tensor is not None:
            tensor = tensor.detach().contiguous()
            self.sends.append((tensor, dist.isend(tensor, peer)))
        ### END SOLUTION

    def finish(self) -> None:
        """After the stage's last action: every send still in flight has completed."""
        ### BEGIN SOLUTION
        ### hint 1: a send's buffer may be read until its wait returns, so the step ends with the sends done.
        ### hint 2: wait for every send kept during the step, then forget them.
        ### hint 3: wait for every work in self.sends, then empty it
        for _, work in self.sends:
            work.wait()
        self.sends = []
        ### END SOLUTION

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
### END CHALLENGE


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
    ### BEGIN SOLUTION
    ### hint 1: two parts: the time of one transfer on the alpha-beta link, then the step of your schedule played on paper with it (lesson 10, section 4, "Predicting your step").
    ### hint 2: one transfer costs the link's latency plus the bytes of one activation (rows x seq x hidden elements of itemsize bytes) over its bandwidth, converted from seconds to ms (mind all three: the latency, bytes not elements, the units); then play every stage's 1F1B actions with the forward, backward and transfer times as the paper model of section 4 (simulate) does, and read the step; on two stages only, the play gives the closed form (m + 1)(t_f + t_b) + 2 ceil(m/2) c.
    ### hint 3: c_ms = 1e3 * (link.latency_s + rows * seq * hidden * itemsize / link.bandwidth_Bps); return simulate(all_stages(one_f_one_b, p, m), t_fwd_ms, t_bwd_ms, c_ms).step
    rows, seq, hidden = shape
    c_ms = 1e3 * (link.latency_s + rows * seq * hidden * itemsize / link.bandwidth_Bps)
    return simulate(all_stages(one_f_one_b, p, m), t_fwd_ms, t_bwd_ms, c_ms).step
    ### END SOLUTION


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
