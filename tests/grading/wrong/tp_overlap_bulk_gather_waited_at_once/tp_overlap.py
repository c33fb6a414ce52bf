"""WRONG ON PURPOSE (tp_overlap_bulk_gather_waited_at_once): the column-parallel backward waits
for the saved input's all-gather (the one the wgrad GEMM needs) as soon as it starts, instead of
after the dgrad GEMM: right numbers, that all-gather exposed."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "tp_overlap")


class ColumnParallelMatmul(ColumnParallelMatmul):                               # noqa: F821
    @staticmethod
    def backward(ctx, dy):
        saved, weight = ctx.saved_tensors
        if not ctx.overlap.bulk:
            return super(ColumnParallelMatmul, ColumnParallelMatmul).backward(ctx, dy)
        x_full = start_all_gather_sequence(saved).wait()   # noqa: F821 WRONG: waited at once
        dx_full = dy @ weight
        scatter = start_reduce_scatter_sequence(dx_full)                      # noqa: F821
        dw = weight_grad(dy, x_full)                                          # noqa: F821
        return scatter.wait(), dw, None
