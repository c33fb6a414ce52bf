"""WRONG ON PURPOSE (pp_schedules_prediction_textbook_bubble): ``predict_step_ms`` gives the
textbook step of interleaved 1F1B, the busy time m(t_F + t_B + t_W) over 1 - (p - 1)/(v m + p - 1):
the bubble is the formula's, but the transfers that land on the critical path are left out, so
on a slow link the prediction is far too low."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_schedules")


def predict_step_ms(link, schedule, p, v, m, shape, itemsize, t_f_ms, t_b_ms, t_w_ms):
    busy = m * (t_f_ms + t_b_ms + t_w_ms)
    return busy / (1 - (p - 1) / (v * m + p - 1))       # WRONG: no transfer on the critical path
