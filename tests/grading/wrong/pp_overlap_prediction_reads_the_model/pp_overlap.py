"""WRONG ON PURPOSE (pp_overlap_prediction_reads_the_model): the prediction is read from the
package's own model of the schedule instead of derived from the link's alpha and beta and the
compute rate; the grader must refuse it however right the number is."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_overlap")


def predict_step_ms(link, p, m, shape, itemsize, t_fwd_ms, t_bwd_ms):                          # noqa: F811
    from workbook.pipeline_parallel.pp_overlap_report import step_model
    return step_model(None, link, shape, itemsize, t_fwd_ms, t_bwd_ms)[0]
