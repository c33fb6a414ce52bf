"""WRONG ON PURPOSE (dp_overlap_reduce_scatter_waited_at_once): each layer's gradient
reduce-scatter is waited on as soon as it starts, inside the backward pass: right numbers, the
backward traffic all exposed."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "dp_overlap")
_start = ShardedTrainer.reduce_scatter_grads                                  # noqa: F821


def _start_and_wait(self, i):
    _start(self, i)
    self.grad_works[i].wait()                             # WRONG: waited at once


ShardedTrainer.reduce_scatter_grads = _start_and_wait                         # noqa: F821
