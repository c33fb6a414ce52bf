"""DELIBERATELY WRONG (autograder self-test, tests/package/test_wrong_impls_caught.py): broadcast
calls dist.broadcast instead of sending point-to-point messages."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "collectives")


def broadcast(tensor, src=0):
    dist.broadcast(tensor, src=src)                       # noqa: F821 BUG: the built-in does the work
    return tensor
