"""WRONG ON PURPOSE (cp_ring_prediction_reads_the_model): the prediction is read from the
package's own model of the schedule instead of derived from the link's alpha and beta and the
compute rate; the grader must refuse it however right the number is."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "cp_ring")


def predict_forward_exposed_ms(lk, n, seq_len, batch, heads, head_dim, dtype):                          # noqa: F811
    from workbook.context_parallel.cp_ring_report import forward_exposed_model_ms
    return forward_exposed_model_ms(lk, n, seq_len, batch, heads, head_dim, 4)
