"""WRONG ON PURPOSE (domino_never_waits): WaitInBackward never waits, so backward handles leak
(and the gradient may be read in flight)."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "domino")


class WaitInBackward(WaitInBackward):  # noqa: F821 (from the reference)
    @staticmethod
    def backward(ctx, g):
        return g, None, None                 # wrong: the backward all-reduce is never waited on
