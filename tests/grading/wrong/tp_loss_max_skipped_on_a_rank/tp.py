"""DELIBERATELY WRONG (tests/package/test_dead_ranks.py): the vocab-parallel cross-entropy takes
the maximum over the ranks only where ``rank == 0``; rank 1 skips that all-reduce, so from there
on the ranks' all-reduces pair up wrongly, and when two paired calls carry tensors of different
sizes gloo aborts the process (SIGABRT, "collective mismatch")."""
import torch.distributed as dist

from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "tp")


def vocab_parallel_cross_entropy(local_logits, targets, vocab_size):
    start, stop = vocab_range(vocab_size)                                      # noqa: F821
    m = local_logits.detach().amax(dim=-1, keepdim=True)                      # [B, S, 1]
    if dist.get_rank() == 0:                                 # WRONG: every rank must call it
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
    shifted = local_logits - m
    sum_exp = reduce_from_tensor_parallel_region(shifted.exp().sum(dim=-1))   # noqa: F821
    is_mine = (targets >= start) & (targets < stop)
    local_t = (targets - start).clamp(0, stop - start - 1)
    picked = shifted.gather(-1, local_t.unsqueeze(-1)).squeeze(-1) * is_mine.to(shifted.dtype)
    return (sum_exp.log() - reduce_from_tensor_parallel_region(picked)).mean()  # noqa: F821
