# Generated from solutions/ep_overlap.py by `workbook assign` (level: standard): this is your file to edit.
# Replace each `raise NotImplementedError` with your code; check it with `workbook run ep_overlap`
# (or `workbook watch ep_overlap`). Stuck on task N? `workbook hint ep_overlap N`, one hint at a time.
#
# Your tasks (46 pts in all):
#    1. exchange_counts (2.1 pts): Tell every rank how many rows it will receive from this rank,
#       for each of its experts.
#    2. AllToAll.forward and .backward (1.6 pts): Applied to rows `x [N, H]`, the rows to send to
#       each rank (a list of n ints), the rows to receive from each rank (n ints) and a process
#       group: the rows to every rank.
#    3. dispatch (2.1 pts): Send this rank's kept assignments to the ranks of their experts.
#    4. combine (2.1 pts): Bring the experts' outputs home, un-permute them and weight them by the
#       router.
#    5. ep_moe (2.1 pts): The MoE layer on this rank: `moe` is this rank's part (`local_moe`),
#       `x [..., H]` this rank's tokens.
#    6. prepare_dispatch (1 pt): `dispatch` up to the token exchange: the rows to send and the
#       plan, nothing sent yet.
#    7. StartAllToAll.forward and .backward (2.33 pts): Applied to rows `x` and a `Pending` record:
#       issue `AllToAll`'s exchange of `x` with the record's splits and return at once, with the
#       buffer it will fill; the handle stays on the record for `WaitAllToAll`.
#    8. WaitAllToAll.forward and .backward (2.33 pts): Applied to the buffer `StartAllToAll`
#       returned and the same record: wait for the exchange and return the filled buffer (a view).
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
#       schedule's order: built from this rank's part of the layer and a group, then called on the
#       tokens.
#   14. predict_dispatch_exposed_ms (2 pts): Predict, before running it, the ms of the dispatch's
#       all-to-all that stay exposed in `ep_moe_shared_overlap`'s forward pass, where the shared
#       expert computes while the tokens travel, on the simulated `link`.
"""Lab `ep_overlap`: mixture-of-experts expert parallelism, its all-to-all hidden.

Lesson 13 (``lessons/13_ep_overlap.py``) explains everything this lab builds. An MoE layer sends
each token to its top-k experts; under expert parallelism the ``E`` experts are spread over the
ranks of the group, ``E / n`` consecutive experts each, every rank holding its own tokens, so
every layer moves tokens to their experts and the results back: two all-to-alls in the forward
pass, two in the backward. You build, in order:

1. ``exchange_counts``: how many rows each rank will receive, for each of its experts;
2. ``AllToAll``: the uneven all-to-all as an autograd op;
3. ``dispatch`` and ``combine``: tokens to their experts' ranks, and the results home, weighted
   by the router;
4. ``ep_moe``: the whole layer on one rank, equal to the single-device layer;
5. ``ep_moe_shared_overlap``: the shared expert computed while the dispatch travels, forward and
   backward (``StartAllToAll`` / ``WaitAllToAll``);
6. ``ep_moe_deferred_wgrad``: the experts' weight gradients computed while the dispatch's
   backward travels (``AllToAllThenWgrad``);
7. two micro-batches against each other: ``two_batch_schedule`` (a pure function, graded at once)
   and ``TwoBatchMoE``, the executor that runs a schedule on the ranks;
8. ``predict_dispatch_exposed_ms``: before you run it, what the shared expert leaves exposed of
   the dispatch, from the simulated link's figures.

Given pieces: ``workbook/expert_parallel/expert_parallel.py`` (the placement, the token
bookkeeping, ``DispatchPlan``), ``deferred_wgrad.py`` (the experts' backward in two),
``two_batch.py`` (the two-micro-batch actions and the schedule check),
``two_batch_executor.py`` (what runs a schedule on the ranks, around your actions) and
``workbook/model/moe.py`` (the single-device layer: routing, capacity, the experts): read them
first. Run: ``workbook run ep_overlap``; grade: ``workbook grade --lab ep_overlap``.
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

    Lesson 13, section 2 ("Dispatch and combine"). ``counts [E]`` (long): the rows this rank sends
    to each expert. Returns a long tensor ``[n, E/n]`` (n ranks in the group): row s holds what
    rank s sends to each of this rank's experts, in expert order. One collective, on the group."""
    raise NotImplementedError("not implemented yet: ep_overlap.exchange_counts")


# --------------------------------------------------------------------------- 2. the autograd op
class AllToAll(torch.autograd.Function):
    """Applied to rows ``x [N, H]``, the rows to send to each rank (a list of n ints), the rows to
    receive from each rank (n ints) and a process group: the rows to every rank.

    Lesson 13, section 4 ("EP as an autograd op"); the exchange itself: section 2. The first
    rows of ``x`` go to rank 0, the next to rank 1, and so on; the result holds the rows received,
    rank 0's first. Any count may be zero (a rank that receives nothing). Differentiable: the
    gradient of ``x`` is that of the rows it sent, wherever they went."""

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

    Lesson 13, section 2 ("Dispatch and combine"). ``x [T, H]`` this rank's tokens,
    ``experts [T, k]`` the router's choices, ``keep [T, k]`` the assignments inside the capacity.
    Returns the rows this rank's experts must process, expert-major (local expert 0's rows, from
    every source in rank order, then expert 1's, ...), and the plan its combine needs. Two
    collectives: the counts, then the rows (uneven splits); dropped assignments never travel."""
    raise NotImplementedError("not implemented yet: ep_overlap.dispatch")


def combine(y: torch.Tensor, weights: torch.Tensor, plan: DispatchPlan, num_tokens: int,
            group=None) -> torch.Tensor:
    """Bring the experts' outputs home, un-permute them and weight them by the router.

    Lesson 13, section 2 ("Dispatch and combine"); the gradients: section 4. ``y [M, H]`` the local
    experts' outputs in ``dispatch``'s expert-major order, ``weights [T, k]`` the router's weights
    (their gradient must reach the router), ``plan`` what ``dispatch`` returned. Returns
    ``[num_tokens, H]``: row t the sum over token t's kept assignments of weight times expert
    output (zero for a token with none)."""
    raise NotImplementedError("not implemented yet: ep_overlap.combine")


# --------------------------------------------------------------------------- 4. the layer
def ep_moe(moe: MoE, x: torch.Tensor, group=None) -> torch.Tensor:
    """The MoE layer on this rank: ``moe`` is this rank's part (``local_moe``), ``x [..., H]``
    this rank's tokens. Lesson 13, section 1 ("Routing, and the load it makes"), and sections
    2 and 4.

    Contract: on every rank the output equals the single-device layer's rows for this rank's
    tokens, with one capacity group per rank (this rank's tokens are one group); so do the
    input's gradient and each local expert's; the router's (and the shared expert's) gradients,
    summed over the ranks, equal the single-device ones. The layer's auxiliary loss (as the
    single-device layer sets it) is this rank's load-balancing loss, over its own tokens."""
    raise NotImplementedError("not implemented yet: ep_overlap.ep_moe")


# --------------------------------------------------------------------------- 5. shared-expert overlap
def prepare_dispatch(x: torch.Tensor, experts: torch.Tensor, keep: torch.Tensor, num_experts: int,
                     group=None) -> tuple[torch.Tensor, DispatchPlan]:
    """``dispatch`` up to the token exchange: the rows to send and the plan, nothing sent yet.

    Lesson 13, section 5 ("The shared expert behind the dispatch"). Same arguments as ``dispatch``.
    Returns ``x``'s rows in the order they are sent (``[N, H]``, sorted by expert; their gradient
    reaches ``x``) and the plan, as ``dispatch``'s. One collective: the counts."""
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
    """Applied to rows ``x`` and a ``Pending`` record: issue ``AllToAll``'s exchange of ``x``
    with the record's splits and return at once, with the buffer it will fill; the handle stays on
    the record for ``WaitAllToAll``.
    Lesson 13, section 5 ("The shared expert behind the dispatch").

    Backward: ``WaitAllToAll``'s backward started the reverse exchange, its buffer and handle on
    the record; wait for it, then pass that buffer on as ``x``'s gradient (the gradient handed to
    this backward is only a placeholder)."""

    @staticmethod
    def forward(ctx, x, pending):
        raise NotImplementedError("not implemented yet: ep_overlap.StartAllToAll.forward")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("not implemented yet: ep_overlap.StartAllToAll.backward")


class WaitAllToAll(torch.autograd.Function):
    """Applied to the buffer ``StartAllToAll`` returned and the same record: wait for the
    exchange and return the filled buffer (a view).
    Lesson 13, section 5 ("The shared expert behind the dispatch").

    Backward: *start* the reverse exchange of the incoming gradient, keep its handle and its
    buffer on the record (``StartAllToAll``'s backward waits) and return the incoming gradient
    itself as a placeholder (it has the buffer's shape; nothing reads it)."""

    @staticmethod
    def forward(ctx, buffer, pending):
        raise NotImplementedError("not implemented yet: ep_overlap.WaitAllToAll.forward")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("not implemented yet: ep_overlap.WaitAllToAll.backward")


def ep_moe_shared_overlap(moe: MoE, x: torch.Tensor, group=None) -> torch.Tensor:
    """``ep_moe`` with the shared expert computed while the dispatch's tokens travel, and its
    backward while the dispatch's backward travels.
    Lesson 13, section 5 ("The shared expert behind the dispatch").

    Contract: ``ep_moe``'s (the same outputs, gradients and load-balancing loss); ``moe`` must
    have a shared expert (a ``ValueError`` otherwise). On the link, neither the dispatch's
    exchange nor its backward is waited on before the shared expert's matrix products ran."""
    if moe.shared is None:
        raise ValueError("ep_moe_shared_overlap needs a shared expert to hide the dispatch behind: "
                         "set MoEConfig(shared_expert=True), or use ep_moe")
    raise NotImplementedError("not implemented yet: ep_overlap.ep_moe_shared_overlap")


# --------------------------------------------------------------------------- 6. deferred wgrad
class AllToAllThenWgrad(torch.autograd.Function):
    """Applied to ``AllToAll``'s four arguments and the store of the experts' deferred weight
    gradients: ``AllToAll``'s forward. Lesson 13, section 6 ("Deferred weight gradients").

    Backward: ``AllToAll``'s gradient, with the weight gradients waiting in the store computed
    while that gradient travels; once it returns, the store is empty."""

    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group, store):
        ctx.store = store
        return AllToAll.forward(ctx, x, send_splits, recv_splits, group)

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("not implemented yet: ep_overlap.AllToAllThenWgrad.backward")


def ep_moe_deferred_wgrad(moe: MoE, x: torch.Tensor, group=None) -> torch.Tensor:
    """``ep_moe`` whose backward computes the experts' weight gradients while the dispatch's
    backward (the rows' gradients going home) travels.
    Lesson 13, section 6 ("Deferred weight gradients").

    Contract: ``ep_moe``'s (the same outputs, gradients and load-balancing loss); once the
    backward pass returns, every local expert's gradient is in place. On the link, the
    dispatch's backward is not waited on before the weight gradients' products ran."""
    raise NotImplementedError("not implemented yet: ep_overlap.ep_moe_deferred_wgrad")


# --------------------------------------------------------------------------- 7. two micro-batches
def two_batch_schedule(phase: str, deferred_wgrad: bool = False) -> list[tuple]:
    """The order of two micro-batches' actions through the layer in ``phase``, a pure function.

    Lesson 13, section 7 ("Two micro-batches against each other"). Actions are (kind, micro-batch,
    step) tuples, listed with their dependencies in ``workbook/expert_parallel/two_batch.py``;
    ``deferred_wgrad`` adds one weight-gradient compute per micro-batch to the backward. Contract:
    the given schedule check accepts it for ``phase`` and ``deferred_wgrad``: every action once,
    dependencies first, and no transfer waited on while a compute that does not need it was ready
    and nothing had run since the transfer started. ``phase``: forward or backward, anything else a
    ``ValueError``."""
    raise NotImplementedError("not implemented yet: ep_overlap.two_batch_schedule")


class TwoBatchMoE(TwoBatchExecutor):
    """The layer on this rank, its tokens cut into micro-batches A (the first half of the rows)
    and B (the second), run in a schedule's order: built from this rank's part of the layer and
    a group, then called on the tokens.

    Lesson 13, section 7 ("Two micro-batches against each other"). Contract: each micro-batch is
    its own capacity group, so the result equals the single-device layer with two groups per rank;
    the output, the input's gradient and the parameters' gradients as in ``ep_moe``'s contract (no
    auxiliary loss). The given ``TwoBatchExecutor``
    (``workbook/expert_parallel/two_batch_executor.py``: read it first) runs your two action
    methods in the schedules' order, each piece of a micro-batch's layer in an autograd graph of
    its own, the pieces meeting at leaves across the exchanges."""

    def __init__(self, moe: MoE, group=None, deferred_wgrad: bool = False,
                 forward: list | None = None, backward: list | None = None):
        super().__init__(forward or two_batch_schedule("forward"),
                         backward or two_batch_schedule("backward", deferred_wgrad),
                         group, deferred_wgrad)
        self.moe = moe

    def forward_action(self, kind: str, mb: str, step: str) -> None:
        """Run one forward action of micro-batch ``mb`` (lesson 13, section 7). ``self.mb[mb]``
        holds its ``"x"`` (``[T/2, H]``, a leaf) and whatever earlier actions left there.

        * compute, router: route, keep (the micro-batch is one capacity group), the shared
          expert's output if there is one, and prepare the dispatch;
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


# --------------------------------------------------------------------------- 8. prediction
def predict_dispatch_exposed_ms(link, sent_rows, hidden: int, itemsize: int,
                                t_shared_ms: float) -> float:
    """Predict, before running it, the ms of the dispatch's all-to-all that stay exposed in
    ``ep_moe_shared_overlap``'s forward pass, where the shared expert computes while the tokens
    travel, on the simulated ``link``.

    Lesson 13, section 8 ("Predict, then measure"); what an uneven all-to-all costs: section 3
    ("The all-to-all's cost: the busiest receiver").

    * ``link``: a ``workbook.link.cost_model.Link``, the simulated link of one node; its
      alpha-beta figures are the latency of one operation in seconds and the bandwidth in bytes
      per second;
    * ``sent_rows``: n lists of n ints, the dispatch's rows (tokens) from each rank (the list) to
      each rank (its entries), a rank's rows to itself included; a rank may receive none;
    * ``hidden`` / ``itemsize``: a row is ``hidden`` elements of ``itemsize`` bytes;
    * ``t_shared_ms``: the shared expert's compute, begun as the exchange starts.

    Returns the ms the rank still waits for the exchange once the shared expert is done, as the
    simulated link times an uneven all-to-all (``workbook/link/topology.py``). The grader
    compares it with the model's value on several exchanges and links; ``workbook run
    ep_overlap`` prints it beside the model and the measurement."""
    raise NotImplementedError("not implemented yet: ep_overlap.predict_dispatch_exposed_ms")


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
