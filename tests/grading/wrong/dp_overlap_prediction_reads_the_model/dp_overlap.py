"""WRONG ON PURPOSE (dp_overlap_prediction_reads_the_model): the prediction is read from the
package's own model of the schedule instead of derived from the link's alpha and beta and the
compute rate; the grader must refuse it however right the number is."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "dp_overlap")


def predict_exposed_ms(link, buckets, first_layer, n):                          # noqa: F811
    from workbook.data_parallel.dp_overlap_report import exposed_tail, tail_buckets
    return exposed_tail(link, *tail_buckets(buckets, first_layer), n)[0]
