"""WRONG ON PURPOSE (ep_overlap_prediction_total_bytes): ``predict_dispatch_exposed_ms`` divides
the bytes of the whole exchange, every pair's, by the link's bandwidth, as if one link carried
them one after another; the ranks send and receive at once, so the busiest rank's bytes set the
time, and the prediction comes out too high."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "ep_overlap")


def predict_dispatch_exposed_ms(link, sent_rows, hidden, itemsize, t_shared_ms):
    n = len(sent_rows)
    moved = sum(sent_rows[s][d] for s in range(n) for d in range(n) if s != d)   # WRONG: busiest
    t_ms = 1e3 * (link.latency_s + moved * hidden * itemsize / link.bandwidth_Bps)
    return max(0.0, t_ms - t_shared_ms)
