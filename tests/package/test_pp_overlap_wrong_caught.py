"""The pp_overlap grader catches the mistakes the lab is about: each deliberately wrong lab in
tests/grading/wrong/pp_overlap_*/ fails exactly the checks it should, with a message that teaches.

* send_waited_at_once: each send waited on before the next action computes -> the
  steady-state overlap test, on structure;
* receive_not_prefetched: each receive posted when its action starts -> the same test, on
  structure;
* microbatches_out_of_order: 1F1B's steady state runs the newest micro-batch's backward -> the
  schedule test (instant), naming the first action out of order;
* deadlock_warmup: the warm-up counted from the wrong end -> the schedule test reports the
  deadlock on paper, naming what each stuck stage waits for. (For both, the prediction, which
  plays the learner's own 1F1B order, is "not graded yet" until the order is right.) (The executor checks run the
  textbook schedules, so neither mistake costs the executor's points, nor hangs a rank.)
* overlapped_loss_not_averaged: the overlapped executor's forward leaves each micro-batch's loss
  undivided by m -> that executor's numerics (m times every gradient), and, numbers first, its
  traffic and its overlap, though both are the reference's; the blocking executor's numbers and
  traffic keep their points (each variant waits on its own numbers only);
* prediction_no_latency: ``predict_step_ms`` leaves the link's latency out of each transfer ->
  the prediction test (instant), naming the latency as the term left out;
* prediction_textbook_step: ``predict_step_ms`` gives the textbook step (m + p - 1)(t_f + t_b),
  no transfer on the critical path -> the same test, naming the transfers left out.

Each folder runs through the self-check engine in this process, on the warm rank pools, under a
cap of 2 ranks (as a small grading machine would), on the checks it must fail
(``wrong_labs.checks_caught_by``) and those ``ALSO`` names: a full grading fails exactly the
checks of ``CASES`` (``WORKBOOK_WRONG_LABS_ALL_CHECKS=1`` grades every check with no cap, and
these tests then prove it). ``ALSO`` keeps one witness of each property above that a passing
check shows: the blocking executor keeps its points when the schedule or the overlapped
executor is wrong (``traffic_blocking`` passes only after ``1f1b_blocking``'s numbers do).
"""
from __future__ import annotations

import pytest

from wrong_labs import assert_fails_exactly, checks_caught_by

NOT_GRADED = "not graded until the numbers are right"

# folder -> {failing check (without [n]): words its message must contain}
FAILS = {
    "pp_overlap_send_waited_at_once": {
        "steady_state_p2p_hidden": ["rank ", "sends were waited on right after they were posted",
                                    "dist.isend", "finish()"]},
    "pp_overlap_receive_not_prefetched": {
        "steady_state_p2p_hidden": ["rank ", "receives were posted only when their data was "
                                    "needed", "one action ahead"]},
    "pp_overlap_overlapped_loss_not_averaged": {
        "1f1b_overlapped": ["rank 0 (stage 0 of 2)", "1F1B (OverlappedExecutor)",
                            "its loss divided by m"],
        "traffic_overlapped": [NOT_GRADED, "fix 1f1b_overlapped first"],
        "steady_state_p2p_hidden": [NOT_GRADED, "fix 1f1b_overlapped first"]},
    "pp_overlap_microbatches_out_of_order": {
        "one_f_one_b_schedule": ["one_f_one_b(p=", "expected B(0)", "in the order they entered"],
        "predict_step_ms": ["not graded yet", "needs the order right first"]},
    "pp_overlap_deadlock_warmup": {
        "one_f_one_b_schedule": ["deadlock", "stage 0 waits at B(0) for stage 1's gradient",
                                 "hang"],
        "predict_step_ms": ["not graded yet", "needs the order right first", "deadlock"]},
    "pp_overlap_prediction_no_latency": {
        "predict_step_ms": ["predict_step_ms(link=", "latency (alpha) out"]},
    "pp_overlap_prediction_textbook_step": {
        "predict_step_ms": ["predict_step_ms(link=", "leave the transfers out"]},
}


# folder -> checks run besides those it must fail, each a witness that passes (module docstring)
ALSO = {"pp_overlap_overlapped_loss_not_averaged": ("traffic_blocking",),
        "pp_overlap_microbatches_out_of_order": ("1f1b_blocking",),
        "pp_overlap_deadlock_warmup": ("1f1b_blocking",)}
# folder -> (checks run, {failing check: words}), as tests/bench/grading_stability.py reads it
CASES = {folder: (checks_caught_by(fails, ALSO.get(folder, ())), fails)
         for folder, fails in FAILS.items()}


@pytest.mark.parametrize("folder", sorted(CASES))
def test_wrong_pp_overlap_caught(folder):
    only, expected = CASES[folder]
    assert_fails_exactly(folder, "pp_overlap", only, expected)
