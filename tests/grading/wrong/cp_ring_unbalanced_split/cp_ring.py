"""WRONG ON PURPOSE (cp_ring_unbalanced_split): the "zig-zag" split gives rank r the neighbouring
chunks 2r and 2r+1: the 2n chunks are there, but it is the contiguous split again, and the last
rank's queries do most of the causal work."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "cp_ring")


def zigzag_layout(seq_len, n):
    return Layout(seq_len, tuple((2 * r, 2 * r + 1) for r in range(n)), "zigzag")   # noqa: F821
