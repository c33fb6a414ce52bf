"""WRONG ON PURPOSE (cp_ring_mask_on_wrong_block): the causal mask lands on the earlier block
instead of the diagonal one: an earlier chunk is masked to its lower triangle, the diagonal chunk
is taken whole (each query sees the future keys of its own chunk)."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "cp_ring")


def block_mask(q_chunk, kv_chunk):
    if kv_chunk > q_chunk:
        return SKIP                                                       # noqa: F821
    return FULL if kv_chunk == q_chunk else CAUSAL      # noqa: F821 - WRONG: the two swapped
