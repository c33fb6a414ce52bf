# Generated from solutions/ep_overlap.py by `workbook assign` (level: standard): this is your file to edit.
# Replace each `raise NotImplementedError` with your code; check it with `workbook run ep_overlap`
# (or `workbook watch ep_overlap`). Stuck on task N? `workbook hint ep_overlap N`, one hint at a time.
#
# Your tasks (44 pts in all):
#    1. exchange_counts (2.1 pts): Tell every rank how many rows it will receive from this rank,
#       for each of its experts.
#    2. AllToAll.forward and .backward (1.6 pts): Applied to rows `x [N, H]`, the send and the
#       receive splits and a process group: the rows to every rank.
#    3. dispatch (2.1 pts): Send this rank's kept assignments to the ranks of their experts.
#    4. combine (2.1 pts): Bring the experts' outputs home, un-permute them and weight them by the
#       router.
#    5. ep_moe (2.1 pts): The MoE layer on this rank: `moe` is this rank's part (`local_moe`),
#       `x [..., H]` this rank's tokens.
#    6. prepare_dispatch (1 pt): `dispatch` up to the token exchange: the rows to send and the
#       plan, nothing sent yet.
#    7. StartAllToAll.forward and .backward (2.33 pts): `StartAllToAll.apply(x, pending)`: issue
#       `AllToAll`'s exchange of `x` with `pending`'s splits and return at once, with the buffer it
#       will fill; its handle stays on `pending` for `WaitAllToAll`.
#    8. WaitAllToAll.forward and .backward (2.33 pts): `WaitAllToAll.apply(buffer, pending)`: wait
#       for the exchange `StartAllToAll` issued and return the filled buffer (a view).
#    9. ep_moe_shared_overlap (2.33 pts): `ep_moe` with the shared expert computed while the
#       dispatch's tokens travel, and its backward while the dispatch's backward travels.
#   10. AllToAllThenWgrad.backward (4 pts): Applied to `AllToAll`'s four arguments and the store of
#       the experts' deferred weight gradients: `AllToAll`'s forward.
#   11. ep_moe_deferred_wgrad (4 pts): `ep_moe` whose backward computes the experts' weight
#       gradients while the dispatch's backward (the rows' gradients going home) travels.
#   12. two_batch_schedule (5 pts): The order of two micro-batches' actions through the layer in
#       `phase`, a pure function.
#   13. TwoBatchMoE.forward_action and .backward_action (13 pts): The layer on this rank, its
#       tokens cut into micro-batches A (the first half of the rows) and B (the second), run in a
#       schedule's order: `TwoBatchMoE(moe, group)(x)`.
"""Lab `ep_overlap`: mixture-of-experts expert parallelism, its all-to-all hidden.

Lesson 13 (``lessons/13_ep_overlap.py``) explains everything this lab builds. An MoE layer sends
each token to its top-k experts; under expert parallelism the ``E`` experts are spread over the
``ep`` ranks (expert e on rank ``e // (E / ep)``), each rank holding its own tokens, so every
layer moves tokens to their experts and the results back: two all-to-alls in the forward pass,
two in the backward. You build, in order:

1. ``exchange_counts``: how many rows each rank will receive, for each of its experts;
2. ``AllToAll``: the uneven all-to-all as an autograd op, its backward the same exchange reversed
   (so the backward of a dispatch is a combine, and the backward of a combine a dispatch);
3. ``dispatch`` and ``combine``: tokens sorted by expert, sent, regrouped for the local experts,
   and the results sent back, un-permuted and weighted by the router;
4. ``ep_moe``: the whole layer on one rank, equal to the single-device layer;
5. ``ep_moe_shared_overlap``: the shared expert computed while the dispatch travels, forward and
   backward (``StartAllToAll`` / ``WaitAllToAll``);
6. ``ep_moe_deferred_wgrad``: the experts' weight gradients computed while the dispatch's
   backward travels (``AllToAllThenWgrad``);
7. two micro-batches against each other: ``two_batch_schedule`` (a pure function, graded at once)
   and ``TwoBatchMoE``, the executor that runs a schedule on the ranks.

Given pieces: ``workbook/expert_parallel/expert_parallel.py`` (the placement, the token
bookkeeping, ``DispatchPlan``), ``deferred_wgrad.py`` (the experts' backward in two),
``two_batch.py`` (the two-micro-batch actions and the schedule check),
``two_batch_executor.py`` (what runs a schedule on the ranks, around your actions) and
``workbook/model/moe.py`` (the single-device layer: routing, capacity, the experts): read them
first.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from workbook.expert_parallel import (
    DispatchPlan,
    ExpertGradStore,
    MoE,
    TwoBatchExecutor,
    capacity_keep,
    expert_major_order,
    load_balancing_loss,
    rank_splits,
    route,
    run_experts,
    run_experts_deferred,
    sort_by_expert,
)


# --------------------------------------------------------------------------- 1. the counts
def exchange_counts(counts: torch.Tensor, group=None) -> torch.Tensor:
    """Tell every rank how many rows it will receive from this rank, for each of its experts.

    Lesson 13, section 2 ("Who sends what"). ``counts [E]`` (long): the rows this rank sends to
    each expert. Returns ``recv_counts [ep, E/ep]`` (long): row ``s`` is what rank ``s`` sends to
    each of this rank's experts, in expert order. One collective, on ``group``."""
    raise NotImplementedError("not implemented yet: ep_overlap.exchange_counts")


# --------------------------------------------------------------------------- 2. the autograd op
class AllToAll(torch.autograd.Function):
    """Applied to rows ``x [N, H]``, the send and the receive splits and a process group: the
    rows to every rank.

    Lesson 13, section 3 ("Dispatch and combine are each other's backward"). The first
    ``send_splits[0]`` rows go to rank 0, the next ``send_splits[1]`` to rank 1, ...; returns
    ``[sum(recv_splits), H]``, rank 0's rows first. Any split may be zero (a rank that receives
    nothing). Its backward sends each row's gradient back where the row came from: the same
    all-to-all with the two lists swapped."""

    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group):
        raise NotImplementedError("not implemented yet: ep_overlap.AllToAll.forward")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("not implemented yet: ep_overlap.AllToAll.backward")


# --------------------------------------------------------------------------- 3. dispatch, combine
def dispatch(x: torch.Tensor, experts: torch.Tensor, keep: torch.Tensor, num_experts: int,
             group=None) -> tuple[torch.Tensor, DispatchPlan]:
    """Send this rank's kept assignments to the ranks of their experts.

    Lesson 13, section 2 ("Who sends what") and section 3. ``x [T, H]`` this rank's tokens,
    ``experts [T, k]`` the router's choices, ``keep [T, k]`` the assignments inside the capacity.
    Returns the rows this rank's experts must process, expert-major (local expert 0's rows, from
    every source in rank order, then expert 1's, ...), and the ``DispatchPlan`` its combine
    needs. Two collectives: the counts, then the rows (uneven splits); dropped assignments never
    travel."""
    raise NotImplementedError("not implemented yet: ep_overlap.dispatch")


def combine(y: torch.Tensor, weights: torch.Tensor, plan: DispatchPlan, num_tokens: int,
            group=None) -> torch.Tensor:
    """Bring the experts' outputs home, un-permute them and weight them by the router.

    Lesson 13, section 3. ``y [M, H]`` the local experts' outputs in ``dispatch``'s expert-major
    order, ``weights [T, k]`` the router's weights (their gradient must reach the router),
    ``plan`` what ``dispatch`` returned. Returns ``[num_tokens, H]``: row ``t`` the sum over
    token t's kept assignments of weight times expert output (zero for a token with none)."""
    raise NotImplementedError("not implemented yet: ep_overlap.combine")


# --------------------------------------------------------------------------- 4. the layer
def ep_moe(moe: MoE, x: torch.Tensor, group=None) -> torch.Tensor:
    """The MoE layer on this rank: ``moe`` is this rank's part (``local_moe``), ``x [..., H]``
    this rank's tokens. Lesson 13, section 4 ("The layer, distributed").

    Contract: on every rank the output equals the single-device layer's rows for this rank's
    tokens, with ``groups = ep`` (this rank's tokens are one capacity group); so do the input's
    gradient and each local expert's; the router's (and the shared expert's) gradients, summed
    over the ranks, equal the single-device ones. ``moe.aux_loss`` is set to this rank's
    load-balancing loss (its own tokens)."""
    raise NotImplementedError("not implemented yet: ep_overlap.ep_moe")


# --------------------------------------------------------------------------- 5. shared-expert overlap
def prepare_dispatch(x: torch.Tensor, experts: torch.Tensor, keep: torch.Tensor, num_experts: int,
                     group=None) -> tuple[torch.Tensor, DispatchPlan]:
    """``dispatch`` up to the token exchange: the rows to send and the plan, nothing sent yet.

    Lesson 13, section 5 ("Hide it behind the shared expert"). Same arguments as ``dispatch``.
    Returns ``x``'s rows in the order they are sent (``[N, H]``, sorted by expert; their gradient
    reaches ``x``) and the ``DispatchPlan``. One collective: the counts."""
    raise NotImplementedError("not implemented yet: ep_overlap.prepare_dispatch")


class Pending:
    """One all-to-all in flight: its work handle (``work``, None when none is open), the buffer
    the backward's exchange fills (``buffer``), the splits of the forward exchange (``send``,
    ``recv``), its group and a name for the trace."""

    def __init__(self, name: str, send_splits, recv_splits, group=None):
        self.name, self.group = name, group
        self.send, self.recv = list(send_splits), list(recv_splits)
        self.work = self.buffer = None

    def wait(self, phase: str) -> None:
        """Wait for the open exchange (a range ``ep_wait:<name>.<phase>`` in the trace)."""
        if self.work is None:
            raise RuntimeError(f"no all-to-all {self.name!r} in flight to wait on ({phase})")
        with torch.profiler.record_function(f"ep_wait:{self.name}.{phase}"):
            self.work.wait()
        self.work = None


class StartAllToAll(torch.autograd.Function):
    """``StartAllToAll.apply(x, pending)``: issue ``AllToAll``'s exchange of ``x`` with
    ``pending``'s splits and return at once, with the buffer it will fill; its handle stays on
    ``pending`` for ``WaitAllToAll``. Lesson 13, section 5.

    Backward: ``WaitAllToAll``'s backward started the reverse exchange, its buffer and handle
    on ``pending``; wait for it, then pass that buffer on as ``x``'s gradient (the gradient
    handed to this backward is only a placeholder)."""

    @staticmethod
    def forward(ctx, x, pending):
        raise NotImplementedError("not implemented yet: ep_overlap.StartAllToAll.forward")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("not implemented yet: ep_overlap.StartAllToAll.backward")


class WaitAllToAll(torch.autograd.Function):
    """``WaitAllToAll.apply(buffer, pending)``: wait for the exchange ``StartAllToAll`` issued
    and return the filled buffer (a view). Lesson 13, section 5.

    Backward: *start* the reverse exchange of the incoming gradient (the splits swapped), keep its
    handle and its buffer on ``pending`` (``StartAllToAll``'s backward waits) and return the
    incoming gradient itself as a placeholder (it has the buffer's shape; nothing reads it)."""

    @staticmethod
    def forward(ctx, buffer, pending):
        raise NotImplementedError("not implemented yet: ep_overlap.WaitAllToAll.forward")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("not implemented yet: ep_overlap.WaitAllToAll.backward")


def ep_moe_shared_overlap(moe: MoE, x: torch.Tensor, group=None) -> torch.Tensor:
    """``ep_moe`` with the shared expert computed while the dispatch's tokens travel, and its
    backward while the dispatch's backward travels. Lesson 13, section 5.

    Contract: ``ep_moe``'s (the same outputs, gradients and ``aux_loss``); ``moe`` must have a
    shared expert (``ValueError`` otherwise). On the link, neither the dispatch's exchange nor
    its backward is waited on before the shared expert's matrix products ran."""
    if moe.shared is None:
        raise ValueError("ep_moe_shared_overlap needs a shared expert to hide the dispatch behind: "
                         "set MoEConfig(shared_expert=True), or use ep_moe")
    raise NotImplementedError("not implemented yet: ep_overlap.ep_moe_shared_overlap")


# --------------------------------------------------------------------------- 6. deferred wgrad
class AllToAllThenWgrad(torch.autograd.Function):
    """Applied to ``AllToAll``'s four arguments and the store of the experts' deferred weight
    gradients: ``AllToAll``'s forward. Lesson 13, section 6 ("Deferred weight gradients").

    Backward: start the reverse exchange without waiting, compute the experts' weight gradients
    waiting in the store while it travels, then wait and return it."""

    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group, store):
        ctx.store = store
        return AllToAll.forward(ctx, x, send_splits, recv_splits, group)

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("not implemented yet: ep_overlap.AllToAllThenWgrad.backward")


def ep_moe_deferred_wgrad(moe: MoE, x: torch.Tensor, group=None) -> torch.Tensor:
    """``ep_moe`` whose backward computes the experts' weight gradients while the dispatch's
    backward (the rows' gradients going home) travels. Lesson 13, section 6.

    Contract: ``ep_moe``'s (the same outputs, gradients and ``aux_loss``); once ``backward``
    returns, every local expert's gradient is in place. On the link, the dispatch's backward is
    not waited on before the weight gradients' products ran."""
    raise NotImplementedError("not implemented yet: ep_overlap.ep_moe_deferred_wgrad")


# --------------------------------------------------------------------------- 7. two micro-batches
def two_batch_schedule(phase: str, deferred_wgrad: bool = False) -> list[tuple]:
    """The order of two micro-batches' actions through the layer in ``phase``, a pure function.

    Lesson 13, section 7 ("Two micro-batches"). Actions are ``(kind, micro_batch, step)``
    tuples, listed with their dependencies in ``workbook/expert_parallel/two_batch.py``;
    ``deferred_wgrad`` adds a ``("compute", X, "wgrad")`` per micro-batch to the backward.
    Contract: ``check_schedule(two_batch_schedule(phase, d), phase, d)`` passes: every action
    once, dependencies first, and no transfer waited on while a compute that does not need it
    was ready and nothing had run since the transfer started. In a single layer, one transfer
    per pass has nothing to hide behind (the last of the forward, the first of the backward)."""
    raise NotImplementedError("not implemented yet: ep_overlap.two_batch_schedule")


class TwoBatchMoE(TwoBatchExecutor):
    """The layer on this rank, its tokens cut into micro-batches A (the first half of the rows)
    and B (the second), run in a schedule's order: ``TwoBatchMoE(moe, group)(x)``.

    Lesson 13, section 7. Contract: each micro-batch is its own capacity group, so the result
    equals the single-device layer with ``groups = 2 ep``; the output, the input's gradient and
    the parameters' gradients as in ``ep_moe``'s contract (no ``aux_loss``). The given
    ``TwoBatchExecutor`` (``workbook/expert_parallel/two_batch_executor.py``: read it first)
    runs your two action methods in the schedules' order, each piece of a micro-batch's layer in
    an autograd graph of its own, the pieces meeting at leaves across the exchanges."""

    def __init__(self, moe: MoE, group=None, deferred_wgrad: bool = False,
                 forward: list | None = None, backward: list | None = None):
        super().__init__(forward or two_batch_schedule("forward"),
                         backward or two_batch_schedule("backward", deferred_wgrad),
                         group, deferred_wgrad)
        self.moe = moe

    def forward_action(self, kind: str, mb: str, step: str) -> None:
        """Run one forward action of micro-batch ``mb`` (lesson 13, section 7). ``self.mb[mb]``
        holds its ``"x"`` (``[T/2, H]``, a leaf) and whatever earlier actions left there.

        * compute, router: route, keep (the micro-batch is one capacity group), prepare the
          dispatch, and the shared expert's output if there is one;
        * start, dispatch / start, combine: the executor's exchange of the rows to send / of the
          experts' outputs (back in source-major order);
        * wait, dispatch / wait, combine: the executor's wait; what arrived is a leaf of the next
          piece (its gradient is needed);
        * compute, experts: the local experts on the received rows, their weight gradients
          deferred in the executor's store, under the micro-batch's name, when it has one.

        After the combine's wait, ``self.mb[mb]["y"]`` is the micro-batch's output ``[T/2, H]``."""
        s, moe, E = self.mb[mb], self.moe, self.moe.moe.num_experts
        raise NotImplementedError("not implemented yet: ep_overlap.TwoBatchMoE.forward_action")

    def backward_action(self, kind: str, mb: str, step: str) -> None:
        """Run one backward action of micro-batch ``mb`` (lesson 13, section 7);
        ``self.mb[mb]["grad"]`` holds its output's gradient.

        * start, combine: the output's gradient through the combine's arithmetic (to the rows
          that arrived, the router weights, the shared output), then the executor's exchange of
          the rows' gradient to the experts (the dispatch's direction);
        * compute, experts: the experts' backward from the gradient that arrived;
        * start, dispatch: the executor's exchange of the received rows' gradient home;
        * compute, wgrad: the micro-batch's deferred weight gradients, from the store;
        * wait, combine / wait, dispatch: the executor's wait;
        * compute, router: the router's, the shared expert's and the input's gradients.

        After the last action, ``self.mb[mb]["x"]`` holds the input's gradient, and every
        parameter's gradient has been added to."""
        s = self.mb[mb]
        raise NotImplementedError("not implemented yet: ep_overlap.TwoBatchMoE.backward_action")
