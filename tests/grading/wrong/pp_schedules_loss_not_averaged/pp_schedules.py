"""WRONG ON PURPOSE (pp_schedules_loss_not_averaged): the last stage's loss of each micro-batch
is its mean over the micro-batch's own tokens, not divided by m: the step's loss and every
gradient come out m times too large."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_schedules")


def forward_step(self, i, c):
    self.prefetch()
    chunk = self.chunks[c]
    x = self.batches[i][0] if chunk.is_first else self.take_input().requires_grad_()
    out = chunk(x)
    if chunk.is_last:
        out = chunk.loss(out, self.batches[i][1], 1)           # WRONG: divide by m (self.m)
        self.losses.append(out.detach())
    else:
        self.send(out)
    self.inputs[i, c], self.outputs[i, c] = x, out


OverlappedChunkedExecutor.forward_step = forward_step                          # noqa: F821
