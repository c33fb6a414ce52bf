"""WRONG ON PURPOSE (cp_ring_prediction_full_block): the prediction of the forward pass's exposed
K/V exchange counts every ring step's attention as one full (S/n) x (S/n) block; the zig-zag
split computes chunk-sized blocks of L = S/2n, three at step 0 and two at every later step, so
a step hides less than this derivation says."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "cp_ring")


def predict_forward_exposed_ms(lk, n, seq_len, batch, heads, head_dim, dtype):
    import torch
    e = torch.empty((), dtype=dtype).element_size()
    c = seq_len // n
    hop_s = lk.latency_s + 2 * batch * heads * c * head_dim * e / lk.bandwidth_Bps
    step_s = 4 * batch * heads * c * c * head_dim / lk.local_flops     # WRONG: a full block a step
    return sum(max(0.0, hop_s - step_s) for _ in range(n - 1)) * 1e3
