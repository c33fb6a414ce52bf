"""DELIBERATELY WRONG (autograder self-test, tests/package/test_ring_collectives_wrong_caught.py):
ring_time prices every step as a message of the whole tensor, where the ring sends one chunk."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "ring_allreduce")


def ring_time(size_bytes, n, alpha, beta):
    return 2 * (n - 1) * (alpha + size_bytes / beta)          # BUG: S per step, not S / n
