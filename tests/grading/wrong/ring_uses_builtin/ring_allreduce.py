"""DELIBERATELY WRONG (autograder self-test, tests/package/test_wrong_impls_caught.py):
ring_all_reduce hands the work to dist.all_reduce: right numbers, wrong communication."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "ring_allreduce")


def ring_all_reduce(tensor, op=SUM):  # noqa: F821 (from the reference)
    if dist.get_world_size() == 1:  # noqa: F821
        return tensor
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    dist.all_reduce(flat, op=op)  # noqa: F821 BUG: the built-in does the work
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view(tensor.shape))
    return tensor
