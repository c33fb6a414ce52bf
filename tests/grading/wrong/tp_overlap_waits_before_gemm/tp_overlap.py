"""WRONG ON PURPOSE (tp_overlap_waits_before_gemm): each ring step waits for its exchange as soon
as it starts, before the GEMM it should hide behind: right numbers, every ring step exposed."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "tp_overlap")
_started = exchange                                                           # noqa: F821


class _Done:
    """A finished exchange (a gloo p2p work must not be waited on twice)."""

    def wait(self, timeout=None):
        return True


def exchange(send, recv):
    for work in _started(send, recv):
        work.wait()                                   # WRONG: waited before the GEMM runs
    return [_Done(), _Done()]
