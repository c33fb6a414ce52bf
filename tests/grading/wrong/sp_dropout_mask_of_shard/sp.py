"""DELIBERATELY WRONG (autograder self-test, tests/package/test_tp_sp_wrong_caught.py): the
block's dropout draws a mask of the shard's own shape instead of taking this rank's positions of
the reference's mask of the whole sequence, so the dropped positions differ from one device's."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "sp")


class SPBlock(SPBlock):  # noqa: F821 (from the reference)
    def dropout(self, x, site, step):
        if not self.training or self.cfg.dropout == 0.0:
            return x
        return x * dropout_mask(self.cfg, f"{self.name}.{site}.dropout", x.shape, step,  # noqa: F821
                                x.device)                  # WRONG: a [B, S/n, H] mask of its own
