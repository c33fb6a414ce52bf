"""The pp_schedules grader catches the mistakes the lab is about: each deliberately wrong lab in
tests/grading/wrong/pp_schedules_*/ fails exactly the checks it should, with a message that
teaches.

* interleaved_round_robin: the chunk switched every micro-batch, not every p -> the interleaved
  schedule test (instant), naming the first action that differs from PyTorch's order;
* no_refusal: m not a multiple of p accepted -> the same test, asking for the ValueError;
* zb_h1_w_at_once / zbv_w_at_once: every W right after its B -> the ZB-H1 / ZBV schedule test,
  showing the bubble the deferral would have saved;
* receives_in_own_order: the executor posts a peer's receives in this rank's order, not the
  order the peer sends -> messages land in the wrong buffers: ZB-H1's and ZBV's numbers (and,
  numbers first, ZBV's traffic); interleaved 1F1B on 2 ranks happens to send in the same order;
* receive_not_prefetched: each receive posted when its action starts -> the steady-state overlap
  test, on structure;
* loss_not_averaged: each micro-batch's loss not divided by m -> the numbers (m times every
  gradient), and, numbers first, the traffic;
* prediction_stage_compute: ``predict_step_ms`` gives each chunk action a whole stage's compute
  (not / v) -> the prediction test (instant), naming that term;
* prediction_textbook_bubble: ``predict_step_ms`` gives the textbook step, busy / (1 - (p - 1) /
  (v m + p - 1)), no transfer -> the same test, naming the transfers left out;
* prediction_reads_the_model: ``predict_step_ms`` calls the package's ``step_model`` -> the same
  test, refused however right the number.
(A send waited at once is not among them: with chunks, two ranks that each wait for their own
send before posting the other's receive hang, which the hang report catches after the grader's
timeout -- too slow for this suite.)

Each folder runs through the self-check engine in this process, on the warm rank pools, under a
cap of 2 ranks, only the checks its mistake can reach.
"""
from __future__ import annotations

import pytest

from wrong_labs import assert_fails_exactly

NOT_GRADED = "not graded until the numbers are right"

CASES = {
    "pp_schedules_interleaved_round_robin": (("interleaved_1f1b_schedule",), {
        "interleaved_1f1b_schedule": ["interleaved_1f1b(p=", "yours", "ScheduleInterleaved1F1B",
                                      "lesson 12"]}),
    "pp_schedules_no_refusal": (("interleaved_1f1b_schedule",), {
        "interleaved_1f1b_schedule": ["m=3", "Megatron", "raise ValueError"]}),
    "pp_schedules_zb_h1_w_at_once": (("zb_h1_schedule",), {
        "zb_h1_schedule": ["ScheduleInterleavedZeroBubble", "yours ('W'", "bubble"]}),
    "pp_schedules_zbv_w_at_once": (("zbv_schedule",), {
        "zbv_schedule": ["ScheduleZBVZeroBubble", "section 6"]}),
    "pp_schedules_receives_in_own_order": (("zb_h1_numbers", "zbv_numbers", "traffic_zbv"), {
        "zb_h1_numbers": ["OverlappedChunkedExecutor running ZB-H1", "in the order that peer sends"],
        "zbv_numbers": ["in the order that peer sends"],
        "traffic_zbv": [NOT_GRADED, "fix zbv_numbers first"]}),
    "pp_schedules_receive_not_prefetched": (("interleaved_numbers", "steady_state_p2p_hidden"), {
        "steady_state_p2p_hidden": ["receives were posted only when their data was needed",
                                    "prefetch"]}),
    "pp_schedules_loss_not_averaged": (("interleaved_numbers", "traffic_interleaved"), {
        "interleaved_numbers": ["8 x the right one", "its loss divided by m"],
        "traffic_interleaved": [NOT_GRADED, "fix interleaved_numbers first"]}),
    "pp_schedules_prediction_stage_compute": (("predict_step_ms",), {
        "predict_step_ms": ["predict_step_ms(link=", "a whole stage's compute"]}),
    "pp_schedules_prediction_textbook_bubble": (("predict_step_ms",), {
        "predict_step_ms": ["predict_step_ms(link=", "leave the transfers out"]}),
    "pp_schedules_prediction_reads_the_model": (("predict_step_ms",), {
        "predict_step_ms": ["calls the package's model (step_model)", "derive the figure"]}),
}


@pytest.mark.parametrize("folder", sorted(CASES))
def test_wrong_pp_schedules_caught(folder):
    only, expected = CASES[folder]
    assert_fails_exactly(folder, "pp_schedules", only, expected)
