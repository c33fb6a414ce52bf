"""WRONG ON PURPOSE (ep_overlap_prediction_reads_the_model): the prediction is read from the
simulated link's own cost of the exchange instead of derived from its alpha and beta; the
grader must refuse it however right the number is."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "ep_overlap")


def predict_dispatch_exposed_ms(link, sent_rows, hidden, itemsize, t_shared_ms):  # noqa: F811
    matrix = [[c * hidden * itemsize for c in row] for row in sent_rows]
    return max(0.0, 1e3 * link.all_to_all_time(matrix, range(len(matrix))) - t_shared_ms)
