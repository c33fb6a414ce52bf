"""A rank with ``v`` model chunks runs a chunked schedule: the given base of lab ``pp_schedules``.

Lab 10's ``StageExecutor`` ran one stage per rank. Here rank r holds ``v`` chunks (virtual
stages, lesson 12, section 2): chunk c is stage ``stage_index(r, c, p, placement)`` of the
``p * v`` stages of the reference model (``interleaved``: ``c p + r``, Narayanan et al. 2021,
arXiv 2104.04473; ``v``: r and ``2p - 1 - r``, Qi et al. 2023, arXiv 2401.10241, section 6),
and the rank runs its list of ``ChunkAction`` s (``virtual_stages``):

* ``F(i, c)``: micro-batch i's forward through chunk c; its input is the tokens on stage 0, else
  the activation ``[b, S, H]`` of stage s - 1; its output goes to stage s + 1, or becomes the
  micro-batch's loss on the last stage;
* ``B(i, c)``: the backward, driven by the loss on the last stage, else by the gradient of the
  output that stage s + 1 sent; the input's gradient goes to stage s - 1. In a *split* schedule
  (one with W's) B computes the input gradient only (``split_backward``); in an unsplit one the
  base runs the chunk's W right after it, in the same range, so B is the whole backward;
* ``W(i, c)``: the deferred weight gradients, given here (``weight_step``): no transfer.

Neighbouring stages on different ranks talk point-to-point; neighbours on the *same* rank (the
V's turn on rank p - 1: stages p - 1 and p) hand the tensor over in memory. gloo and NCCL give a
peer's messages to the receives posted for that peer in the order they were posted, so a rank
must post its receives from peer q in the order q *sends* them, which with chunks is not the
order the rank runs its actions (on 2 ranks, rank 0 gets both activations and gradients from
rank 1). ``step`` therefore takes every rank's schedule, checks it on paper first
(``check_chunked_schedule``: a bad one raises the same one-line ``ScheduleError`` on every rank
before any transfer), and works out, per peer, the order its messages arrive in (``arrivals``).

``step`` runs each action inside ``record_function`` ranges: the phase (``warmup``, ``steady``,
``cooldown``, as lab 10's ``phases`` counts them), then the action, ``F3.c1`` / ``B3.c1`` /
``W3.c1`` (kind, micro-batch, ``.c`` chunk), so the trace shows the schedule. The learner's part
(lab ``pp_schedules``, section 4) is the subclass's ``forward_step`` / ``backward_step`` and
its transfers; lesson 12, section 7 ("On your ranks"), explains it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function

from workbook.model import ModelConfig
from workbook.pipeline_parallel.pipeline_parallel import (B, F, PipelineStage, activation_shape,
                                                          micro_batches, phases)
from workbook.pipeline_parallel.split_backward import WeightGradStore, split_linears
from workbook.pipeline_parallel.virtual_stages import (INTERLEAVED, W, ChunkAction,
                                                       check_chunked_schedule, rank_and_chunk,
                                                       stage_index)


def action_name(a: ChunkAction) -> str:
    """The trace's name of an action: ``F3.c1`` is micro-batch 3's forward on chunk 1."""
    return f"{a.kind}{a.micro_batch}.c{a.chunk}"


def source_of(rank: int, a: ChunkAction, p: int, v: int, placement: str):
    """``(rank, action)`` that sends action ``a`` of rank ``rank`` its input: ``F`` gets stage
    s - 1's activation (from its ``F``), ``B`` stage s + 1's gradient (from its ``B``); None for
    ``W``, for ``F`` on stage 0 (tokens) and ``B`` on the last stage (the loss)."""
    s = stage_index(rank, a.chunk, p, placement)
    t = s - 1 if a.kind == F else s + 1 if a.kind == B else None
    if t is None or not 0 <= t < p * v:
        return None
    owner, chunk = rank_and_chunk(t, p, placement)
    return owner, ChunkAction(a.kind, a.micro_batch, chunk)


def destination_of(rank: int, a: ChunkAction, p: int, v: int, placement: str):
    """``(rank, action)`` that receives what action ``a`` of rank ``rank`` makes: ``F`` sends its
    activation to stage s + 1's ``F``, ``B`` its input gradient to stage s - 1's ``B``; None for
    ``W``, for ``F`` on the last stage (it makes the loss) and ``B`` on stage 0."""
    s = stage_index(rank, a.chunk, p, placement)
    t = s + 1 if a.kind == F else s - 1 if a.kind == B else None
    if t is None or not 0 <= t < p * v:
        return None
    owner, chunk = rank_and_chunk(t, p, placement)
    return owner, ChunkAction(a.kind, a.micro_batch, chunk)


class ChunkedExecutor:
    """Rank ``dist.get_rank()``'s ``v`` chunks of the reference model, running its chunked
    schedule (module docstring).

    ``step(tokens, targets, schedules)`` checks ``schedules`` (every rank's list, as
    ``check_chunked_schedule`` reads them), cuts the batch into ``m`` micro-batches, then calls
    ``forward_step(i, c)`` / ``backward_step(i, c)`` / ``weight_step(i, c)`` for each of this
    rank's actions inside its ranges, then ``finish()``; it returns the sum of the micro-batch
    losses (the batch's mean loss) on the rank that holds the last stage, else None. During a
    step, ``self.position`` is the running action's index in ``self.actions``."""

    def __init__(self, cfg: ModelConfig, m: int, v: int, placement: str = INTERLEAVED,
                 device=None):
        self.cfg, self.m, self.v, self.placement, self.device = cfg, m, v, placement, device
        self.rank, self.p = dist.get_rank(), dist.get_world_size()
        self.n_stages = self.p * v
        self.stage_of = [stage_index(self.rank, c, self.p, placement) for c in range(v)]
        self.chunks = nn.ModuleList(PipelineStage(cfg, s, self.n_stages, device)
                                    for s in self.stage_of)
        self.stores = [WeightGradStore() for _ in range(v)]
        for chunk, store in zip(self.chunks, self.stores):
            split_linears(chunk, store)
        self.loss_rank = rank_and_chunk(self.n_stages - 1, self.p, placement)[0]

    # ----------------------------------------------------------------------- who talks to whom
    def source(self, a: ChunkAction):
        """``(rank, action)`` sending action ``a`` of this rank its input, or None."""
        return source_of(self.rank, a, self.p, self.v, self.placement)

    def destination(self, a: ChunkAction):
        """``(rank, action)`` receiving what action ``a`` of this rank makes, or None."""
        return destination_of(self.rank, a, self.p, self.v, self.placement)

    def empty_activation(self) -> torch.Tensor:
        """A buffer for one micro-batch's activation or its gradient, ``[b, S, H]``."""
        return torch.empty(activation_shape(self.cfg, self.rows), dtype=self.cfg.torch_dtype,
                           device=self.device)

    def plan_receives(self, schedules) -> None:
        """``self.arrivals[q]``: the positions (in ``self.actions``) of this rank's actions whose
        input comes from peer q, in the order q sends them (q's own action order);
        ``self.arrival[k] = (q, n)``: action k's input is the n-th message from q. Actions fed
        in memory (same rank) or by nothing are in neither."""
        where = {a: k for k, a in enumerate(self.actions)}
        self.arrivals: dict = {}
        self.arrival: dict = {}
        for q, acts in enumerate(schedules):
            if q == self.rank:
                continue
            for b in map(ChunkAction._make, acts):
                dest = destination_of(q, b, self.p, self.v, self.placement)
                if dest is not None and dest[0] == self.rank:
                    k = where[dest[1]]
                    self.arrival[k] = (q, len(self.arrivals.setdefault(q, [])))
                    self.arrivals[q].append(k)

    def receive_for(self, k: int):
        """``(peer, buffer)`` for the message action ``k`` receives from another rank, or None
        (no such action, its input is made on this rank, or it has none)."""
        if k not in self.arrival:
            return None
        return self.arrival[k][0], self.empty_activation()

    def next_receiving(self, k: int):
        """The first action after ``k`` whose input comes from another rank, or None."""
        return next((j for j in range(k + 1, len(self.actions)) if j in self.arrival), None)

    # ----------------------------------------------------------------------- the step
    def step(self, tokens: torch.Tensor, targets: torch.Tensor, schedules):
        check_chunked_schedule(schedules, self.p, self.v, self.m, self.placement)
        self.actions = [ChunkAction(*a) for a in schedules[self.rank]]
        self.split = any(a[0] == W for acts in schedules for a in acts)
        self.batches = micro_batches(tokens, targets, self.m)
        self.rows = self.batches[0][0].shape[0]
        self.plan_receives(schedules)
        self.inputs: dict = {}          # (micro-batch, chunk) -> the chunk's input (kept for B)
        self.outputs: dict = {}         # (micro-batch, chunk) -> the chunk's output (or loss)
        self.losses: list = []
        self.chunks.zero_grad(set_to_none=True)
        pairs = [(a.kind, a.micro_batch) for a in self.actions]
        for k, (a, phase) in enumerate(zip(self.actions, phases(pairs))):
            self.position = k
            with record_function(phase), record_function(action_name(a)):
                if a.kind == F:
                    with self.stores[a.chunk].micro_batch(a.micro_batch):
                        self.forward_step(a.micro_batch, a.chunk)
                elif a.kind == B:
                    self.backward_step(a.micro_batch, a.chunk)
                    if not self.split:                   # unsplit: B is the whole backward
                        self.weight_step(a.micro_batch, a.chunk)
                else:
                    self.weight_step(a.micro_batch, a.chunk)
        self.finish()
        return sum(self.losses) if self.rank == self.loss_rank else None

    def weight_step(self, i: int, c: int) -> None:
        """W(i, c): chunk c's deferred weight gradients of micro-batch i (``split_backward``)."""
        self.stores[c].weight_grads(i)

    def forward_step(self, i: int, c: int) -> None:
        raise NotImplementedError

    def backward_step(self, i: int, c: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Runs after the last action (wait for what is still in flight)."""

    def named_grads(self) -> dict:
        """Every parameter of this rank's chunks: its gradient by its reference-model name."""
        out = {}
        for chunk in self.chunks:
            out.update(chunk.named_grads())
        return out
