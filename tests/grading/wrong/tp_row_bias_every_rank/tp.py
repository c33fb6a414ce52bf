"""DELIBERATELY WRONG (autograder self-test, tests/package/test_tp_sp_wrong_caught.py): the
row-parallel bias is added to each rank's partial sum, so the all-reduce adds it n times."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "tp")


class RowParallelLinear(RowParallelLinear):  # noqa: F821 (from the reference)
    def forward(self, x):
        if not self.input_is_parallel:
            x = scatter_to_tensor_parallel_region(x)  # noqa: F821
        return reduce_from_tensor_parallel_region(model_ops.linear(x, self.weight, self.bias))  # noqa: F821 WRONG
