"""DELIBERATELY WRONG (autograder self-test, tests/package/test_tp_sp_wrong_caught.py): f
(copy_to_tensor_parallel_region) passes the gradient through without the all-reduce, so the
forward is right but every gradient upstream of a parallel region is one rank's share only."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "tp")


class _CopyToTensorParallelRegion(_CopyToTensorParallelRegion):  # noqa: F821 (from the reference)
    @staticmethod
    def backward(ctx, grad):
        return grad                                  # WRONG: no all-reduce


copy_to_tensor_parallel_region = _CopyToTensorParallelRegion.apply
