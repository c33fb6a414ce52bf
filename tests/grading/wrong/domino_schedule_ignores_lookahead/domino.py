"""WRONG ON PURPOSE (domino_schedule_ignores_lookahead): the schedule prepares each unit right
before computing it, whatever the lookahead: the numbers are right, the backward waits at once."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "domino")
_reference_schedule = schedule  # noqa: F821 (from the reference)


def schedule(stages, p, lookahead=1, inter_layer=True):
    return _reference_schedule(stages, p, 0, inter_layer)   # wrong: lookahead ignored
