"""The pp_schedules prediction's model and report, without ranks.

* ``step_model`` is ``simulate_chunked``'s step with a whole stage's compute divided by v and the
  link's alpha-beta time for one activation; by hand: with free transfers and equal costs,
  interleaved 1F1B's step is the formula's (v m + p - 1)(t_F + t_B + t_W) / v, and the V's turn
  costs nothing (the model charging it is slower);
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
from workbook.pipeline_parallel import pp_schedules_report as report
from workbook.pipeline_parallel.torch_orders import TORCH_CLASS, torch_order

GRADER = Path(__file__).resolve().parents[1] / "grading" / "test_pp_schedules.py"
LINK = Link("dgx-h100", bandwidth_Bps=1e6, latency_s=0.01, local_flops=1e9, scale=1.0)


def _grader():
    spec = importlib.util.spec_from_file_location("_pp_schedules_grader", GRADER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_model_by_hand():
    # one activation [2, 10, 50] fp32 = 4000 B: c = 0.01 + 0.004 s = 14 ms
    assert math.isclose(report.transfer_ms(LINK, (2, 10, 50), 4), 14.0)
    p, v, m = 4, 2, 8
    acts = torch_order("interleaved_1f1b", p, v, m)
    free = Link("dgx-h100", bandwidth_Bps=1e30, latency_s=0.0, local_flops=1e9, scale=1.0)
    model, _ = report.step_model("interleaved_1f1b", acts, "interleaved", free, (2, 10, 50), 4,
                                 30.0, 30.0, 30.0)
    assert math.isclose(model, (v * m + p - 1) * 90.0 / v)
    model, mistakes = report.step_model("interleaved_1f1b", acts, "interleaved", LINK,
                                        (2, 10, 50), 4, 30.0, 30.0, 30.0)
    assert model > (v * m + p - 1) * 90.0 / v + 2 * (p - 1) * 14.0   # transfers on the path
    assert math.isclose(mistakes[next(k for k in mistakes if "textbook" in k)],
                        (v * m + p - 1) * 90.0 / v)
    zbv = torch_order("zbv", 2, 2, 8)
    model, mistakes = report.step_model("zbv", zbv, "v", LINK, (2, 10, 50), 4, 40.0, 40.0, 40.0)
    turn = mistakes[next(k for k in mistakes if "V's turn" in k)]
    assert turn > model                                              # the turn costs nothing


def test_every_mistake_is_told_apart_in_some_setting():
    grader = _grader()
    models, apart = [], {}
    for preset, name, p, v, m, shape, itemsize, t_f, t_b, t_w in grader.PREDICTION_CASES:
        lk = make_link(preset, grader.PREDICTION_FLOPS)
        model, mistakes = grader.prediction_model(name, p, v, m, lk, shape, itemsize, t_f, t_b,
                                                  t_w)
        models.append(model)
        for mistake, value in mistakes.items():
            apart[mistake] = apart.get(mistake, False) or \
                not math.isclose(value, model, rel_tol=0.05, abs_tol=1e-9)
    assert [m for m, ok in apart.items() if not ok] == []
    assert any("V's turn" in k for k in apart) and any("unsplit B" in k for k in apart)
    assert len(models) >= 2 and len({round(m, 6) for m in models}) == len(models)


def _inputs():
    schedules = {"zbv": (torch_order("zbv", 2, 2, 8), 2, TORCH_CLASS["zbv"][1])}
    rows = {"zbv": {"step_ms": 1900.0, "t_f_ms": 50.0, "t_b_ms": 50.0, "t_w_ms": 40.0},
            "interleaved_v2": {"step_ms": 2000.0, "t_f_ms": 50.0, "t_b_ms": 90.0, "t_w_ms": None}}
    return LINK, (1, 16, 32), 8, schedules, rows


def test_report_shows_a_stub_prediction_as_a_dash():
    link, shape, m, schedules, rows = _inputs()

    def stub(*_):
        raise NotImplementedError("not implemented yet: pp_schedules.predict_step_ms")
    lines = report.prediction_lines(link, shape, m, schedules, rows, stub)
    assert "zbv 100 / 100 / 80;" in lines[0]                  # a whole stage's: chunk x 2
    model, _ = report.step_model("zbv", schedules["zbv"][0], "v", LINK, shape, 4,
                                 100.0, 100.0, 80.0)
    assert lines[-1].split()[-3:] == ["-", f"{model / 1e3:.3g}", "1.9"]
    assert report.prediction_lines(link, shape, m, schedules, rows, None)[-1] == lines[-1]
    assert report.whole_stage_costs(rows["interleaved_v2"], 2) == [100.0, 90.0, 90.0]
    lines = report.prediction_lines(link, shape, m, schedules, rows, lambda *_: 1750.0)
    assert lines[-1].split()[-3:] == ["1.75", f"{model / 1e3:.3g}", "1.9"]
    assert "nothing to predict" in report.prediction_lines(None, shape, m, schedules, rows,
                                                           None)[0]


def test_bench_result_rebuilds_the_link():
    """Lesson 12's table from a ``pp_schedules_bench.measure`` result: the link from its fields."""
    import dataclasses
    link, shape, m, schedules, rows = _inputs()
    rows["zbv"].update(v=2, placement="v")
    result = {"options": {"rows": 1, "seq": 16, "hidden": 32, "micro_batches": m},
              "schedules": {"zbv": schedules["zbv"][0]},
              "links": {"dgx-h100": {"link": dataclasses.asdict(link), "variants": rows}}}
    got = report.bench_prediction_lines(result, lambda *_: 1750.0)
    assert got == report.prediction_lines(link, shape, m, schedules, rows, lambda *_: 1750.0)
