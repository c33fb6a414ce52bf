"""The domino lab's prediction: the graded settings are what the task promises, and the report
shows prediction / model / measured, with ``-`` for a prediction not written yet.

No ranks: the prediction is arithmetic on the link model and the lesson's planner.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from workbook import link
from workbook.grading.labs import load_lab
from workbook.tensor_parallel import domino_plan, domino_report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "grading"))
import test_domino as grader  # noqa: E402


def _settings():
    for preset, flops, model, batch, p, ranks, inter in grader.PREDICTION_SETTINGS:
        lk = link.make_link(preset, flops)
        yield lk, model, batch, p, ranks, inter


def test_graded_settings_are_compute_bound_with_p_at_least_3():
    for lk, model, batch, p, ranks, _ in _settings():
        shortest, one = domino_plan.chunk_seconds(model=model, batch=batch, p=p,
                                                  flops_rate=lk.local_flops, lk=lk, ranks=ranks)
        assert p >= 3 and shortest > 1.1 * one, (lk.preset, shortest, one)


def test_reference_prediction_passes_and_a_constant_does_not():
    ref = load_lab("domino", "solutions")
    assert grader._prediction_problem(ref.predict_exposed_ms) is None
    first = next(_settings())
    constant = ref.predict_exposed_ms(*first)
    problem = grader._prediction_problem(lambda *args: constant)
    assert problem and "the model gives" in problem


@pytest.mark.parametrize("mistake", ["payload bytes", "latency", "hides every all-reduce",
                                     "intra-layer schedule"])
def test_each_classic_mistake_is_named_somewhere(mistake):
    named = [k for lk, model, batch, p, ranks, inter in _settings()
             for k in grader._prediction_mistakes(lk, model, batch, p, ranks, inter) if mistake in k]
    assert named, f"no mistake about {mistake!r} in the grader's list"


def test_report_shows_a_dash_for_a_stub_prediction():
    def stub(*args, **kwargs):
        raise NotImplementedError("not implemented yet: domino.predict_exposed_ms")
    ref = load_lab("domino", "solutions")
    lab = types.SimpleNamespace(predict_exposed_ms=stub, schedule=ref.schedule)
    lk = link.make_link(domino_report.LINK, 50e9)
    pred = domino_report._prediction(lab, lk, 2)
    assert pred["predicted"] is None and pred["model"] > 0
    phase = {"comm_ms": 100.0, "hidden_ms": 80.0, "skew_ms": 5.0}
    results = [{"prediction": pred, "domino_forward": phase, "domino_backward": phase}] * 2
    lines = domino_report._prediction_lines(results)
    row = next(line for line in lines if "Domino step, exposed" in line)
    assert row.split()[3] == "-" and "30" in row, lines
