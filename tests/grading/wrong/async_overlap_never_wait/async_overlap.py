"""WRONG ON PURPOSE (the async works are never waited on: the sums may not have arrived)."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "async_overlap")


def overlapped_all_reduce(tensor, compute):
    work = dist.all_reduce(tensor, async_op=True)  # noqa: F821,F841 (from the reference)
    result = compute()                     # wrong: work.wait() is missing
    return result


def pipelined_all_reduce(chunks, layer):
    outputs, pending = [], None
    for x in chunks:
        y = layer(x)
        work = dist.all_reduce(y, async_op=True)  # noqa: F821
        pending = work                     # wrong: never waited
        outputs.append(y)
    return outputs
