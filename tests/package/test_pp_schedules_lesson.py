"""Lesson 12's on-paper helpers (``workbook.pipeline_parallel.pp_schedules_lesson``): each
schedule's bubble formula equals ``simulate_chunked`` on the reference, the message count is the
boundaries crossed, and the lesson draws PyTorch's order, never the reference, until the
learner's schedule is right. Pure Python, no rank starts."""
from __future__ import annotations

import types

import pytest
from pp_schedules_reference import SOL

from workbook.pipeline_parallel import pp_schedules_lesson as lesson

FNS = {name: getattr(SOL, fn) for name, (fn, _, _) in lesson.SCHEDULES.items()}


@pytest.mark.parametrize("name", list(lesson.SCHEDULES))
def test_each_formula_is_what_the_schedule_does_on_paper(name):
    _, placement, v = lesson.SCHEDULES[name]
    for p in (2, 3, 4):
        for m in range(2 * p, 4 * p + 1, p):                  # m >= 2p, a multiple of p
            _, line = lesson.play(FNS[name], placement, p, v, m)
            assert line.bubble == pytest.approx(lesson.formula_bubble(name, p, v, m), abs=1e-12), \
                (name, p, m)


def test_zb_h1_idles_a_third_of_1f1b_and_holds_as_much():
    rows = {r["schedule"]: r for r in lesson.compare_table(FNS, 4, 8)}
    idle = {n: rows[n]["step"] * rows[n]["bubble"] / 100 for n in rows}
    assert idle["ZB-H1"] == pytest.approx(idle["1F1B"] / 3)
    assert rows["ZB-H1"]["peak"] == rows["1F1B"]["peak"] == rows["ZBV"]["peak"] == 4


def test_messages_count_the_boundaries_between_ranks():
    rows = {r["schedule"]: r for r in lesson.compare_table(FNS, 4, 8)}
    # 2 messages (activation, gradient) per micro-batch per boundary between two ranks
    assert rows["1F1B"]["messages"] == 2 * 8 * 3
    assert rows["interleaved 1F1B"]["messages"] == 2 * 8 * 7
    assert rows["ZBV"]["messages"] == 2 * 8 * 6                 # the V's turn stays on rank 3


def test_the_lesson_draws_torchs_order_until_the_learners_is_right(capsys):
    fn, whose = lesson.schedule_of(types.SimpleNamespace(), "zbv")
    assert whose == "PyTorch's ScheduleZBVZeroBubble"
    assert lesson.ranks_of(fn, 2, 2, 4) == lesson.ranks_of(SOL.zbv, 2, 2, 4)

    def stub(p, v, m, rank):
        raise NotImplementedError("not implemented yet")
    fn, whose = lesson.schedule_of(types.SimpleNamespace(zbv=stub), "zbv")
    assert whose.startswith("PyTorch's") and "not implemented yet" in capsys.readouterr().out
    fn, whose = lesson.schedule_of(SOL, "zbv")
    assert whose == "your" and fn is SOL.zbv


def test_the_figure_has_a_row_per_rank_and_a_bar_per_action():
    fig = lesson.paper_figure(FNS, "ZBV", 4, 8, 0.2)
    bars = sum(len(t.x) for t in fig.data)
    assert bars == 4 * 3 * 8 * 2                                # F, B, W per micro-batch, chunk
    assert {y for t in fig.data for y in t.y} == {f"rank {r}" for r in range(4)}
