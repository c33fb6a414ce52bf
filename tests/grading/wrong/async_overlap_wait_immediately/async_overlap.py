"""WRONG ON PURPOSE (each all-reduce is waited on right after it starts: correct numbers, nothing
overlapped)."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "async_overlap")


def overlapped_all_reduce(tensor, compute):
    work = dist.all_reduce(tensor, async_op=True)  # noqa: F821 (from the reference)
    work.wait()                            # wrong: too early, compute() has not run yet
    return compute()


def pipelined_all_reduce(chunks, layer):
    outputs = []
    for x in chunks:
        y = layer(x)
        dist.all_reduce(y, async_op=True).wait()  # noqa: F821 wrong: too early, the next chunk has not started
        outputs.append(y)
    return outputs
