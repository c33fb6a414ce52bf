"""DELIBERATELY WRONG (autograder self-test, tests/package/test_ring_collectives_wrong_caught.py):
all_reduce reduces to rank 0 and stops there: the reduced result never reaches the other ranks."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "collectives")


def all_reduce(tensor, op=SUM):  # noqa: F821 (from the reference)
    tree_reduce(tensor, dst=0, op=op)  # noqa: F821 BUG: no broadcast afterwards
    return tensor
