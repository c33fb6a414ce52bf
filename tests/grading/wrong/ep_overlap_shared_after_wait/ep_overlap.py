"""WRONG ON PURPOSE (ep_overlap_shared_after_wait): the dispatch is started asynchronously, but
waited on at once and the shared expert computed after the wait: the numbers are right, nothing
hides the tokens' trip."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "ep_overlap")


def ep_moe_shared_overlap(moe, x, group=None):
    if moe.shared is None:
        raise ValueError("ep_moe_shared_overlap needs a shared expert")
    E, shape = moe.moe.num_experts, x.shape
    x2 = x.reshape(-1, shape[-1])
    r = route(x2, moe.router.weight, moe.moe.top_k)                             # noqa: F821
    keep = capacity_keep(r.experts, E, moe.moe.capacity_factor)                 # noqa: F821
    moe.aux_loss = load_balancing_loss(r.probs, r.experts)                      # noqa: F821
    rows, plan = prepare_dispatch(x2, r.experts, keep, E, group)                # noqa: F821
    pending = Pending("dispatch", plan.send_splits, plan.recv_splits, group)    # noqa: F821
    buffer = StartAllToAll.apply(rows, pending)                                 # noqa: F821
    moved = WaitAllToAll.apply(buffer, pending)                                 # noqa: F821
    shared = moe.shared(x2)                             # WRONG: after the wait, hides nothing
    out = run_experts(moe.expert_list(), moved[plan.order], plan.local_counts)  # noqa: F821
    y = combine(out, r.weights, plan, x2.shape[0], group) + shared              # noqa: F821
    return y.reshape(shape)
