"""The cp_ring lab's prediction (the forward pass's exposed K/V exchange on the zig-zag split):
the graded settings tell the derivations apart, the grader names each classic mistake, and the
report shows prediction / model / measured with ``-`` for a prediction not written yet.

No ranks: the prediction is arithmetic on the link model.
"""
from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import torch

from workbook import link
from workbook.context_parallel import cp_ring_report as report
from workbook.grading.labs import load_lab
from workbook.grading.predictions import REL_TOL, judge_prediction

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "grading"))
import test_cp_ring as grader  # noqa: E402


def _settings():
    for preset, n, S, b, h, d, dtype in grader.PREDICTION_CASES:
        lk = link.make_link(preset, grader.PREDICTION_FLOPS)
        yield lk, (n, S, b, h, d), dtype, torch.empty((), dtype=dtype).element_size()


def _judge(predict) -> str | None:
    for lk, shape, dtype, e in _settings():
        message = judge_prediction(predict(lk, *shape, dtype),
                                   report.forward_exposed_model_ms(lk, *shape, e),
                                   report.forward_exposed_mistakes(lk, *shape, e), what="x",
                                   terms=grader.PREDICTION_TERMS)
        if message:
            return message
    return None


def test_settings_differ_and_every_hop_of_the_model_is_exposed():
    """Presets, rank counts and dtypes all vary; in each, the model's every hop outlasts its step
    (so no term hides behind the max(0, .)), and at least one setting runs more than 2 ranks."""
    settings = list(_settings())
    assert len({lk.preset for lk, *_ in settings}) >= 2
    assert len({shape[0] for _, shape, _, _ in settings}) >= 2
    assert len({dtype for _, _, dtype, _ in settings}) == 2
    for lk, (n, S, b, h, d), _, e in settings:
        full = report.forward_exposed_model_ms(lk, n, S, b, h, d, e)
        hops_only = report.forward_exposed_model_ms(lk, n, S, b, h, d, e, compute=False)
        hop_ms = hops_only / (n - 1)
        block_ms = 4 * b * h * (S // (2 * n)) ** 2 * d / lk.local_flops * 1e3
        assert all(hop_ms > k * block_ms for k in report.zigzag_blocks_per_step(n)[:n - 1])
        assert 0 < full < hops_only


def test_reference_prediction_passes_and_a_constant_does_not():
    ref = load_lab("cp_ring", "solutions")
    assert _judge(ref.predict_forward_exposed_ms) is None
    lk, shape, dtype, _ = next(_settings())
    constant = ref.predict_forward_exposed_ms(lk, *shape, dtype)
    assert _judge(lambda *args: constant) is not None


def test_each_mistake_is_named_on_some_setting():
    """Every wrong derivation differs from the model by more than the tolerance on at least one
    graded setting, and there the grader's message names it."""
    names = set()
    for lk, shape, _, e in _settings():
        model = report.forward_exposed_model_ms(lk, *shape, e)
        for what, value in report.forward_exposed_mistakes(lk, *shape, e).items():
            if math.isclose(value, model, rel_tol=2 * REL_TOL):
                continue
            message = judge_prediction(value, model, report.forward_exposed_mistakes(lk, *shape, e),
                                       what="x")
            assert message and what in message, (what, message)
            names |= {part.split(":")[0] for part in what.split("; or ")}
    for term in ("count only K", "count a step's attention as one full", "bytes per element",
                 "count elements as bytes", "leave out the latency", "a hop at the last step",
                 "add the send's and the receive's", "add up the hops' whole transfer",
                 "every hop hides"):
        assert any(term in name for name in names), term


def test_report_shows_prediction_model_and_measured_and_a_stub_as_dash():
    lk = link.make_link(report.LINK, 1e11)

    def stub(*args):
        raise NotImplementedError("not implemented yet: cp_ring.predict_forward_exposed_ms")

    ref = load_lab("cp_ring", "solutions")
    for lab, shown in ((types.SimpleNamespace(predict_forward_exposed_ms=stub), "-"),
                       (ref, None)):
        pred = report._prediction(lab, lk, 2, torch.float32, 4)
        row = {"work": [1, 1], "step_ms": 1.0, "link_ms": 1.0, "exposed_ms": 0.0,
               "forward_pct": 100.0, "backward_pct": 50.0, "step_attention_ms": [1.0, 1.0],
               "forward_exposed_ms": 3.0}
        results = [{"link": lk.label, "hop_bytes": 4_000_000, "hop_ms": 50.0, "trace_dir": "/x",
                    "prediction": pred, "splits": {s: dict(row) for s in report.SPLITS}}] * 2
        text = report.describe(results)
        line = next(t for t in text.splitlines() if t.strip().startswith(report.PREDICTED))
        cells = line.split()[-3:]
        assert cells[0] == (shown or f"{pred['predicted']:.3g}")
        assert cells[1] == f"{pred['model']:.3g}" and cells[2] == "3"
    assert report._prediction(ref, None, 2, torch.float32, 4) == {"predicted": None,
                                                                    "model": None}
