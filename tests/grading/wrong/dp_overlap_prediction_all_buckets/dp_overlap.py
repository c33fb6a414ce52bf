"""WRONG ON PURPOSE (dp_overlap_prediction_all_buckets): every bucket's all-reduce counted as
exposed, though all but those holding a first-layer gradient start during the backward pass and
hide behind it."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "dp_overlap")


def predict_exposed_ms(link, buckets, first_layer, n):                # noqa: F811
    seconds = 0.0
    for bucket in buckets:                                            # WRONG: all of them
        size = sum(p.numel() * p.element_size() for p in bucket)
        seconds += link.latency_s + 2 * (n - 1) / n * size / link.bandwidth_Bps
    return 1e3 * seconds
