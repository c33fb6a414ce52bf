"""The tp_overlap grader catches the mistakes the lab is about: each deliberately wrong lab in
tests/grading/wrong/tp_overlap_*/ fails exactly the tests it should, with a message that teaches.

* ring_sends_own_shard: every all-gather ring step passes on the rank's own shard -> the ring
  op test names which shard landed where; the numerics of every pipelined variant (from 3 ranks);
  numbers first, the pattern and both overlap tests (each names the numerics test to fix);
* sums_wrong_order: the running sums of the GEMM + reduce-scatter ring go the wrong way -> the
  ring op test decodes which rank's partial product of which shard was summed; the numerics;
  numbers first, the pattern and both overlap tests, though its traffic and overlap are right;
* waits_before_gemm: each exchange waited on before the GEMM it should hide behind -> both
  overlap tests (the ring serves the forward and the row-parallel backward), on structure (the
  grader's structure run on a block of hidden size 64: no measured run);
* bulk_gather_waited_at_once: the column-parallel backward waits for the input's all-gather
  at once -> the backward overlap test only, on structure (likewise);
* prediction_no_latency: the prediction of the ring's exposed communication leaves out the
  link's latency -> the prediction test only, its message naming the latency term.

Each folder is graded through the self-check engine in this process, one after the other (the
overlap tests measure wall-clock time), on the warm rank pools: the same checks and messages as
a pytest subprocess, without starting torch and four pools per folder.

Each folder is graded on the checks it must fail only (``wrong_labs.grade_where_caught``), on
as few ranks as its verdict needs (``RANK_CAP``): a ring that goes wrong from 3 ranks on is
graded on up to 3, a schedule whose numbers are right on up to 2 (its overlap run is on 2, and
numbers first reads the numerics run of those sizes). The numerics run of every part under
every variant on 4 ranks was most of each folder's time; a full grading (every check, 1 to 4
ranks: ``WORKBOOK_WRONG_LABS_ALL_CHECKS=1``) fails exactly the same checks, with the same words.

The prediction's wrong lab is the solution but for its prediction, a pure function nothing else
calls: it is graded on the prediction's check alone (``wrong_labs.grade_one_mistake``, which
first checks that nothing else differs), the rest being the reference the solutions stage grades.
"""
from __future__ import annotations

import pytest
from wrong_labs import assert_caught, grade_one_mistake, grade_where_caught

NUMERICS = ("test_linears", "test_mlp", "test_attention", "test_block")
BOTH_OVERLAPS = ("test_forward_communication_hidden", "test_backward_communication_hidden")
NUMBERS_FIRST = {t: ["not graded until the numbers are right", "fix linears [pipelined+bulk] first"]
                 for t in ("test_ring_pattern_from_trace", *BOTH_OVERLAPS)}

# folder -> {failing test: words its message must contain}
CASES = {
    "tp_overlap_ring_sends_own_shard": {
        "test_ring_all_gather_matmul": ["rank ", "3 ranks", "of the gathered input hold shard",
                                        "passes on the shard it holds"],
        **{t: ["rank ", "[pipelined", "tp=3", "differs from the reference"] for t in NUMERICS},
        **NUMBERS_FIRST,
    },
    "tp_overlap_sums_wrong_order": {
        "test_ring_matmul_reduce_scatter": ["rank 0", "3 ranks", "rank 1's of shard 2",
                                            "wrong order", "(r - k - 1) mod n"],
        **{t: ["rank ", "[pipelined", "tp=3", "differs from the reference"] for t in NUMERICS},
        **NUMBERS_FIRST,
    },
    "tp_overlap_waits_before_gemm": {
        t: ["rank ", "send", "waited on right after it started", "before any compute"]
        for t in BOTH_OVERLAPS},
    "tp_overlap_bulk_gather_waited_at_once": {
        "test_backward_communication_hidden": ["rank ", "backward pass", "all_gather",
                                               "waited on right after it started",
                                               "after the dgrad GEMM"]},
    "tp_overlap_prediction_no_latency": {
        "test_predict_ring_exposed_ms": ["the exposed communication of your ring_all_gather_matmul",
                                         "2 ranks", "the model gives", "leave out the latency"]},
}


# folder -> the most ranks its checks run on: the smallest cap under which it fails the same
# checks with the same words (its ring goes wrong from 3 ranks on; its numbers are right)
RANK_CAP = {"tp_overlap_ring_sends_own_shard": 3, "tp_overlap_sums_wrong_order": 3,
            "tp_overlap_waits_before_gemm": 2, "tp_overlap_bulk_gather_waited_at_once": 2}


def per_test(outcome: dict) -> dict:
    """``outcome`` with a parametrised test's instances (``test_x[2]``, ``test_x[3]``) as one
    test, ``test_x``: its first failure's message, None when every instance passed (CASES name
    tests without ``[n]``, as tests/bench/grading_stability.py reads them)."""
    merged: dict = {}
    for name, message in outcome.items():
        base = name.split("[")[0]
        if merged.get(base) is None:
            merged[base] = message
    return merged


# the wrong labs that are the solution but for one pure function, graded on its checks alone
ONE_FUNCTION = {"tp_overlap_prediction_no_latency": "predict_ring_exposed_ms"}


@pytest.mark.parametrize("folder", sorted(CASES))
def test_wrong_tp_overlap_caught(folder):
    if folder in ONE_FUNCTION:     # the solution but for one pure function: its checks only
        outcome = grade_one_mistake(folder, "tp_overlap", ONE_FUNCTION[folder])
    else:                          # the checks it must fail, this folder only, in its own test
        outcome = grade_where_caught(folder, "tp_overlap", CASES[folder],
                                     max_ranks=RANK_CAP[folder])
    assert_caught(folder, per_test(outcome), CASES[folder])
    escaped = [name for name, message in outcome.items()        # every instance fails
               if name.split("[")[0] in CASES[folder] and message is None]
    assert not escaped, f"{folder}: {escaped} passed; every instance of a failing test must fail"


def test_a_lab_with_more_than_one_change_is_graded_on_every_check():
    """Only a wrong lab that is the solution but for the one function is graded on that
    function's checks alone; any other is refused that shortcut, naming what differs."""
    with pytest.raises(AssertionError, match="must be solutions/tp_overlap.py with only"):
        grade_one_mistake("tp_overlap_waits_before_gemm", "tp_overlap", "exchange")
