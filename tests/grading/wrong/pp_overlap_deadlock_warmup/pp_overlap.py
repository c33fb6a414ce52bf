"""WRONG ON PURPOSE (pp_overlap_deadlock_warmup): 1F1B's warm-up counted from the wrong end,
``stage`` forwards instead of ``p - 1 - stage``: stage 0 starts its first backward at once and
waits for a gradient that stage 1 cannot make before stage 0 sends it another activation. On
ranks every stage would hang; the schedule check finds the deadlock on paper first."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_overlap")


def one_f_one_b(p, m, stage):
    warmup = min(stage, m)                                    # WRONG: should be p - 1 - stage
    actions = [("F", i) for i in range(warmup)]
    for j in range(m - warmup):
        actions += [("F", warmup + j), ("B", j)]
    return actions + [("B", j) for j in range(m - warmup, m)]


SCHEDULES["1f1b"] = one_f_one_b                                                # noqa: F821
