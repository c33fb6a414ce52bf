"""WRONG ON PURPOSE (the prediction adds every chunk's compute and all-reduce, as if the pipeline
overlapped nothing)."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "async_overlap")


def predict_pipelined_ms(link, n, chunks, rows, d_in, d_out):
    compute_s = 2.0 * rows * d_in * d_out / link.local_flops
    comm_s = link.latency_s + 4.0 * rows * d_out * 2 * (n - 1) / n / link.bandwidth_Bps
    return chunks * (compute_s + comm_s) * 1e3          # wrong: the serial schedule's time
