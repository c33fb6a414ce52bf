"""WRONG ON PURPOSE (pp_overlap_prediction_textbook_step): ``predict_step_ms`` gives the
textbook step, (m + p - 1)(t_f + t_b): the bubble is right, but the transfers that 1F1B's round
trip keeps on the critical path are left out, so on a slow link the prediction is far too low."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_overlap")


def predict_step_ms(link, p, m, shape, itemsize, t_fwd_ms, t_bwd_ms):
    return (m + p - 1) * (t_fwd_ms + t_bwd_ms)            # WRONG: no transfer on the critical path
