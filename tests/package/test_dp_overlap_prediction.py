"""The dp_overlap lab's prediction (``predict_exposed_ms``): the graded settings tell every
classic wrong derivation from the right one, a constant fails, and the report shows prediction /
model / measured, with ``-`` for a prediction not written yet.

No ranks: the prediction is arithmetic on the link model and the buckets.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from workbook.data_parallel import dp_overlap_report as report
from workbook.grading.labs import load_lab

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "grading"))
import test_dp_overlap as grader  # noqa: E402


def _models():
    for lk, buckets, first, n, _ in grader._prediction_settings():
        yield report.exposed_tail(lk, *report.tail_buckets(buckets, first), n)


def test_reference_prediction_passes_and_a_constant_does_not():
    ref = load_lab("dp_overlap", "solutions")
    assert grader._prediction_problem(ref.predict_exposed_ms) is None
    lk, buckets, first, n, _ = next(grader._prediction_settings())
    constant = ref.predict_exposed_ms(lk, buckets, first, n)
    problem = grader._prediction_problem(lambda *args: constant)
    assert problem and "the model gives" in problem and "Recheck each term" in problem


@pytest.mark.parametrize("mistake", ["payload bytes", "(n-1)/n factor", "all-gather or a "
                                     "reduce-scatter", "latency alpha", "summed every bucket",
                                     "only the last bucket", "first layer's own bytes",
                                     "counted the last bucket twice", "gave seconds"])
def test_each_classic_mistake_is_told_apart_somewhere(mistake):
    """On at least one graded setting the mistake's value is more than the tolerance away from
    the model (so it is caught, and named)."""
    apart = [k for model, mistakes in _models() for k, v in mistakes.items()
             if mistake in k and abs(v - model) > 2 * 0.02 * model]
    assert apart, f"no graded setting tells {mistake!r} from the model"


def test_a_wrong_derivation_is_named():
    ref = load_lab("dp_overlap", "solutions")

    def forgot_bus_factor(lk, buckets, first, n):
        return ref.predict_exposed_ms(lk, buckets, first, n) + sum(      # 2 S, not 2(n-1)/n S
            1e3 * 2 / n * sum(p.numel() * p.element_size() for p in b) / lk.bandwidth_Bps
            for b in buckets if any(id(p) in {id(q) for q in first} for p in b))
    problem = grader._prediction_problem(forgot_bus_factor)
    assert problem and "forgot the (n-1)/n factor" in problem, problem


def test_report_shows_a_dash_for_a_stub_prediction():
    from workbook import link

    def stub(*args, **kwargs):
        raise NotImplementedError("not implemented yet: dp_overlap.predict_exposed_ms")
    lk, buckets, first, n, _ = next(grader._prediction_settings())
    trainer = types.SimpleNamespace(buckets=[types.SimpleNamespace(params=b) for b in buckets],
                                    units=[types.SimpleNamespace(parameters=lambda: iter(first))])
    saved = link.current_link()
    link.set_link(lk)
    try:
        assert report._predicted_tail(types.SimpleNamespace(predict_exposed_ms=stub), trainer, n) \
            is None
        ref = load_lab("dp_overlap", "solutions")
        got = report._predicted_tail(ref, trainer, n)
    finally:
        link.set_link(saved)
    model = report.exposed_tail(lk, *report.tail_buckets(buckets, first), n)[0]
    assert got == pytest.approx(model)
    row = {"step_ms": 10.0, "link_ms": 5.0, "exposed_ms": 3.0, "fwd_hidden_pct": None,
           "bwd_hidden_pct": 50.0, "predicted": {"exposed_ms": 2.5},
           "memory": dict.fromkeys(("parameters", "gradients", "optimizer"), 1),
           "memorypredicted": dict.fromkeys(("parameters", "gradients", "optimizer"), 1)}
    result = {"link": lk.label, "trace_dir": "/tmp/x", "variants": {
        **{v: row for v in report.VARIANTS}, "no_comm": {"step_ms": 8.0}},
        "tail": {"predicted": None, "model": model, "buckets": 2}}
    text = report.describe([result, result])
    line = next(x for x in text.splitlines() if x.strip().startswith("bucketed exposed ms"))
    assert line.split()[3] == "-" and f"{model:.3g}" in line and line.split()[-1] == "3", text
