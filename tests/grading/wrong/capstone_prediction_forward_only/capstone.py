"""WRONG ON PURPOSE (capstone_prediction_forward_only): the TP traffic of the forward pass only, as if the backward
moved nothing (it runs the conjugate of every collective, and gathers the column GEMM's input
again)."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "capstone")


def predict_traffic(kind: str, cfg, batch: int, inner: int, dp: int, micro_batches: int,
                    param_bytes: int, inner_rank: int = 0) -> dict:
    """The bytes one rank sends per step in each of its groups (see solutions/)."""
    item = cfg.torch_dtype.itemsize
    b, S, H = batch // dp, cfg.seq_len, cfg.hidden
    out = {"DP": 2 * (dp - 1) / dp * param_bytes}
    if kind == "tp":
        out["TP"] = float((4 * cfg.n_layers + 2) * (inner - 1) * b * (S // inner) * H * item)  # WRONG
    else:
        directions = (inner_rank < inner - 1) + (inner_rank > 0)
        out["PP"] = float(b * S * H * item * directions)
    return out

