"""WRONG ON PURPOSE (pp_schedules_receive_not_prefetched): the executor posts only the running
action's receive and waits for it at once: nothing computes while the data travels."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_schedules")


def prefetch(self):
    self.post_receive(self.position)          # WRONG: the next receiving action's is not posted


OverlappedChunkedExecutor.prefetch = prefetch                                  # noqa: F821
