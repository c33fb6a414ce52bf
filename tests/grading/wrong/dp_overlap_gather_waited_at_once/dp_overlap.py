"""WRONG ON PURPOSE (dp_overlap_gather_waited_at_once): every parameter all-gather is waited on
as soon as it starts: right numbers, no prefetch hides anything."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "dp_overlap")
_start = ShardedTrainer.start_gather                                          # noqa: F821


def _start_and_wait(self, i):
    _start(self, i)
    self.wait_gather(i)                                   # WRONG: waited at once


ShardedTrainer.start_gather = _start_and_wait                                 # noqa: F821
