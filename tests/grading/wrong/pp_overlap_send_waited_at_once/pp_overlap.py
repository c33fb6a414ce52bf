"""WRONG ON PURPOSE (pp_overlap_send_waited_at_once): the overlapped executor posts each send
with ``isend`` but waits for it at once, before the next action computes: the compute the
transfer should travel behind starts only once it has arrived, so the stage idles while every
output travels. (Holding a send back until after the next action computed would be worse: in
1F1B two neighbours would each wait for the other's held-back tensor, a deadlock.)"""
import torch.distributed as dist

from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_overlap")


def _exchange_and_wait(self, tensor, peer):
    if tensor is not None:
        dist.isend(tensor.detach().contiguous(), peer).wait()    # WRONG: waited before computing on


OverlappedExecutor.exchange = _exchange_and_wait                              # noqa: F821
