"""DELIBERATELY WRONG (autograder self-test, tests/package/test_wrong_impls_caught.py):
tree_broadcast passes the tensor along a chain (n-1 rounds), not a binomial tree."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "collectives")


def tree_broadcast(tensor, src=0):
    rank, n = dist.get_rank(), dist.get_world_size()      # noqa: F821 (from the reference)
    v = (rank - src) % n
    if v > 0:                                             # BUG: a chain, not a tree:
        dist.recv(tensor, src=(v - 1 + src) % n)          # noqa: F821 n-1 rounds instead of log2 n
    if v + 1 < n:
        dist.send(tensor, dst=(v + 1 + src) % n)          # noqa: F821
    return tensor
