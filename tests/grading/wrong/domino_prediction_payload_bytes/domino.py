"""WRONG ON PURPOSE (domino_prediction_payload_bytes): the prediction prices the exposed
all-reduce with the payload bytes, where the ring all-reduce moves the bus bytes (2(n-1)/n times
the payload): right on 2 ranks, where the factor is 1, wrong on 4."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "domino")


def predict_exposed_ms(link, model, batch, p, ranks, inter_layer=True):
    chunk_bytes = 4.0 * batch * model["seq_len"] / p * model["hidden"]
    one = link.latency_s + chunk_bytes / link.bandwidth_Bps     # wrong: payload, not bus bytes
    return (one if inter_layer else 2 * model["n_layers"] * one) * 1e3
