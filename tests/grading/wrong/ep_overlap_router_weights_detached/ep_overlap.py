"""WRONG ON PURPOSE (ep_overlap_router_weights_detached): the combine weights the experts'
outputs with detached router weights: the outputs are right, but the router gets no gradient
through them."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "ep_overlap")


def combine(y, weights, plan, num_tokens, group=None):
    back = y[torch.argsort(plan.order)]                                         # noqa: F821
    home = AllToAll.apply(back, plan.recv_splits, plan.send_splits, group)      # noqa: F821
    home = home * weights.detach().reshape(-1)[plan.slot].unsqueeze(-1)         # WRONG: detached
    return home.new_zeros(num_tokens, home.shape[-1]).index_add(0, plan.token, home)
