"""The tp_overlap prediction's model and report, without ranks.

* ``modelled_ring_exposed_ms`` is the lesson's ``(n-1) max(0, t_c - t_g)`` on a hand-made link;
* every known wrong derivation the grader names gives another value than the model's in at
  least one of the grader's settings (else the grader could never name it), and the model is
  not zero in all of them (a hard-coded 0 fails);
* the report's comparison shows ``-`` where the prediction is not written yet (a stub), and the
  prediction, the model and the measurement where they are.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from workbook.link import Link, make_link
from workbook.tensor_parallel import tp_overlap_report as report

GRADER = Path(__file__).resolve().parents[1] / "grading" / "test_tp_overlap.py"


def _settings():
    spec = importlib.util.spec_from_file_location("_tp_overlap_grader", GRADER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PREDICTION_SETTINGS


def test_model_by_hand():
    lk = Link("dgx-h100", bandwidth_Bps=1e6, latency_s=0.01, local_flops=1e9, scale=1.0)
    # shard [1, 2, 1000] fp32 = 8000 B: t_c = 0.01 + 0.008 s; GEMM 2*2*1000*100 / 1e9 = 0.0004 s
    assert math.isclose(report.modelled_ring_exposed_ms(lk, 2, 1, 4, 1000, 100), 17.6)
    assert math.isclose(report.modelled_ring_exposed_ms(lk, 4, 1, 8, 1000, 100), 3 * 17.6)
    assert report.modelled_ring_exposed_ms(lk, 2, 1, 4, 1000, 10 ** 6) == 0.0   # the GEMM hides it
    assert report.modelled_ring_exposed_ms(lk, 1, 1, 4, 1000, 100) == 0.0


def test_every_mistake_is_told_apart_in_some_setting():
    settings = _settings()
    models, apart = [], {}
    for preset, flops, *shape in settings:
        lk = make_link(preset, flops)
        model = report.modelled_ring_exposed_ms(lk, *shape)
        models.append(model)
        for mistake, value in report.ring_prediction_mistakes(lk, *shape).items():
            apart[mistake] = apart.get(mistake, False) or \
                not math.isclose(value, model, rel_tol=0.05, abs_tol=1e-9)
    assert [m for m, ok in apart.items() if not ok] == []
    assert sum(m > 0 for m in models) >= 2 and len({round(m, 6) for m in models}) == len(models)


def _result(rank, predicted):
    rings = {o: {"predicted": predicted, "model": 10.0 * (k + 1), "sp_model": 30.0,
                 "measured": 11.0 + rank, "sp_measured": 31.0} for k, o in enumerate(report.RING_OUTS)}
    return {"rank": rank, "world_size": 2, "link": "simulated link: dgx-h100", "variants": {},
            "rings": rings}


def test_report_shows_a_stub_prediction_as_a_dash():
    lines = report.prediction_lines([_result(0, None), _result(1, None)])
    ring = next(line for line in lines if "your ring" in line)
    assert ring.split()[-3:] == ["-", "10", "12"]          # predicted, model, the slower rank
    text = report.describe([_result(0, 9.5), _result(1, 9.5)])
    assert "9.5" in text and "the blocks do not run yet" in text
