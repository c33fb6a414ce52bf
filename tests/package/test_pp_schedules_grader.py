"""Lab ``pp_schedules``' grader, schedules' part: the reference passes every case, and
deliberately wrong schedules are caught, each with a message that says where it parts from
torch's order and what that costs, or, before that, which dependency it breaks (a W before its B)
or which ranks would wait for each other for ever (a V whose second chunk runs down the pipe, a
warm-up that deadlocks), on paper, before any rank starts.
Pure Python, no rank starts (torch's order is read from its runtime loop, in this process).
"""
from __future__ import annotations

import types

import pytest
from pp_schedules_reference import SOL, load

from workbook.pipeline_parallel import B, INTERLEAVED, V_SHAPE, W

GRADER = load("pp_schedules_grader", "tests/grading/test_pp_schedules.py",
              "tests/grading/test_pp_schedules.py.draft")


def lab_with(**schedules) -> types.SimpleNamespace:
    """The reference lab with some schedules replaced (name=function)."""
    table = dict(SOL.SCHEDULES)
    for name, fn in schedules.items():
        table[name] = (fn, table[name][1])
    return types.SimpleNamespace(SCHEDULES=table)


def problems(lab, name: str) -> list[str]:
    found = [GRADER.schedule_problem(lab, name, *case) for case in GRADER.CASES[name]]
    return [p for p in found + [GRADER.refusal_problem(lab, name)] if p]


@pytest.mark.parametrize("name", sorted(GRADER.CASES))
def test_the_reference_passes_every_case(name):
    assert problems(lab_with(), name) == []


# --------------------------------------------------------------------------- wrong on purpose
def round_robin_chunks(p, v, m, rank):
    """WRONG: the chunk changes every micro-batch (c = k mod v), not every p micro-batches."""
    acts = SOL.interleaved_1f1b(p, v, m, rank)
    if v == 1:
        return acts
    seen = {}
    out = []
    for kind, _, _ in acts:
        k = seen.get(kind, 0)
        seen[kind] = k + 1
        c = k % v if kind == "F" else v - 1 - k % v
        out.append((kind, k // v, c))
    return out


def w_right_after_b(p, v, m, rank):
    """WRONG: ZB-H1 with every W at once after its B: 1F1B's bubble, the split bought nothing."""
    out = []
    for kind, i, c in SOL.interleaved_1f1b(p, v, m, rank):
        out += [(kind, i, c)] + ([(W, i, c)] if kind == B else [])
    return out


def every_w_last(p, v, m, rank):
    """WRONG: every W held to the end: little bubble, but every activation kept to the end."""
    acts = SOL.interleaved_1f1b(p, v, m, rank)
    return acts + [(W, i, c) for kind, i, c in acts if kind == B]


def zbv_w_at_once(p, v, m, rank):
    """WRONG: ZBV with each W moved to just after its B."""
    acts = [a for a in SOL.zbv(p, v, m, rank) if a[0] != W]
    out = []
    for kind, i, c in acts:
        out += [(kind, i, c)] + ([(W, i, c)] if kind == B else [])
    return out


def w_before_its_b(p, v, m, rank):
    """WRONG: ZB-H1 with its first W moved in front of that micro-batch's B."""
    acts = SOL.zb_h1(p, v, m, rank)
    w = acts.pop(next(k for k, a in enumerate(acts) if a[0] == W))
    acts.insert(next(k for k, a in enumerate(acts) if a[0] == B and a[1:] == w[1:]), w)
    return acts


def v_second_chunk_down(p, v, m, rank):
    """WRONG: the V's second chunk run in the order of the mirror rank's (p - 1 - rank), as if
    it carried on down the pipe instead of coming back up: the ranks wait for each other."""
    mine, mirror = SOL.zbv(p, v, m, rank), SOL.zbv(p, v, m, p - 1 - rank)
    first, second = [a for a in mine if a[2] == 0], [a for a in mirror if a[2] == 1]
    return [first.pop(0) if a[2] == 0 else second.pop(0) for a in mine]


def warm_up_reversed(p, v, m, rank):
    """WRONG: each rank's warm-up is its mirror's (the first rank starts its backward at once,
    the last one runs p - 1 forwards first): a deadlock."""
    return SOL.interleaved_1f1b(p, v, m, p - 1 - rank)


def no_refusal(p, v, m, rank):
    """WRONG: runs Megatron's interleaving even when m is not a multiple of p."""
    return [] if v > 1 and m % p else SOL.interleaved_1f1b(p, v, m, rank)


@pytest.mark.parametrize("name, fn, words", [
    ("interleaved_1f1b", round_robin_chunks, ["torch's ScheduleInterleaved1F1B", "lesson 12"]),
    ("zb_h1", w_right_after_b, ["ScheduleInterleavedZeroBubble", "bubble"]),
    ("zb_h1", every_w_last, ["peak"]),
    ("zbv", zbv_w_at_once, ["ScheduleZBVZeroBubble", "section 6"]),
    ("interleaved_1f1b", no_refusal, ["raise ValueError"]),
    ("zb_h1", w_before_its_b, ["W(0, chunk 0) comes before B(0, chunk 0)", "needs the gradients"]),
    ("zbv", v_second_chunk_down, ["deadlock", "rank 0 waits at F(1, chunk 1) (stage 3)",
                                  "hang for ever"]),
    ("interleaved_1f1b", warm_up_reversed, ["deadlock", "rank 1 waits at F(1, chunk 0)",
                                            "stage 0's activation", "hang for ever"]),
])
def test_a_wrong_schedule_is_caught_with_what_it_costs(name, fn, words):
    found = problems(lab_with(**{name: fn}), name)
    assert found, f"{fn.__name__} passed the grader"
    text = " ".join(found)
    for word in words:
        assert word in text, (word, found[0])
    assert all("\n" not in p for p in found)


def test_a_wrong_zb_h1_is_told_its_bubble_against_the_schedules():
    """The message compares the two schedules on paper: W at once keeps 1F1B's bubble."""
    msg = GRADER.schedule_problem(lab_with(zb_h1=w_right_after_b), "zb_h1", 4, 1, 8)
    yours, theirs = msg.split("Yours: ")[1].split("; the schedule's: ")
    bubble = [float(t.split("bubble ")[1].split(" %")[0]) for t in (yours, theirs)]
    assert bubble[0] > 1.5 * bubble[1], msg
    assert "yours ('W', 0, 0)" in msg, msg


def test_placements_of_the_cases():
    assert {GRADER.TORCH_CLASS[n][1] for n in ("interleaved_1f1b", "zb_h1")} == {INTERLEAVED}
    assert GRADER.TORCH_CLASS["zbv"][1] == V_SHAPE
