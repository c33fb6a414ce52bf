"""WRONG ON PURPOSE (pp_overlap_prediction_no_latency): ``predict_step_ms`` costs a transfer as
its bytes over the bandwidth alone, the link's latency (alpha) left out: on a link whose latency
is a large part of a transfer, the prediction falls well short of the model."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_overlap")


def predict_step_ms(link, p, m, shape, itemsize, t_fwd_ms, t_bwd_ms):
    rows, seq, hidden = shape
    c_ms = 1e3 * rows * seq * hidden * itemsize / link.bandwidth_Bps    # WRONG: + link.latency_s
    return simulate(all_stages(one_f_one_b, p, m), t_fwd_ms, t_bwd_ms, c_ms).step  # noqa: F821
