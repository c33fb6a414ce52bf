"""WRONG ON PURPOSE (ep_overlap_splits_swapped): the all-to-all's split sizes passed in the wrong
order, the send splits where ``all_to_all_single`` expects the receive splits (its signature is
``output, input, output_split_sizes, input_split_sizes``)."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "ep_overlap")


def _forward(ctx, x, send_splits, recv_splits, group):
    ctx.splits, ctx.group = (list(send_splits), list(recv_splits)), group
    out = x.new_empty((sum(recv_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), list(send_splits), list(recv_splits),  # noqa: F821
                           group=group)                     # WRONG: output's splits come first
    return out


AllToAll.forward = staticmethod(_forward)                                       # noqa: F821
