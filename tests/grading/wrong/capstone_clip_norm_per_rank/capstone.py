"""WRONG ON PURPOSE (capstone_clip_norm_per_rank): the clipping norm is this rank's shard's,
never summed over the TP group, so each TP rank clips by a different factor."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "capstone")


def global_grad_norm(params, mesh):
    squares = sum((p.grad ** 2).sum() for p in params if p.grad is not None)
    return squares.sqrt()                                             # WRONG: no all-reduce
