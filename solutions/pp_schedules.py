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
    ### BEGIN SOLUTION
    ### hint 1: count the actions of the rank as one stream of v*m forwards and one of v*m backwards; the k-th of each decides its chunk by which group of p it is in (lesson 12, section 3, "Megatron's order").
    ### hint 2: check the shape; the warm-up is (v - 1)*p + 2*(p - 1 - rank) forwards (lab 10's p - 1 - rank when v is 1), capped at v*m; the k-th forward runs chunk (k // p) mod v and the k-th backward chunk v - 1 - (k // p) mod v, each chunk on its own next micro-batch; then warm-up forwards, pairs (next forward, next backward), the backwards left.
    ### hint 3: warm = min(v*m, (v-1)*p + 2*(p-1-rank) if v > 1 else p-1-rank); fwd(k) = (F, next_mb[F][c], c) with c = (k // p) % v, bwd(k) with c = v-1 - (k // p) % v; actions = fwd(0..warm-1), then for j in range(v*m - warm): fwd(warm + j), bwd(j); then bwd(v*m - warm .. v*m - 1)
    check_interleaved_shape(p, v, m)
    warm = min(v * m, (v - 1) * p + 2 * (p - 1 - rank) if v > 1 else p - 1 - rank)
    taken = {F: [0] * v, B: [0] * v}             # per kind, per chunk: micro-batches handed out

    def action(kind: str, k: int) -> tuple:
        c = (k // p) % v if kind == F else v - 1 - (k // p) % v
        taken[kind][c] += 1
        return (kind, taken[kind][c] - 1, c)

    actions = [action(F, k) for k in range(warm)]
    for j in range(v * m - warm):
        actions += [action(F, warm + j), action(B, j)]
    return actions + [action(B, j) for j in range(v * m - warm, v * m)]
    ### END SOLUTION


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
    ### BEGIN SOLUTION
    ### hint 1: start from 1F1B's stream of forwards and backwards and decide, after each backward, whether its rank can afford a W now (lesson 12, section 5, "ZB-H1: the drain filled").
    ### hint 2: the warm-up is one forward per later rank, p - 1 - rank (plus (v-1)*p when interleaved), capped at v*m; keep the B's done in a queue; rank r holds back its first r W's: after the j-th backward run the oldest waiting W if j >= rank; at the end run every W still waiting, oldest first (they fill the wait for the gradients of the ranks behind).
    ### hint 3: warm = min(v*m, (v-1)*p + p-1-rank); fwd/bwd chunks as in interleaved_1f1b; after each bwd(j): queue its (W, i, c), and if j >= rank append queue.popleft(); finally append the queue's rest
    if v > 1:
        check_interleaved_shape(p, v, m)
    warm = min(v * m, (v - 1) * p + p - 1 - rank)
    taken = {F: [0] * v, B: [0] * v}
    waiting: deque = deque()                      # (W, i, c) whose B has run, oldest first

    def action(kind: str, k: int) -> tuple:
        c = (k // p) % v if kind == F else v - 1 - (k // p) % v
        taken[kind][c] += 1
        return (kind, taken[kind][c] - 1, c)

    def backward(j: int) -> list[tuple]:
        b = action(B, j)
        waiting.append((W, b[1], b[2]))
        return [b, waiting.popleft()] if j >= rank else [b]

    actions = [action(F, k) for k in range(warm)]
    for j in range(v * m - warm):
        actions += [action(F, warm + j), *backward(j)]
    for j in range(v * m - warm, v * m):
        actions += backward(j)
    return actions + list(waiting)
    ### END SOLUTION


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
    ### BEGIN SOLUTION
    ### hint 1: follow one micro-batch down chunk 0 and back up chunk 1 to see why the upper ranks start chunk 1 sooner; the order is then a fixed pattern of counters (lesson 12, section 6, "The V").
    ### hint 2: keep per chunk the next micro-batch to forward, to backward (B) and to weight-update (W), for n = max(m, 2p - 1) micro-batches; warm-up: 2(p - rank) - 1 forwards of chunk 0, then rank pairs (F chunk 1, F chunk 0), then p - rank triples (F, B, W of chunk 1); steady, while forwards remain: (F, B, W of chunk 0, the F skipped once chunk 0's are done) then (F, B, W of chunk 1); drain: rank pairs (B chunk 0, B chunk 1), then p - rank pairs (B chunk 0, W chunk 0), then the W's left, chunk 1's first; drop every action whose micro-batch is m or more.
    ### hint 3: n = max(m, 2*p - 1); emit(kind, c) appends (kind, nxt[kind][c], c) and advances that counter; W's in the drain come from their own counters; at the end keep [a for a in actions if a[1] < m]
    if v != 2:
        raise ValueError(f"ZBV holds exactly 2 chunks per rank (a V), got v={v}: use v=2")
    n = max(m, 2 * p - 1)
    nxt = {F: [0, 0], B: [0, 0], W: [0, 0]}
    actions: list[tuple] = []

    def emit(*pattern: tuple) -> None:
        for kind, c in pattern:
            actions.append((kind, nxt[kind][c], c))
            nxt[kind][c] += 1

    emit(*[(F, 0)] * (2 * (p - rank) - 1))
    emit(*[(F, 1), (F, 0)] * rank)
    emit(*[(F, 1), (B, 1), (W, 1)] * (p - rank))
    while nxt[F][1] < nxt[F][0] or nxt[F][0] < n:
        emit(*([(F, 0)] if nxt[F][0] < n else []), (B, 0), (W, 0), (F, 1), (B, 1), (W, 1))
    emit(*[(B, 0), (B, 1)] * rank)
    emit(*[(B, 0), (W, 0)] * (p - rank))
    emit(*[(W, 1)] * (nxt[B][1] - nxt[W][1]))
    emit(*[(W, 0)] * (nxt[B][0] - nxt[W][0]))
    return [a for a in actions if a[1] < m]
    ### END SOLUTION


SCHEDULES = {"interleaved_1f1b": (interleaved_1f1b, INTERLEAVED), "zb_h1": (zb_h1, INTERLEAVED),
             "zbv": (zbv, V_SHAPE)}


def all_ranks(schedule, p: int, v: int, m: int) -> list[list[tuple]]:
    """Every rank's actions: what ``check_chunked_schedule`` and ``simulate_chunked`` read."""
    return [schedule(p, v, m, r) for r in range(p)]


# --------------------------------------------------------------------------- 4. the executor
### BEGIN CHALLENGE: OverlappedChunkedExecutor, the whole class (a rank's chunks, p2p hidden)
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
        ### BEGIN SOLUTION
        ### hint 1: a peer's messages fill its receives in the order they were posted, and a peer sends in its own action order, not yours (lesson 12, section 7, "On your ranks").
        ### hint 2: find which peer feeds action k and its place in that peer's order; post, in that order, every receive from the peer up to and including that place which is not posted yet, each into a fresh buffer, remembered under the position of the action it feeds.
        ### hint 3: if k not in self.arrival: return; q, n = self.arrival[k]; while self.posted.get(q, 0) <= n: j = self.arrivals[q][self.posted.get(q, 0)]; peer, buffer = self.receive_for(j); self.receives[j] = (buffer, dist.irecv(buffer, peer)); self.posted[q] = self.posted.get(q, 0) + 1
        if k is None or k not in self.arrival:
            return
        q, n = self.arrival[k]
        while self.posted.get(q, 0) <= n:
            j = self.arrivals[q][self.posted.get(q, 0)]
            peer, buffer = self.receive_for(j)
            self.receives[j] = (buffer, dist.irecv(buffer, peer))
            self.posted[q] = self.posted.get(q, 0) + 1
        ### END SOLUTION

    def prefetch(self) -> None:
        """At the start of a forward or backward: the running action's receive and that of the
        next action fed by another rank are both posted (the class's contract)."""
        ### BEGIN SOLUTION
        ### hint 1: posting one receiving action ahead lets its input travel while this action computes; W's and in-memory hand-overs receive nothing (lesson 12, section 7).
        ### hint 2: post the running action's receive (a no-op when it was posted earlier), then that of the next action whose input comes from another rank.
        ### hint 3: self.post_receive(self.position); self.post_receive(self.next_receiving(self.position))
        self.post_receive(self.position)
        self.post_receive(self.next_receiving(self.position))
        ### END SOLUTION

    def take_input(self) -> torch.Tensor:
        """The running action's input, once it is there: handed over in memory when its source
        is on this rank, else its posted receive, waited for now."""
        ### BEGIN SOLUTION
        ### hint 1: two ways in: the V's turn hands a tensor over on the same rank, everything else arrives by a receive posted earlier (lesson 12, section 7).
        ### hint 2: look up the running action's source; if it is this rank, take the tensor handed over for this action; else take this position's posted receive out of what you kept, wait for it and hand over its buffer.
        ### hint 3: a = self.actions[self.position]; if self.source(a)[0] == self.rank: return self.handed.pop(a); buffer, work = self.receives.pop(self.position); work.wait(); return buffer
        a = self.actions[self.position]
        if self.source(a)[0] == self.rank:
            return self.handed.pop(a)
        buffer, work = self.receives.pop(self.position)
        work.wait()
        return buffer
        ### END SOLUTION

    def send(self, tensor: torch.Tensor) -> None:
        """Deliver what the running action made to its destination: in memory on this rank,
        else a send not waited for (kept until ``finish``)."""
        ### BEGIN SOLUTION
        ### hint 1: a send left in flight costs nothing now, but its buffer must stay alive until it is waited for; a hand-over on the same rank needs no transfer at all (lesson 12, section 7).
        ### hint 2: detach the tensor; if the destination is on this rank, keep it under the destination's action; else start its send without waiting and keep the tensor and the handle for finish.
        ### hint 3: rank, b = self.destination(self.actions[self.position]); t = tensor.detach(); rank == self.rank: self.handed[b] = t; else t = t.contiguous() and self.sends.append((t, dist.isend(t, rank)))
        rank, b = self.destination(self.actions[self.position])
        tensor = tensor.detach()
        if rank == self.rank:
            self.handed[b] = tensor
        else:
            tensor = tensor.contiguous()
            self.sends.append((tensor, dist.isend(tensor, rank)))
        ### END SOLUTION

    def forward_step(self, i: int, c: int) -> None:
        """Micro-batch ``i``'s forward on chunk ``c``, then its output delivered (the class's
        contract)."""
        ### BEGIN SOLUTION
        ### hint 1: lab 10's forward step, on chunk c of this rank; the receives are posted before anything computes (lesson 12, section 7).
        ### hint 2: prefetch; the input is the tokens if the chunk holds stage 0, else the received input, made to require a gradient; run the chunk; on the last stage turn the output into the loss and record it, else send it; keep input and output for the backward.
        ### hint 3: self.prefetch(); chunk = self.chunks[c]; x = self.batches[i][0] if chunk.is_first else self.take_input().requires_grad_(); out = chunk(x); chunk.is_last: out = chunk.loss(out, self.batches[i][1], self.m), self.losses.append(out.detach()); else self.send(out); self.inputs[i, c], self.outputs[i, c] = x, out
        self.prefetch()
        chunk = self.chunks[c]
        x = self.batches[i][0] if chunk.is_first else self.take_input().requires_grad_()
        out = chunk(x)                                       # [b, S, H] (last stage: [b, S, V])
        if chunk.is_last:
            out = chunk.loss(out, self.batches[i][1], self.m)
            self.losses.append(out.detach())
        else:
            self.send(out)
        self.inputs[i, c], self.outputs[i, c] = x, out
        ### END SOLUTION

    def backward_step(self, i: int, c: int) -> None:
        """Micro-batch ``i``'s backward on chunk ``c`` (B: the input gradient; the base runs W),
        then the input's gradient delivered (the class's contract)."""
        ### BEGIN SOLUTION
        ### hint 1: lab 10's backward step; the split linears make it B alone, so you backpropagate as usual (lesson 12, sections 4 and 7).
        ### hint 2: prefetch; take back the micro-batch's input and output of this chunk; backpropagate the loss on the last stage, else the received gradient; send the input's gradient unless the chunk holds stage 0.
        ### hint 3: self.prefetch(); x, out = self.inputs.pop((i, c)), self.outputs.pop((i, c)); out.backward() if self.chunks[c].is_last else out.backward(self.take_input()); if not self.chunks[c].is_first: self.send(x.grad)
        self.prefetch()
        x, out = self.inputs.pop((i, c)), self.outputs.pop((i, c))
        out.backward() if self.chunks[c].is_last else out.backward(self.take_input())
        if not self.chunks[c].is_first:
            self.send(x.grad)                                # [b, S, H]
        ### END SOLUTION

    def finish(self) -> None:
        """After the rank's last action: every send still in flight has completed."""
        ### BEGIN SOLUTION
        ### hint 1: a send's buffer may be read until its wait returns, so the step ends with the sends done (lab 10, section 5).
        ### hint 2: wait for every send kept during the step, then forget them.
        ### hint 3: for _, work in self.sends: work.wait(); then self.sends = []
        for _, work in self.sends:
            work.wait()
        self.sends = []
        ### END SOLUTION

    def step(self, tokens, targets, schedules):
        """The base class's step, nothing kept from an earlier step: no receive posted or
        counted, no send in flight, nothing handed over."""
        self.receives, self.posted, self.sends, self.handed = {}, {}, [], {}
        return super().step(tokens, targets, schedules)
### END CHALLENGE


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
    ### BEGIN SOLUTION
    ### hint 1: three parts: the time of one transfer on the alpha-beta link, the cost of one chunk action, then your schedule played on paper with both (lesson 12, section 7, "Predict your step").
    ### hint 2: one transfer costs the link's latency plus the bytes of one activation (rows x seq x hidden elements of itemsize bytes) over its bandwidth, in ms; a chunk holds 1/v of a rank's layers, so each of its actions costs 1/v of the whole stage's; play every rank's actions of your schedule, with its own placement (SCHEDULES), in simulate_chunked with those costs and that transfer time, and read the step (the V's turn and an unsplit B are its business).
    ### hint 3: c_ms = 1e3 * (link.latency_s + rows * seq * hidden * itemsize / link.bandwidth_Bps); fn, placement = SCHEDULES[schedule]; return simulate_chunked(all_ranks(fn, p, v, m), p, v, placement, t_f=t_f_ms / v, t_b=t_b_ms / v, t_w=t_w_ms / v, t_p2p=c_ms).step
    rows, seq, hidden = shape
    c_ms = 1e3 * (link.latency_s + rows * seq * hidden * itemsize / link.bandwidth_Bps)
    fn, placement = SCHEDULES[schedule]
    return simulate_chunked(all_ranks(fn, p, v, m), p, v, placement, t_f=t_f_ms / v,
                            t_b=t_b_ms / v, t_w=t_w_ms / v, t_p2p=c_ms).step
    ### END SOLUTION
