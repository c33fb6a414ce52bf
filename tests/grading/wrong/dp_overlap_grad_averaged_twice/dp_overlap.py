"""WRONG ON PURPOSE (dp_overlap_grad_averaged_twice): ZeRO divides the gradient by n before the
reduce-scatter and again after it: every shard's gradient is 1/n of the average."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "dp_overlap")
_finish = ShardedTrainer.finish_gradient_sync                                 # noqa: F821


def _finish_and_divide(self):
    _finish(self)
    for shard in self.shards:
        shard.grad /= self.n                              # WRONG: already averaged


ShardedTrainer.finish_gradient_sync = _finish_and_divide                      # noqa: F821
