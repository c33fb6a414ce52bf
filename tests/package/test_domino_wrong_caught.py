"""The domino grader catches the mistakes the lab is about: each deliberately wrong lab in
tests/grading/wrong/domino_*/ fails exactly the tests it should, with a message that teaches.

* waits_immediately: numbers right, every all-reduce waited at once -> both overlap tests,
  on the schedule's structure (read from the link's op log), before any figure;
* never_waits: WaitInBackward forgets to wait -> the registry names the leaked handle;
* wrong_chunk_order: chunks joined in reverse -> the numerics tests (final hidden states);
* early_backward_wait: no lookahead, the backward waits right after starting -> backward overlap,
  on the backward pass's structure (every all-reduce of it waited on at once);
* schedule_ignores_lookahead: ``schedule`` prepares each unit right before its compute -> the
  schedule tests (instant, naming the event that came too early), then backward overlap, on the
  backward pass's structure;
* prediction_payload_bytes: ``predict_exposed_ms`` prices the all-reduce with the payload bytes
  -> the prediction test, naming the bus bytes (on 4 ranks; on 2 the factor is 1).

Each folder is graded through the self-check engine in this process (the grader's own checks
and messages, on the warm rank pools), one after the other: the overlap tests
measure wall-clock time, and several graders at once on a small machine would disturb each other.
The three folders caught on structure are caught by the grader's structure run (the same step on
a stack of hidden size 64, program order counted), in a second each, without the measured run.

Each folder is graded on the checks it must fail only (``wrong_labs.grade_where_caught``): a
full grading fails exactly those (``WORKBOOK_WRONG_LABS_ALL_CHECKS=1`` grades every check, and
these tests then prove it), and the others cost time for no catch -- wrong_chunk_order's overlap
run alone (a 2-layer stack of hidden size 2048 trained twice on two ranks) took as long as its
numerics on 2 and 4 ranks four times over.

The prediction's wrong lab is the solution but for its prediction, a pure function nothing else
calls: it is graded on the prediction's check alone (``wrong_labs.grade_one_mistake``, which
first checks that nothing else differs), the rest being the reference the solutions stage grades.
"""
from __future__ import annotations

import pytest
from wrong_labs import assert_caught, grade_one_mistake, grade_where_caught

NUMERICS = ("test_domino_matches_reference_tp2", "test_domino_matches_reference_tp4")
BOTH_OVERLAPS = ("test_forward_communication_hidden", "test_backward_communication_hidden")

# folder -> {failing test: words its message must contain}
CASES = {
    "domino_waits_immediately": {
        t: ["rank ", "waited on right after it started", "hidden behind compute"]
        for t in BOTH_OVERLAPS
    },
    "domino_never_waits": {
        **{t: ["rank ", "never waited on", ".bwd"] for t in NUMERICS},
        "test_registry_empty_after_each_step": ["rank ", "never waited on", "chunk"],
        **{t: ["never waited on"] for t in BOTH_OVERLAPS},
    },
    "domino_wrong_chunk_order": {
        t: ["rank ", "final hidden states (chunks in batch order)", "differs", "expected"]
        for t in NUMERICS},
    "domino_early_backward_wait": {
        "test_backward_communication_hidden": ["rank ", "backward pass", "WaitInBackward",
                                               "at least 60%"],
    },
    "domino_schedule_ignores_lookahead": {
        "test_schedule_hides_communication": [
            "lookahead=1, inter_layer=True): event 1: compute (layer 0, attn) chunk 0 came before "
            "prepare (layer 0, attn) chunk 1", "prepared 1 unit ahead of its compute"],
        "test_schedule_intra_layer_only": ["inter_layer=False): event 1: compute (layer 0, attn) "
                                           "chunk 0 came before prepare (layer 0, attn) chunk 1"],
        "test_backward_communication_hidden": ["rank ", "backward pass", "WaitInBackward",
                                               "at least 60%"],
    },
    "domino_prediction_payload_bytes": {
        "test_predict_exposed_ms": ["ranks=4", "payload bytes", "bus bytes, 2(n-1)/n"],
    },
}


# the wrong labs that are the solution but for one pure function, graded on its checks alone
ONE_FUNCTION = {"domino_prediction_payload_bytes": "predict_exposed_ms"}


@pytest.mark.parametrize("folder", sorted(CASES))
def test_wrong_domino_is_caught(folder):
    if folder in ONE_FUNCTION:     # the solution but for one pure function: its checks only
        outcome = grade_one_mistake(folder, "domino", ONE_FUNCTION[folder])
    else:                          # the checks it must fail, this folder only, in its own test
        outcome = grade_where_caught(folder, "domino", CASES[folder])
    assert_caught(folder, outcome, CASES[folder])
