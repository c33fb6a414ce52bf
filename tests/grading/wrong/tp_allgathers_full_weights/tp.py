"""DELIBERATELY WRONG (autograder self-test, tests/package/test_tp_sp_wrong_caught.py): not
tensor parallelism. Each linear all-gathers the full weight (and the row layer its full input)
and computes the whole product on every rank. Numbers are right; the communication is
all-gathers of weights instead of all-reduces of activations."""
from workbook.grading.labs import run_reference_in
from workbook.tensor_parallel.mappings import tp_rank

run_reference_in(globals(), "tp")


class _GatherRows(torch.autograd.Function):  # noqa: F821 (torch, dist... from the reference)
    """WRONG: all-gather a weight's row slices into the full weight (backward keeps the slice)."""

    @staticmethod
    def forward(ctx, w):
        n = tp_world_size()  # noqa: F821
        if n == 1:
            return w
        full = torch.empty((n * w.shape[0], *w.shape[1:]), dtype=w.dtype, device=w.device)  # noqa: F821
        dist.all_gather_into_tensor(full, w.contiguous())  # noqa: F821
        return full

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(tp_world_size(), dim=0)[tp_rank()].contiguous()  # noqa: F821


def _full_columns(w):
    """WRONG: the full [out, in] weight from every rank's column slices [out, in/n]."""
    return _GatherRows.apply(w.t().contiguous()).t()


class ColumnParallelLinear(ColumnParallelLinear):  # noqa: F821
    def forward(self, x):
        if self.copy_input and not self.gather_output:     # (a full output needs no f)
            x = copy_to_tensor_parallel_region(x)  # noqa: F821
        w = _GatherRows.apply(self.weight)                 # WRONG: the full weight
        b = _GatherRows.apply(self.bias) if self.bias is not None else None
        y = model_ops.linear(x, w, b)                      # noqa: F821 the whole output
        return y if self.gather_output else split_last_dim(y)  # noqa: F821


class RowParallelLinear(RowParallelLinear):  # noqa: F821
    def forward(self, x):
        if self.input_is_parallel:
            x = gather_from_tensor_parallel_region(x)      # noqa: F821 WRONG: the full input
        return model_ops.linear(x, _full_columns(self.weight), self.bias)  # noqa: F821
