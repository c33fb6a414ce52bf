"""WRONG ON PURPOSE (ep_overlap_wgrad_after_wait): the dispatch's backward is started
asynchronously but waited on at once, and the deferred weight gradients computed only after the
wait: the numbers are right, nothing hides the rows' gradients going home."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "ep_overlap")


def _backward(ctx, grad):
    send, recv = ctx.splits
    out = grad.new_empty((sum(send), *grad.shape[1:]))
    work = dist.all_to_all_single(out, grad.contiguous(), send, recv, group=ctx.group,  # noqa: F821
                                  async_op=True)
    work.wait()                                   # WRONG: before the weight gradients, not after
    ctx.store.flush()
    return out, None, None, None, None


AllToAllThenWgrad.backward = staticmethod(_backward)                            # noqa: F821
