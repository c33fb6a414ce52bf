"""DELIBERATELY WRONG (autograder self-test, tests/package/test_tp_sp_wrong_caught.py): the
vocab-parallel loss shifts each rank's logits by the maximum of its own slice, never the maximum
over the whole vocabulary, so the ranks' sums of exponentials are on different scales."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "tp")


def vocab_parallel_cross_entropy(local_logits, targets, vocab_size):
    start, stop = vocab_range(vocab_size)  # noqa: F821 (from the reference)
    m = local_logits.detach().amax(dim=-1, keepdim=True)        # WRONG: this rank's slice only
    shifted = local_logits - m
    sum_exp = reduce_from_tensor_parallel_region(shifted.exp().sum(dim=-1))  # noqa: F821
    is_mine = (targets >= start) & (targets < stop)
    local_t = (targets - start).clamp(0, stop - start - 1)
    picked = shifted.gather(-1, local_t.unsqueeze(-1)).squeeze(-1) * is_mine.to(shifted.dtype)
    return (sum_exp.log() - reduce_from_tensor_parallel_region(picked)).mean()  # noqa: F821
