"""WRONG ON PURPOSE (pp_schedules_no_refusal): interleaved 1F1B that never checks the shape:
with m not a multiple of p it returns nothing instead of raising Megatron's one-line error."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_schedules")
_reference = interleaved_1f1b                                                  # noqa: F821


def interleaved_1f1b(p, v, m, rank):
    if v > 1 and m % p:
        return []                                              # WRONG: raise ValueError instead
    return _reference(p, v, m, rank)


SCHEDULES["interleaved_1f1b"] = (interleaved_1f1b, INTERLEAVED)               # noqa: F821
