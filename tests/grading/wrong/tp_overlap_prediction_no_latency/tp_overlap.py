"""WRONG ON PURPOSE (tp_overlap_prediction_no_latency): the prediction of the ring's exposed
communication leaves out the link's latency, which every one of the n - 1 exchanges pays."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "tp_overlap")


def predict_ring_exposed_ms(link, n, batch, seq, hidden, out_features, element_bytes=4):
    if n <= 1:
        return 0.0
    rows = batch * (seq // n)
    t_c = rows * hidden * element_bytes / link.bandwidth_Bps     # WRONG: no link.latency_s
    t_g = 2 * rows * hidden * out_features / link.local_flops
    return 1e3 * (n - 1) * max(0.0, t_c - t_g)
