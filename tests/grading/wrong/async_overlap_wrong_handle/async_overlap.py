"""WRONG ON PURPOSE (the pipelined loop waits on the chunk it just started instead of the previous
one)."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "async_overlap")


def pipelined_all_reduce(chunks, layer):
    outputs, pending = [], None
    for x in chunks:
        y = layer(x)
        work = dist.all_reduce(y, async_op=True)  # noqa: F821 (from the reference)
        if pending is not None:
            work.wait()                    # wrong handle: should be the previous chunk's
        pending = work
        outputs.append(y)
    if pending is not None:
        pending.wait()
    return outputs
