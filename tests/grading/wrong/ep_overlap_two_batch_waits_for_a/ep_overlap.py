"""WRONG ON PURPOSE (ep_overlap_two_batch_waits_for_a): the forward schedule waits for A's
dispatch before B computes its router, so nothing runs while A's tokens travel."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "ep_overlap")

_reference_schedule = two_batch_schedule                                        # noqa: F821


def two_batch_schedule(phase, deferred_wgrad=False):
    if phase != "forward":
        return _reference_schedule(phase, deferred_wgrad)
    return [("compute", "A", "router"), ("start", "A", "dispatch"),
            ("wait", "A", "dispatch"),                  # WRONG: before B's router, not after
            ("compute", "B", "router"), ("start", "B", "dispatch"),
            ("compute", "A", "experts"), ("start", "A", "combine"),
            ("wait", "B", "dispatch"), ("compute", "B", "experts"), ("start", "B", "combine"),
            ("wait", "A", "combine"), ("wait", "B", "combine")]
