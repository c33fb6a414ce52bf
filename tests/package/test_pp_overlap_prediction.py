"""The pp_overlap prediction's model and report, without ranks.

* ``step_model`` is ``simulate``'s step with the link's alpha-beta time for one activation; on
  two stages it equals the lesson's closed form ``(m + 1)(t_f + t_b) + 2 ceil(m / 2) c``;
* every known wrong derivation the grader names gives another value than the model's in at
  least one of the grader's settings (else the grader could never name it), and the settings'
  models differ (a hard-coded number fails);
* the report's comparison shows ``-`` where the prediction is not written yet (a stub), and the
  prediction, the model and the measurement where they are.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from workbook.link import Link, make_link
from workbook.pipeline_parallel import pp_overlap_report as report

GRADER = Path(__file__).resolve().parents[1] / "grading" / "test_pp_overlap.py"


def _grader():
    spec = importlib.util.spec_from_file_location("_pp_overlap_grader", GRADER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _one_f_one_b(p, m):
    return [_grader()._expected("1f1b", p, m, s) for s in range(p)]


def test_model_by_hand():
    lk = Link("dgx-h100", bandwidth_Bps=1e6, latency_s=0.01, local_flops=1e9, scale=1.0)
    # one activation [2, 10, 50] fp32 = 4000 B: c = 0.01 + 0.004 s = 14 ms
    assert math.isclose(report.transfer_ms(lk, (2, 10, 50), 4), 14.0)
    for m in (1, 2, 5, 8):
        model, _ = report.step_model(_one_f_one_b(2, m), lk, (2, 10, 50), 4, 20.0, 45.0)
        assert math.isclose(model, (m + 1) * 65.0 + 2 * math.ceil(m / 2) * 14.0)
    model, mistakes = report.step_model(_one_f_one_b(4, 8), lk, (2, 10, 50), 4, 20.0, 45.0)
    book = 11 * 65.0
    assert model > book + 2 * 3 * 14.0                     # more than the fill and the drain
    assert math.isclose(mistakes[next(k for k in mistakes if "transfers out" in k)], book)


def test_every_mistake_is_told_apart_in_some_setting():
    grader = _grader()
    models, apart = [], {}
    for preset, p, m, shape, itemsize, t_fwd, t_bwd in grader.PREDICTION_CASES:
        lk = make_link(preset, grader.PREDICTION_FLOPS)
        model, mistakes = report.step_model(_one_f_one_b(p, m), lk, shape, itemsize, t_fwd, t_bwd)
        models.append(model)
        for mistake, value in mistakes.items():
            apart[mistake] = apart.get(mistake, False) or \
                not math.isclose(value, model, rel_tol=0.05, abs_tol=1e-9)
    assert [m for m, ok in apart.items() if not ok] == []
    assert len(models) >= 2 and len({round(m, 6) for m in models}) == len(models)


def _results(lk):
    return [{"link_model": lk, "activation_shape": (1, 16, 32), "itemsize": 4,
             "schedules": {"1f1b_overlap": _one_f_one_b(2, report.M)}}] * 2


def test_report_shows_a_stub_prediction_as_a_dash():
    lk = Link("dgx-h100", bandwidth_Bps=1e6, latency_s=0.01, local_flops=1e9, scale=1.0)

    def stub(*_):
        raise NotImplementedError("not implemented yet: pp_overlap.predict_step_ms")
    row = report.prediction_lines(_results(lk), 100.0, 200.0, 1900.0, predict=stub)[-1]
    model, _ = report.step_model(_one_f_one_b(2, report.M), lk, (1, 16, 32), 4, 100.0, 200.0)
    assert row.split()[-3:] == ["-", f"{model / 1e3:.3g}", "1.9"]
    row = report.prediction_lines(_results(lk), 100.0, 200.0, 1900.0,
                                  predict=lambda *_: 1750.0)[-1]
    assert row.split()[-3:] == ["1.75", f"{model / 1e3:.3g}", "1.9"]
    assert "nothing to predict" in report.prediction_lines([{"link_model": None}], 1.0, 2.0, None)[0]
