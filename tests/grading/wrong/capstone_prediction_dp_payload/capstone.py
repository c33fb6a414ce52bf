"""WRONG ON PURPOSE (capstone_prediction_dp_payload): the DP traffic as the gradients' bytes (the payload), not the
bus bytes a ring all-reduce sends, 2 (dp - 1) / dp of it."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "capstone")


def predict_traffic(kind: str, cfg, batch: int, inner: int, dp: int, micro_batches: int,
                    param_bytes: int, inner_rank: int = 0) -> dict:
    """The bytes one rank sends per step in each of its groups (see solutions/)."""
    item = cfg.torch_dtype.itemsize
    b, S, H = batch // dp, cfg.seq_len, cfg.hidden
    out = {"DP": float(param_bytes)}                                   # WRONG: the payload
    if kind == "tp":
        out["TP"] = float((10 * cfg.n_layers + 4) * (inner - 1) * b * (S // inner) * H * item)
    else:
        directions = (inner_rank < inner - 1) + (inner_rank > 0)
        out["PP"] = float(b * S * H * item * directions)
    return out

