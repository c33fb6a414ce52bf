"""WRONG ON PURPOSE (pp_overlap_microbatches_out_of_order): in 1F1B's steady state each stage
runs the backward of the micro-batch it just ran forward (the newest), not the oldest one
waiting; the oldest wait for the drain. Every stage does the same, so the numbers still come
out right, but micro-batches no longer leave the pipeline in the order they entered it."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_overlap")


def one_f_one_b(p, m, stage):
    warmup = min(p - 1 - stage, m)
    actions = [("F", i) for i in range(warmup)]
    for j in range(m - warmup):
        actions += [("F", warmup + j), ("B", warmup + j)]     # WRONG: the newest, not B(j)
    return actions + [("B", j) for j in range(warmup)]


SCHEDULES["1f1b"] = one_f_one_b                                                # noqa: F821
