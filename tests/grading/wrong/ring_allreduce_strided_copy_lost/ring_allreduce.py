"""DELIBERATELY WRONG (autograder self-test, tests/package/test_ring_collectives_wrong_caught.py):
ring_all_reduce runs both (correct) phases on a contiguous copy of a tensor that is not
contiguous, and never copies the result back."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "ring_allreduce")


def ring_all_reduce(tensor, op=SUM):  # noqa: F821 (from the reference)
    n = dist.get_world_size()  # noqa: F821
    if n == 1:
        return tensor
    flat = tensor.reshape(-1)                 # BUG: a copy when the tensor is not contiguous...
    chunks = torch.tensor_split(flat, n)  # noqa: F821
    ring_reduce_scatter(chunks, op)  # noqa: F821
    ring_all_gather(chunks)  # noqa: F821
    return tensor                             # ...and the copy is never written back
