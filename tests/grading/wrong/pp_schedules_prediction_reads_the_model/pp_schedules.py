"""WRONG ON PURPOSE (pp_schedules_prediction_reads_the_model): the prediction is read from the
package's own model of the schedule instead of derived from the link's alpha and beta and the
compute; the grader must refuse it however right the number is."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_schedules")


def predict_step_ms(link, schedule, p, v, m, shape, itemsize, t_f_ms, t_b_ms, t_w_ms):  # noqa: F811
    from workbook.pipeline_parallel.pp_schedules_report import step_model
    fn, placement = SCHEDULES[schedule]                                          # noqa: F821
    return step_model(schedule, all_ranks(fn, p, v, m), placement, link, shape,  # noqa: F821
                      itemsize, t_f_ms, t_b_ms, t_w_ms)[0]
