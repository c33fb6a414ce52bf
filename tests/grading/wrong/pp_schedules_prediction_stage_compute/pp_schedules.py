"""WRONG ON PURPOSE (pp_schedules_prediction_stage_compute): ``predict_step_ms`` gives every chunk
action a whole stage's compute: with v chunks a rank runs each micro-batch's F, B and W v times,
each on 1/v of its layers, so the prediction counts the compute v times over."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_schedules")


def predict_step_ms(link, schedule, p, v, m, shape, itemsize, t_f_ms, t_b_ms, t_w_ms):
    rows, seq, hidden = shape
    c_ms = 1e3 * (link.latency_s + rows * seq * hidden * itemsize / link.bandwidth_Bps)
    fn, placement = SCHEDULES[schedule]                                          # noqa: F821
    return simulate_chunked(all_ranks(fn, p, v, m), p, v, placement,           # noqa: F821
                            t_f=t_f_ms, t_b=t_b_ms, t_w=t_w_ms,                  # WRONG: / v
                            t_p2p=c_ms).step
