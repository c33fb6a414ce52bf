"""WRONG ON PURPOSE (cp_ring_softmax_not_rescaled): the online-softmax merge rescales only the new
block to the new running max; the earlier partial keeps its old scale, so whenever a later block
raises the max, the earlier keys weigh too much in acc and l."""
import torch

from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "cp_ring")


def merge_partials(a, b):
    m = torch.maximum(a.m, b.m)
    sb = torch.exp(b.m - m)
    acc = a.acc + b.acc * sb.unsqueeze(-1)                # WRONG: a.acc not rescaled by exp(a.m - m)
    return Partial(acc, m, a.l + b.l * sb)                # noqa: F821 - WRONG: nor a.l
