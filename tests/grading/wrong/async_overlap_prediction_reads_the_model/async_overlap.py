"""WRONG ON PURPOSE (async_overlap_prediction_reads_the_model): the prediction is read from the
package's own model of the schedule instead of derived from the link's alpha and beta and the
compute rate; the grader must refuse it however right the number is."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "async_overlap")


def predict_pipelined_ms(link, n, chunks, rows, d_in, d_out):                          # noqa: F811
    from workbook.communication.async_overlap_report import pipelined_model_ms
    return pipelined_model_ms(link, n, chunks, rows, d_in, d_out)
