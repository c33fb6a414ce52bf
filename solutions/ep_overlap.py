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
    ### BEGIN SOLUTION
    ### hint 1: the counts for rank d's experts are exactly the d-th equal piece of counts, so one even all-to-all delivers them (lesson 13, section 2, "Dispatch and combine").
    ### hint 2: send piece d of counts to rank d and receive one piece from every rank into a buffer of the same size; then view the buffer as one row per source rank.
    ### hint 3: recv = torch.empty_like(counts); dist.all_to_all_single(recv, counts.contiguous(), group=group); return recv.view(ep, -1)
    ep = dist.get_world_size(group)
    recv = torch.empty_like(counts)
    dist.all_to_all_single(recv, counts.contiguous(), group=group)
    return recv.view(ep, -1)
    ### END SOLUTION


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
        ### BEGIN SOLUTION
        ### hint 1: all_to_all_single takes the output's and the input's split sizes; the backward needs both lists again (lesson 13, section 4, "EP as an autograd op"; the exchange: section 2).
        ### hint 2: keep the splits and the group on ctx; make an output of sum(recv_splits) rows of x's width; exchange with the two lists.
        ### hint 3: out = x.new_empty((sum(recv), *x.shape[1:])); dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
        ctx.splits, ctx.group = (list(send_splits), list(recv_splits)), group
        out = x.new_empty((sum(recv_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=list(recv_splits),
                               input_split_sizes=list(send_splits), group=group)
        return out
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        ### hint 1: a row's gradient must travel back the way the row came (lesson 13, section 4, "EP as an autograd op").
        ### hint 2: run the same op with the received splits as the sent ones and the other way round; no gradient for the three other arguments.
        ### hint 3: send, recv = ctx.splits; return AllToAll.apply(grad, recv, send, ctx.group), None, None, None
        send, recv = ctx.splits
        return AllToAll.apply(grad, recv, send, ctx.group), None, None, None
        ### END SOLUTION


# --------------------------------------------------------------------------- 3. dispatch, combine
def dispatch(x: torch.Tensor, experts: torch.Tensor, keep: torch.Tensor, num_experts: int,
             group=None) -> tuple[torch.Tensor, DispatchPlan]:
    """Send this rank's kept assignments to the ranks of their experts.

    Lesson 13, section 2 ("Dispatch and combine"). ``x [T, H]`` this rank's tokens,
    ``experts [T, k]`` the router's choices, ``keep [T, k]`` the assignments inside the capacity.
    Returns the rows this rank's experts must process, expert-major (local expert 0's rows, from
    every source in rank order, then expert 1's, ...), and the plan its combine needs. Two
    collectives: the counts, then the rows (uneven splits); dropped assignments never travel."""
    ### BEGIN SOLUTION
    ### hint 1: the given bookkeeping does the sorting and the regrouping; your part is the two exchanges between them (lesson 13, section 2, "Dispatch and combine").
    ### hint 2: sort the kept assignments by expert; exchange the per-expert counts; the rows to send per rank come from the counts, the rows received per rank from the received counts; send the sorted rows; regroup what arrived expert-major.
    ### hint 3: token, slot, counts = sort_by_expert(...); recv_counts = exchange_counts(counts, group); send = rank_splits(counts, ep); recv = recv_counts.sum(1); moved = AllToAll.apply(x[token], send, recv, group); order = expert_major_order(recv_counts); return moved[order], DispatchPlan(...)
    ep = dist.get_world_size(group)
    token, slot, counts = sort_by_expert(experts, keep, num_experts)
    recv_counts = exchange_counts(counts, group)                       # [ep, E/ep]
    send, recv = rank_splits(counts, ep), [int(c) for c in recv_counts.sum(dim=1)]
    moved = AllToAll.apply(x[token], send, recv, group)                # [M, H], source-major
    order = expert_major_order(recv_counts)
    plan = DispatchPlan(token, slot, send, recv, order,
                        [int(c) for c in recv_counts.sum(dim=0)])
    return moved[order], plan                                          # [M, H], expert-major
    ### END SOLUTION


def combine(y: torch.Tensor, weights: torch.Tensor, plan: DispatchPlan, num_tokens: int,
            group=None) -> torch.Tensor:
    """Bring the experts' outputs home, un-permute them and weight them by the router.

    Lesson 13, section 2 ("Dispatch and combine"); the gradients: section 4. ``y [M, H]`` the local
    experts' outputs in ``dispatch``'s expert-major order, ``weights [T, k]`` the router's weights
    (their gradient must reach the router), ``plan`` what ``dispatch`` returned. Returns
    ``[num_tokens, H]``: row t the sum over token t's kept assignments of weight times expert
    output (zero for a token with none)."""
    ### BEGIN SOLUTION
    ### hint 1: undo the dispatch step by step, in reverse order (lesson 13, section 2, "Dispatch and combine").
    ### hint 2: put the rows back in source-major order; send them home with the dispatch's splits swapped; multiply each returned row by its assignment's weight; add each row into its token's row.
    ### hint 3: back = y[torch.argsort(plan.order)]; home = AllToAll.apply(back, plan.recv_splits, plan.send_splits, group); home = home * weights.reshape(-1)[plan.slot].unsqueeze(-1); y.new_zeros(num_tokens, H).index_add(0, plan.token, home)
    back = y[torch.argsort(plan.order)]                                         # source-major
    home = AllToAll.apply(back, plan.recv_splits, plan.send_splits, group)      # [N, H], sorted
    home = home * weights.reshape(-1)[plan.slot].unsqueeze(-1)
    return home.new_zeros(num_tokens, home.shape[-1]).index_add(0, plan.token, home)
    ### END SOLUTION


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
    ### BEGIN SOLUTION
    ### hint 1: the single-device MoE.forward is the recipe; only the run of the experts changes (lesson 13, sections 1, "Routing, and the load it makes", and 2).
    ### hint 2: flatten the tokens; route them; decide which assignments fit (this rank's tokens are one group); set the aux loss; dispatch; run the local experts on their runs of rows; combine; add the shared expert if there is one; restore the shape.
    ### hint 3: r = route(x2, moe.router.weight, k); keep = capacity_keep(r.experts, E, cf); rows, plan = dispatch(...); out = run_experts(moe.expert_list(), rows, plan.local_counts); y = combine(out, r.weights, plan, T, group) (+ moe.shared(x2))
    E, shape = moe.moe.num_experts, x.shape
    x2 = x.reshape(-1, shape[-1])                                               # [T, H]
    r = route(x2, moe.router.weight, moe.moe.top_k)
    keep = capacity_keep(r.experts, E, moe.moe.capacity_factor)
    moe.aux_loss = load_balancing_loss(r.probs, r.experts)
    rows, plan = dispatch(x2, r.experts, keep, E, group)
    out = run_experts(moe.expert_list(), rows, plan.local_counts)
    y = combine(out, r.weights, plan, x2.shape[0], group)
    if moe.shared is not None:
        y = y + moe.shared(x2)
    return y.reshape(shape)
    ### END SOLUTION


# --------------------------------------------------------------------------- 5. shared-expert overlap
def prepare_dispatch(x: torch.Tensor, experts: torch.Tensor, keep: torch.Tensor, num_experts: int,
                     group=None) -> tuple[torch.Tensor, DispatchPlan]:
    """``dispatch`` up to the token exchange: the rows to send and the plan, nothing sent yet.

    Lesson 13, section 5 ("The shared expert behind the dispatch"). Same arguments as ``dispatch``.
    Returns ``x``'s rows in the order they are sent (``[N, H]``, sorted by expert; their gradient
    reaches ``x``) and the plan, as ``dispatch``'s. One collective: the counts."""
    ### BEGIN SOLUTION
    ### hint 1: this is your dispatch with its token all-to-all and its regrouping taken out (lesson 13, section 5, "The shared expert behind the dispatch").
    ### hint 2: sort the kept assignments; exchange the counts; build the plan from the counts sent and received; return the rows in sorted order with it.
    ### hint 3: token, slot, counts = sort_by_expert(...); recv_counts = exchange_counts(counts, group); return x[token], DispatchPlan(token, slot, rank_splits(counts, ep), recv_counts.sum(1) as ints, expert_major_order(recv_counts), recv_counts.sum(0) as ints)
    ep = dist.get_world_size(group)
    token, slot, counts = sort_by_expert(experts, keep, num_experts)
    recv_counts = exchange_counts(counts, group)                       # [ep, E/ep]
    plan = DispatchPlan(token, slot, rank_splits(counts, ep),
                        [int(c) for c in recv_counts.sum(dim=1)], expert_major_order(recv_counts),
                        [int(c) for c in recv_counts.sum(dim=0)])
    return x[token], plan                                              # [N, H], sorted by expert
    ### END SOLUTION


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
        ### BEGIN SOLUTION
        ### hint 1: all_to_all_single returns a work handle instead of blocking when asked to; the buffer is not filled until it is waited on (lesson 13, section 5, "The shared expert behind the dispatch").
        ### hint 2: keep pending on ctx; make the output buffer; issue the exchange asynchronously with pending's splits, its handle on pending; return the buffer.
        ### hint 3: out = x.new_empty((sum(pending.recv), *x.shape[1:])); pending.work = dist.all_to_all_single(out, x.contiguous(), pending.recv, pending.send, group=pending.group, async_op=True); return out
        ctx.pending = pending
        out = x.new_empty((sum(pending.recv), *x.shape[1:]))                    # [M, H], unfilled
        pending.work = dist.all_to_all_single(out, x.contiguous(), pending.recv, pending.send,
                                              group=pending.group, async_op=True)
        return out
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        ### hint 1: by the time autograd gets here, the reverse exchange has been travelling while other gradients were computed (lesson 13, section 5, "The shared expert behind the dispatch").
        ### hint 2: wait for the exchange on pending; its buffer, now filled, is x's gradient.
        ### hint 3: ctx.pending.wait("backward"); return ctx.pending.buffer, None
        ctx.pending.wait("backward")
        return ctx.pending.buffer, None
        ### END SOLUTION


class WaitAllToAll(torch.autograd.Function):
    """Applied to the buffer ``StartAllToAll`` returned and the same record: wait for the
    exchange and return the filled buffer (a view).
    Lesson 13, section 5 ("The shared expert behind the dispatch").

    Backward: *start* the reverse exchange of the incoming gradient, keep its handle and its
    buffer on the record (``StartAllToAll``'s backward waits) and return the incoming gradient
    itself as a placeholder (it has the buffer's shape; nothing reads it)."""

    @staticmethod
    def forward(ctx, buffer, pending):
        ### BEGIN SOLUTION
        ### hint 1: the forward's wait belongs here, after the compute placed between the two ops (lesson 13, section 5, "The shared expert behind the dispatch").
        ### hint 2: keep pending on ctx, wait, and return a new view of the buffer.
        ### hint 3: ctx.pending = pending; pending.wait("forward"); return buffer.view_as(buffer)
        ctx.pending = pending
        pending.wait("forward")
        return buffer.view_as(buffer)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        ### hint 1: a row's gradient travels back the way the row came, and nothing here needs it yet (lesson 13, section 5, "The shared expert behind the dispatch").
        ### hint 2: make a buffer of the sent rows' size on pending; issue the exchange into it with the splits swapped, asynchronously, its handle on pending; return the gradient you got.
        ### hint 3: p = ctx.pending; p.buffer = grad.new_empty((sum(p.send), *grad.shape[1:])); p.work = dist.all_to_all_single(p.buffer, grad.contiguous(), p.send, p.recv, group=p.group, async_op=True); return grad, None
        p = ctx.pending
        p.buffer = grad.new_empty((sum(p.send), *grad.shape[1:]))               # [N, H], unfilled
        p.work = dist.all_to_all_single(p.buffer, grad.contiguous(), p.send, p.recv,
                                        group=p.group, async_op=True)
        return grad, None
        ### END SOLUTION


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
    ### BEGIN SOLUTION
    ### hint 1: ep_moe with its dispatch cut in two around the shared expert; autograd runs the backward in the reverse order, so the same two ops hide its backward (lesson 13, section 5, "The shared expert behind the dispatch").
    ### hint 2: route, keep, aux loss as in ep_moe; prepare the dispatch; start the exchange; compute the shared expert; wait; regroup, run the experts, combine; add the shared output.
    ### hint 3: rows, plan = prepare_dispatch(...); p = Pending("dispatch", plan.send_splits, plan.recv_splits, group); buf = StartAllToAll.apply(rows, p); shared = moe.shared(x2); moved = WaitAllToAll.apply(buf, p); out = run_experts(..., moved[plan.order], plan.local_counts); combine(...) + shared
    E, shape = moe.moe.num_experts, x.shape
    x2 = x.reshape(-1, shape[-1])                                               # [T, H]
    r = route(x2, moe.router.weight, moe.moe.top_k)
    keep = capacity_keep(r.experts, E, moe.moe.capacity_factor)
    moe.aux_loss = load_balancing_loss(r.probs, r.experts)
    rows, plan = prepare_dispatch(x2, r.experts, keep, E, group)                # [N, H]
    pending = Pending("dispatch", plan.send_splits, plan.recv_splits, group)
    buffer = StartAllToAll.apply(rows, pending)                                 # [M, H] in flight
    with torch.profiler.record_function("ep:shared"):
        shared = moe.shared(x2)                                                 # hides the dispatch
    moved = WaitAllToAll.apply(buffer, pending)                                 # source-major
    out = run_experts(moe.expert_list(), moved[plan.order], plan.local_counts)
    y = combine(out, r.weights, plan, x2.shape[0], group) + shared
    return y.reshape(shape)
    ### END SOLUTION


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
        ### BEGIN SOLUTION
        ### hint 1: by now the experts' backward has computed their input gradients and stashed the rest; the exchange needs only the former (lesson 13, section 6, "Deferred weight gradients").
        ### hint 2: issue the reverse exchange asynchronously (the splits swapped); flush the store while it travels; wait; return the buffer.
        ### hint 3: send, recv = ctx.splits; out = grad.new_empty((sum(send), ...)); work = dist.all_to_all_single(out, grad.contiguous(), send, recv, group=ctx.group, async_op=True); ctx.store.flush(); work.wait(); return out, None, None, None, None
        send, recv = ctx.splits
        out = grad.new_empty((sum(send), *grad.shape[1:]))                      # [N, H]
        work = dist.all_to_all_single(out, grad.contiguous(), send, recv, group=ctx.group,
                                      async_op=True)
        with torch.profiler.record_function("ep:wgrad"):
            ctx.store.flush()                                                   # hides the exchange
        with torch.profiler.record_function("ep_wait:dispatch.backward"):
            work.wait()
        return out, None, None, None, None
        ### END SOLUTION


def ep_moe_deferred_wgrad(moe: MoE, x: torch.Tensor, group=None) -> torch.Tensor:
    """``ep_moe`` whose backward computes the experts' weight gradients while the dispatch's
    backward (the rows' gradients going home) travels.
    Lesson 13, section 6 ("Deferred weight gradients").

    Contract: ``ep_moe``'s (the same outputs, gradients and load-balancing loss); once the
    backward pass returns, every local expert's gradient is in place. On the link, the
    dispatch's backward is not waited on before the weight gradients' products ran."""
    ### BEGIN SOLUTION
    ### hint 1: ep_moe with the experts run by the given deferred runner and the token exchange by the op above (lesson 13, section 6, "Deferred weight gradients").
    ### hint 2: route, keep, aux loss; prepare the dispatch; exchange the rows with the op that flushes a store in its backward; run the experts deferred on that store; combine; add the shared expert.
    ### hint 3: store = ExpertGradStore(); moved = AllToAllThenWgrad.apply(rows, plan.send_splits, plan.recv_splits, group, store); out = run_experts_deferred(moe.expert_list(), moved[plan.order], plan.local_counts, store)
    E, shape = moe.moe.num_experts, x.shape
    x2 = x.reshape(-1, shape[-1])                                               # [T, H]
    r = route(x2, moe.router.weight, moe.moe.top_k)
    keep = capacity_keep(r.experts, E, moe.moe.capacity_factor)
    moe.aux_loss = load_balancing_loss(r.probs, r.experts)
    rows, plan = prepare_dispatch(x2, r.experts, keep, E, group)
    store = ExpertGradStore()
    moved = AllToAllThenWgrad.apply(rows, plan.send_splits, plan.recv_splits, group, store)
    out = run_experts_deferred(moe.expert_list(), moved[plan.order], plan.local_counts, store)
    y = combine(out, r.weights, plan, x2.shape[0], group)
    if moe.shared is not None:
        y = y + moe.shared(x2)
    return y.reshape(shape)
    ### END SOLUTION


# --------------------------------------------------------------------------- 7. two micro-batches
### BEGIN CHALLENGE: two micro-batches, whole: the schedule and the executor's actions
def two_batch_schedule(phase: str, deferred_wgrad: bool = False) -> list[tuple]:
    """The order of two micro-batches' actions through the layer in ``phase``, a pure function.

    Lesson 13, section 7 ("Two micro-batches against each other"). Actions are (kind, micro-batch,
    step) tuples, listed with their dependencies in ``workbook/expert_parallel/two_batch.py``;
    ``deferred_wgrad`` adds one weight-gradient compute per micro-batch to the backward. Contract:
    the given schedule check accepts it for ``phase`` and ``deferred_wgrad``: every action once,
    dependencies first, and no transfer waited on while a compute that does not need it was ready
    and nothing had run since the transfer started. ``phase``: forward or backward, anything else a
    ``ValueError``."""
    ### BEGIN SOLUTION
    ### hint 1: while one micro-batch's tokens travel, the other computes; a wait goes as late as the next compute of the travelling micro-batch; in one layer, one transfer per pass has nothing to hide behind, the last of the forward and the first of the backward (lesson 13, section 7, "Two micro-batches against each other").
    ### hint 2: forward: A computes and starts; B computes (A travels) and starts; A waits and computes (B travels) ... alternate to the end. Backward: both start their combine's backward, then the same alternation; the weight gradients fill a gap after a start.
    ### hint 3: forward: A.router, start A.dispatch, B.router, start B.dispatch, wait A.dispatch, A.experts, start A.combine, wait B.dispatch, B.experts, start B.combine, wait A.combine, wait B.combine
    if phase == "forward":
        return [("compute", "A", "router"), ("start", "A", "dispatch"),
                ("compute", "B", "router"), ("start", "B", "dispatch"),       # A travels
                ("wait", "A", "dispatch"), ("compute", "A", "experts"),       # B travels
                ("start", "A", "combine"),
                ("wait", "B", "dispatch"), ("compute", "B", "experts"),       # A travels
                ("start", "B", "combine"),
                ("wait", "A", "combine"), ("wait", "B", "combine")]
    if phase != "backward":
        raise ValueError(f"phase={phase!r}: use 'forward' or 'backward'")
    later = (lambda mb: [("compute", mb, "wgrad")]) if deferred_wgrad else (lambda mb: [])
    return [("start", "A", "combine"), ("start", "B", "combine"),
            ("wait", "A", "combine"), ("compute", "A", "experts"),            # B travels
            ("start", "A", "dispatch"),
            ("wait", "B", "combine"), ("compute", "B", "experts"),            # A travels
            ("start", "B", "dispatch"), *later("A"),
            ("wait", "A", "dispatch"), ("compute", "A", "router"),            # B travels
            *later("B"), ("wait", "B", "dispatch"), ("compute", "B", "router")]
    ### END SOLUTION


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
        ### BEGIN SOLUTION
        ### hint 1: each action is a piece of ep_moe; tensors that cross an exchange become new leaves on the far side, so each piece's backward can run on its own (lesson 13, section 7, "Two micro-batches against each other").
        ### hint 2: router: route, keep, the shared expert, then prepare the dispatch (its count exchange waits for the link, which carries one exchange at a time: whatever the router computes before it hides the other micro-batch's tokens); start: self.exchange with the plan's splits; wait: wait the handle, mark the received buffer as a leaf that wants a gradient; experts: regroup, run (deferred under the micro-batch's key when there is a store), back to source-major; combine's wait: the received rows, the router weights and the shared output as leaves, weighted and added as in combine.
        ### hint 3: the dispatch exchange is self.exchange(s, "recv", s["send"], plan.recv_splits, plan.send_splits); the combine's is self.exchange(s, "home", s["back"], plan.send_splits, plan.recv_splits)
        if (kind, step) == ("compute", "router"):
            r = route(s["x"], moe.router.weight, moe.moe.top_k)
            keep = capacity_keep(r.experts, E, moe.moe.capacity_factor)
            s["shared"] = moe.shared(s["x"]) if moe.shared is not None else None
            s["weights"] = r.weights                                            # [T/2, k]
            s["send"], s["plan"] = prepare_dispatch(s["x"], r.experts, keep, E, self.group)
        elif (kind, step) == ("start", "dispatch"):
            plan = s["plan"]
            self.exchange(s, "recv", s["send"], plan.recv_splits, plan.send_splits)
        elif (kind, step) == ("compute", "experts"):
            rows, plan = s["recv"][s["plan"].order], s["plan"]                  # expert-major
            if self.store is None:
                out = run_experts(moe.expert_list(), rows, plan.local_counts)
            else:
                with self.store.deferring(mb):
                    out = run_experts_deferred(moe.expert_list(), rows, plan.local_counts,
                                               self.store)
            s["back"] = out[torch.argsort(plan.order)]                          # source-major
        elif (kind, step) == ("start", "combine"):
            plan = s["plan"]
            self.exchange(s, "home", s["back"], plan.send_splits, plan.recv_splits)
        elif kind == "wait":
            self.wait(s)
            if step == "dispatch":
                s["recv"].requires_grad_()
            else:
                plan, home = s["plan"], s["home"].requires_grad_()             # [N, H], sorted
                s["leaves"] = [home, s["weights"].detach().requires_grad_()]
                if s["shared"] is not None:
                    s["leaves"].append(s["shared"].detach().requires_grad_())
                weighted = home * s["leaves"][1].reshape(-1)[plan.slot].unsqueeze(-1)
                y = home.new_zeros(s["x"].shape).index_add(0, plan.token, weighted)
                s["y"] = y + s["leaves"][2] if s["shared"] is not None else y
        ### END SOLUTION

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
        ### BEGIN SOLUTION
        ### hint 1: run each piece's backward by hand, with torch.autograd.grad or .backward on the piece's outputs and the gradients that arrived (lesson 13, section 7, "Two micro-batches against each other").
        ### hint 2: combine's start: the output's backward to the three leaves, then send the rows' gradient back (splits as in the forward's dispatch); experts: the experts' backward from the arrived gradient; dispatch's start: send the received buffer's gradient home; wgrad: flush the store under the micro-batch's key; router: one backward from the sent rows, the weights and the shared output with their gradients.
        ### hint 3: grads = torch.autograd.grad(s["y"], s["leaves"], s["grad"]); self.exchange(s, "g_back", grads[0], plan.recv_splits, plan.send_splits); ... torch.autograd.backward([s["send"], s["weights"], (s["shared"])], [s["g_send"], grads[1], (grads[2])])
        plan = s["plan"]
        if (kind, step) == ("start", "combine"):
            s["leaf_grads"] = torch.autograd.grad(s["y"], s["leaves"], s["grad"])
            self.exchange(s, "g_back", s["leaf_grads"][0], plan.recv_splits, plan.send_splits)
        elif (kind, step) == ("compute", "experts"):
            torch.autograd.backward(s["back"], s["g_back"])                     # fills recv.grad
        elif (kind, step) == ("start", "dispatch"):
            self.exchange(s, "g_send", s["recv"].grad, plan.send_splits, plan.recv_splits)
        elif (kind, step) == ("compute", "wgrad"):
            self.store.flush(mb)
        elif kind == "wait":
            self.wait(s)
        elif (kind, step) == ("compute", "router"):
            roots, grads = [s["send"], s["weights"]], [s["g_send"], s["leaf_grads"][1]]
            if s["shared"] is not None:
                roots, grads = roots + [s["shared"]], grads + [s["leaf_grads"][2]]
            torch.autograd.backward(roots, grads)
        ### END SOLUTION
### END CHALLENGE


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
    ### BEGIN SOLUTION
    ### hint 1: two parts: what the exchange costs on the alpha-beta link, which its busiest rank decides, then how much of it the shared expert covers (lesson 13, section 3, "The all-to-all's cost: the busiest receiver", and section 8, "Predict, then measure").
    ### hint 2: for every rank add up the bytes it sends to the others and the bytes it receives from the others (what it keeps never travels); the largest of all those sums, sending or receiving, is the busiest rank's; the exchange takes the latency plus those bytes over the bandwidth, in ms (mind bytes, not elements); the shared expert covers up to its own time of it, and nothing is exposed below zero.
    ### hint 3: row = hidden * itemsize; busiest = max over r of max(sum(sent_rows[r][d] for d != r), sum(sent_rows[s][r] for s != r)) * row; t_ms = 1e3 * (link.latency_s + busiest / link.bandwidth_Bps); return max(0.0, t_ms - t_shared_ms)
    n = len(sent_rows)
    if n <= 1:
        return 0.0                                        # nothing leaves the rank
    busiest = max(max(sum(sent_rows[r][d] for d in range(n) if d != r),
                      sum(sent_rows[s][r] for s in range(n) if s != r)) for r in range(n))
    t_ms = 1e3 * (link.latency_s + busiest * hidden * itemsize / link.bandwidth_Bps)
    return max(0.0, t_ms - t_shared_ms)
    ### END SOLUTION


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
