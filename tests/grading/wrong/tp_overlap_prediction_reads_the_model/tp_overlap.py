"""WRONG ON PURPOSE (tp_overlap_prediction_reads_the_model): the prediction is read from the
package's own model of the schedule instead of derived from the link's alpha and beta and the
compute rate; the grader must refuse it however right the number is."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "tp_overlap")


def predict_ring_exposed_ms(link, n, batch, seq, hidden, out_features, element_bytes=4):                          # noqa: F811
    from workbook.tensor_parallel.tp_overlap_report import modelled_ring_exposed_ms
    return modelled_ring_exposed_ms(link, n, batch, seq, hidden, out_features, element_bytes)
