"""``workbook.model.memory.tensor_parallel_bytes`` predicts, from the single-device block alone,
the bytes one rank of a Megatron TP block saves for backward. The sp grader relies on it to grade
lab 5 without the learner's lab 4, so it is checked here against the reference TP block
(``solutions/tp.py``) measured on 2, 3 and 4 ranks: to the byte."""
from __future__ import annotations

import pytest

from workbook.grading.engine import on_ranks


def _measure():
    import torch
    import torch.distributed as dist
    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig
    from workbook.model.memory import saved_bytes_by_region, tensor_parallel_bytes
    tp, n = load_lab("tp", "solutions"), dist.get_world_size()
    out = []
    for cfg in (ModelConfig(dtype="float64", dropout=0.1), ModelConfig(style="llama", dtype="float64"),
                ModelConfig.odd_shapes(dtype="float64", dropout=0.1)):
        try:
            cfg.validate(tp=n)
        except ValueError:
            continue
        block = tp.TPBlock(cfg, 0)
        x = torch.randn(2, cfg.seq_len, cfg.hidden, dtype=torch.float64, requires_grad=True)
        measured = saved_bytes_by_region(lambda: block(x, step=1), block, (tp.TPAttention, tp.TPMLP),
                                         outside="sequence")
        out.append((f"{cfg.style} hidden {cfg.hidden}", measured, tensor_parallel_bytes(cfg, n)))
    return out


@pytest.mark.parametrize("n", [2, 3, 4])
def test_tp_bytes_predicted_exactly(n):
    cases = on_ranks(n, _measure, timeout=120)[0]
    assert cases, f"no config splits over {n} ranks"
    for what, measured, predicted in cases:
        assert measured == predicted, f"{what} on {n} ranks: measured {measured}, predicted {predicted}"
