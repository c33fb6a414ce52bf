"""WRONG ON PURPOSE (ep_overlap_prediction_nothing_hidden): ``predict_dispatch_exposed_ms`` gives
the whole exchange's time, the busiest rank's bytes right, but the shared expert that computes
while the tokens travel left out: nothing overlapped."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "ep_overlap")


def predict_dispatch_exposed_ms(link, sent_rows, hidden, itemsize, t_shared_ms):
    n = len(sent_rows)
    busiest = max(max(sum(sent_rows[r][d] for d in range(n) if d != r),
                      sum(sent_rows[s][r] for s in range(n) if s != r)) for r in range(n))
    return 1e3 * (link.latency_s + busiest * hidden * itemsize / link.bandwidth_Bps)  # WRONG
