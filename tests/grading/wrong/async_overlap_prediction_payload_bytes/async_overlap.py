"""WRONG ON PURPOSE (the prediction charges the all-reduce its payload bytes, not its bus bytes)."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "async_overlap")


def predict_pipelined_ms(link, n, chunks, rows, d_in, d_out):
    compute_s = 2.0 * rows * d_in * d_out / link.local_flops
    comm_s = link.latency_s + 4.0 * rows * d_out / link.bandwidth_Bps   # wrong: no 2(n-1)/n
    return (compute_s + comm_s + (chunks - 1) * max(compute_s, comm_s)) * 1e3
