"""Lab ``ep_overlap``'s own figures (``workbook.expert_parallel.ep_overlap_report``) and the model
its prediction is judged against.

* ``dispatch_exposed_model`` against values computed by hand on a link of round figures (1 MB/s,
  1 ms per operation): an exchange whose busiest rank receives, one whose busiest rank sends (and
  receives nothing), the shared expert longer than the exchange, and each named wrong derivation;
* the report's rank side on 2 warm ranks (a small layer), then its lines: every variant, both
  passes, and the prediction row where the reference's prediction equals the model.
"""
from __future__ import annotations

import pytest

from workbook.expert_parallel import ep_overlap_report as report
from workbook.link import Link

FLAT = Link("dgx-h100", bandwidth_Bps=1e6, latency_s=1e-3, local_flops=5e10, scale=1.0)


def _mistake(mistakes: dict, words: str) -> float:
    return next(v for k, v in mistakes.items() if words in k)


def test_the_busiest_receiver_sets_the_dispatch():
    # rows of 250 float32 = 1000 B: rank 0 receives 3 + 2 = 5 rows (5 ms), sends 1 + 1 = 2
    rows = [[4, 1, 1], [3, 0, 0], [2, 0, 7]]
    model, mistakes = report.dispatch_exposed_model(FLAT, rows, 250, 4, 2.0)
    assert model == pytest.approx(1.0 + 5.0 - 2.0)
    assert _mistake(mistakes, "whole exchange") == pytest.approx(1.0 + 7.0 - 2.0)
    assert _mistake(mistakes, "average rank") == pytest.approx(1.0 + 7.0 / 3 - 2.0)
    assert _mistake(mistakes, "keeps for itself") == pytest.approx(1.0 + 9.0 - 2.0)
    assert _mistake(mistakes, "latency (alpha)") == pytest.approx(5.0 - 2.0)
    assert _mistake(mistakes, "elements as bytes") == pytest.approx(max(0.0, 1.0 + 1.25 - 2.0))
    assert _mistake(mistakes, "nothing overlapped") == pytest.approx(6.0)
    assert _mistake(mistakes, "seconds") == pytest.approx(model / 1e3)


def test_a_sender_can_be_the_busiest_and_a_rank_may_receive_nothing():
    rows = [[0, 1, 0], [0, 0, 0], [4, 2, 9]]        # rank 2 sends 6 rows, receives none
    model, mistakes = report.dispatch_exposed_model(FLAT, rows, 250, 4, 0.0)
    assert model == pytest.approx(1.0 + 6.0)
    assert _mistake(mistakes, "only what each rank receives") == pytest.approx(1.0 + 4.0)
    assert _mistake(mistakes, "sends and what it receives") == pytest.approx(1.0 + 6.0)


def test_a_shared_expert_longer_than_the_exchange_leaves_nothing_exposed():
    model, mistakes = report.dispatch_exposed_model(FLAT, [[1, 2], [3, 0]], 250, 4, 10.0)
    assert model == 0.0
    assert _mistake(mistakes, "below zero") == pytest.approx(1.0 + 3.0 - 10.0)
    assert report.dispatch_exposed_model(FLAT, [[5]], 250, 4, 0.0)[0] == 0.0   # one rank


def test_the_self_checks_figures_show_every_variant_and_the_prediction(monkeypatch):
    from workbook.grading.labs import ENV_IMPL
    from workbook.runtime.launch import run
    results = run(report.run, report.WORLD_SIZE, None, "solutions", {"tokens": 32, "hidden": 32},
                  link=report.LINK, pool=True, timeout=120)
    monkeypatch.setenv(ENV_IMPL, "solutions")          # the prediction: the reference's
    text = report.describe(results)
    for call in report.VARIANTS.values():
        line = next(ln for ln in text.splitlines() if ln.split()[:1] == [call])
        assert len(line.split()) == 8 and float(line.split()[2]) > 0, line   # step, 2 x 3 figures
    row = next(ln for ln in text.splitlines() if ln.strip().startswith("dispatch exposed"))
    predicted, model = row.split()[2:4]
    assert predicted == model, row
    assert "simulated link: dgx-h100" in text and "predict_dispatch_exposed_ms" in text
    assert max(len(ln) for ln in text.splitlines()) < 100, text
