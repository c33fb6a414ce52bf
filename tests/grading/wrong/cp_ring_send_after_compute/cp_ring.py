"""WRONG ON PURPOSE (cp_ring_send_after_compute): each ring hop is posted only after the step's
attention has been computed, and waited on at once: the right numbers, every K/V (and dK/dV)
transfer exposed. Here the hop is posted when the reference waits for it (after the compute)."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "cp_ring")
_post = start_ring_exchange                                               # noqa: F821


class _PostedLate:
    """A hop that is posted only when it is waited for."""

    def __init__(self, send):
        self.send = send

    def wait(self):
        return _post(self.send).wait()           # WRONG: posted after the compute, waited at once


def start_ring_exchange(send):
    return _PostedLate(send)
