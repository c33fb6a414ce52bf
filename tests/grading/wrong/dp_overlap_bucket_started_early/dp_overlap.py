"""WRONG ON PURPOSE (dp_overlap_bucket_started_early): a bucket's all-reduce starts when its
*first* gradient is ready, not its last: the gradients accumulated after it are never averaged."""
import torch.distributed as dist

from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "dp_overlap")


def _grad_ready(self, i):
    self.missing[i] -= 1
    if self.missing[i] == len(self.buckets[i].params) - 1:       # WRONG: the first, not the last
        grad = self.buckets[i].grad
        grad /= self.n
        self.works.append(dist.all_reduce(grad, async_op=True))
        self.next_bucket += 1


BucketedDP.grad_ready = _grad_ready                                           # noqa: F821
