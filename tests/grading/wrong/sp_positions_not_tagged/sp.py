"""DELIBERATELY WRONG (autograder self-test, tests/package/test_tp_sp_wrong_caught.py): the
learned positions (gpt) are added to each rank's shard but not tagged sequence-parallel, so
sync_sequence_parallel_grads skips them: each rank keeps the gradient of its own positions only."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "sp")


class SPEmbedding(SPEmbedding):  # noqa: F821 (from the reference)
    def __init__(self, cfg, device=None):
        super().__init__(cfg, device)
        if cfg.style == "gpt":
            self.pos.weight.sequence_parallel = False      # WRONG: never synchronised
