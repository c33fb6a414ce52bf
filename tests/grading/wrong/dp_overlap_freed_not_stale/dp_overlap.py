"""DELIBERATELY WRONG (tests/package/test_dead_ranks.py): ZeRO-3 frees a layer's flat parameter
buffer after its forward pass but does not mark the layer stale, so the backward pass never
gathers it again and reads the freed memory: the rank is killed by SIGSEGV (or reads garbage)."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "dp_overlap")


def _after_forward(self, i, out):
    out.register_hook(lambda _grad: self.before_backward(i))
    if i < len(self.flats) - 1:
        self.flats[i].free_params()                 # WRONG: freed, but not added to self.stale


Zero3.after_forward = _after_forward                                          # noqa: F821
