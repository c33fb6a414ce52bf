"""WRONG ON PURPOSE (pp_schedules_interleaved_round_robin): interleaved 1F1B that switches chunk
at every micro-batch (chunk k mod v) instead of every p micro-batches. Every action is there and
nothing deadlocks, but it is not Megatron's order: the grader names the first action that
differs from PyTorch's ScheduleInterleaved1F1B."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_schedules")


def interleaved_1f1b(p, v, m, rank):
    check_interleaved_shape(p, v, m)                                           # noqa: F821
    warm = min(v * m, (v - 1) * p + 2 * (p - 1 - rank) if v > 1 else p - 1 - rank)
    taken = {"F": [0] * v, "B": [0] * v}

    def action(kind, k):
        c = k % v if kind == "F" else v - 1 - k % v          # WRONG: should be (k // p) % v
        taken[kind][c] += 1
        return (kind, taken[kind][c] - 1, c)

    actions = [action("F", k) for k in range(warm)]
    for j in range(v * m - warm):
        actions += [action("F", warm + j), action("B", j)]
    return actions + [action("B", j) for j in range(v * m - warm, v * m)]


SCHEDULES["interleaved_1f1b"] = (interleaved_1f1b, INTERLEAVED)               # noqa: F821
