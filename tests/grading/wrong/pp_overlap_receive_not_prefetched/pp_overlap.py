"""WRONG ON PURPOSE (pp_overlap_receive_not_prefetched): the overlapped executor posts each
receive only when its action starts and waits for it at once: nothing computes while the data
travels, so the steady state's receives are all exposed."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_overlap")


def _prefetch_nothing(self):
    self.post_receive(self.position)          # WRONG: the next action's receive is not posted ahead


OverlappedExecutor.prefetch = _prefetch_nothing                               # noqa: F821
