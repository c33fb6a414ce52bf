"""DELIBERATELY WRONG (autograder self-test, tests/package/test_tp_sp_wrong_caught.py): the norms'
parameters are not tagged sequence-parallel, so sync_sequence_parallel_grads skips them: each
rank keeps the gradient of its own positions only."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "sp")


def sp_norm(cfg, name, device):
    return make_norm(cfg, name).to(device)           # noqa: F821 WRONG: not tagged, never synchronised
