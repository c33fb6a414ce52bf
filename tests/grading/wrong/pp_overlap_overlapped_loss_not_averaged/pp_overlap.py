"""WRONG ON PURPOSE (pp_overlap_overlapped_loss_not_averaged): the overlapped executor's forward,
written out again, takes each micro-batch's loss as its mean over its own rows, not divided by
the m micro-batches: the step returns m times the batch's loss, every gradient is m times too
large. The blocking executor is the reference's, so only the overlapped variant's numbers are
wrong, while its traffic and its overlap are exactly the reference's."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_overlap")


def _forward_step(self, i):
    self.prefetch()
    x = self.batches[i][0] if self.prev is None else self.take_received().requires_grad_()
    out = self.stage(x)
    if self.next is None:
        out = self.stage.loss(out, self.batches[i][1], 1)     # WRONG: the mean over m left out
        self.losses.append(out.detach())
    self.inputs[i], self.outputs[i] = x, out
    self.exchange(out if self.next is not None else None, self.next)


OverlappedExecutor.forward_step = _forward_step                               # noqa: F821
