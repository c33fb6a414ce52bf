"""WRONG ON PURPOSE (ep_overlap_dispatch_not_unpermuted): the dispatch hands the local experts
the rows in the order they arrived, source by source, instead of regrouping them expert by
expert: with two local experts and two sources, rows reach the wrong expert."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "ep_overlap")


def dispatch(x, experts, keep, num_experts, group=None):
    ep = dist.get_world_size(group)                                             # noqa: F821
    token, slot, counts = sort_by_expert(experts, keep, num_experts)            # noqa: F821
    recv_counts = exchange_counts(counts, group)                                # noqa: F821
    send, recv = rank_splits(counts, ep), [int(c) for c in recv_counts.sum(dim=1)]  # noqa: F821
    moved = AllToAll.apply(x[token], send, recv, group)                         # noqa: F821
    order = expert_major_order(recv_counts)                                     # noqa: F821
    plan = DispatchPlan(token, slot, send, recv, order,                         # noqa: F821
                        [int(c) for c in recv_counts.sum(dim=0)])
    return moved, plan                  # WRONG: source-major; the experts want moved[order]
