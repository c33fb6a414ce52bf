"""The cp_ring grader catches the mistakes the lab is about: each deliberately wrong lab in
tests/grading/wrong/cp_ring_*/ fails exactly the checks it should, with a message that teaches.

* softmax_not_rescaled: the merge leaves the earlier partial (its acc and l) at its old max ->
  merge_partials (saying the earlier block was not rescaled when the running max changed), and
  every numerics check downstream (the rows that merge several blocks are named); the traffic
  and both overlap checks, though the ring moves the right bytes at the right time, earn nothing
  until the numbers are right (each names the numerics check to fix first);
* mask_on_wrong_block: the causal mask on the earlier block, the diagonal taken whole ->
  block_mask, the numerics, and (numbers first) the traffic and both overlap checks;
* unbalanced_split: "zig-zag" gives rank r chunks 2r and 2r+1 -> zigzag_layout only, named
  unbalanced with the causal work per rank (the ring itself works on any layout);
* send_after_compute: each hop posted after the step's attention and waited on at once -> both
  overlap checks, on structure (no block's compute between a hop's post and its wait);
* prediction_full_block: the prediction of the forward's exposed exchange counts a step's
  attention as one full (S/n)^2 block -> the prediction only, named as that derivation.

To keep CI short, each folder runs through the self-check engine (``engine.run_checks``: the
grader's own test functions, the same messages) in this process, on the warm rank pools, under a
cap of 2 ranks, and only the checks its mistake can reach: the overlap run (the one slow check)
only for the folder whose mistake is the schedule (a folder whose numbers are wrong is refused
before its overlap is measured).
"""
from __future__ import annotations

import pytest

from wrong_labs import assert_fails_exactly

INSTANT = ("merge_partials", "block_mask", "zigzag_layout", "predict_forward_exposed")
NUMERICS = ("ring_forward", "ring_backward", "attention_sublayer")
EVERYTHING_BUT_TIMING = INSTANT + NUMERICS + ("ring_traffic",)
OVERLAP = ("forward_exchange_hidden", "backward_exchange_hidden")
NUMBERS = ["rank ", "differs from single-device causal attention", "expected", "got", "position"]
NOT_GRADED = "not graded until the numbers are right"
NUMBERS_FIRST = {"ring_traffic": [NOT_GRADED, "fix ring_forward first"],   # forward asked first
                 "forward_exchange_hidden": [NOT_GRADED, "fix ring_forward first"],
                 "backward_exchange_hidden": [NOT_GRADED, "fix ring_backward first"]}

# folder -> (checks run, {failing check (without [n]): words its message must contain})
CASES = {
    "cp_ring_softmax_not_rescaled": (EVERYTHING_BUT_TIMING + OVERLAP, {
        "merge_partials": ["the running max grows", "The earlier block was not rescaled when the "
                           "running max changed", "exp(m_a - m)"],
        "ring_forward": NUMBERS + ["Only query rows that merge the partials of several blocks "
                                   "are wrong", "merge_partials"],
        "ring_backward": NUMBERS + ["merge_partials"],
        "attention_sublayer": NUMBERS + ["the output"], **NUMBERS_FIRST}),
    "cp_ring_mask_on_wrong_block": (EVERYTHING_BUT_TIMING + OVERLAP, {
        "block_mask": ["block_mask(q_chunk=0, kv_chunk=0) returned 'full', expected 'causal'",
                       "lower triangle"],
        "ring_forward": NUMBERS + ["position 0"],
        "ring_backward": NUMBERS,
        "attention_sublayer": NUMBERS, **NUMBERS_FIRST}),
    "cp_ring_unbalanced_split": (EVERYTHING_BUT_TIMING, {
        "zigzag_layout": ["unbalanced split", "causal work per rank", "[10, 26]",
                          "chunks r and 2n-1-r"]}),
    "cp_ring_send_after_compute": (INSTANT + ("ring_forward",) + OVERLAP, {
        t: ["rank ", "waited on right after being posted",
            "post the send/recv of the next block before computing attention on the current one"]
        for t in OVERLAP}),
    "cp_ring_prediction_full_block": (INSTANT, {
        "predict_forward_exposed": ["what you get if you count a step's attention as one full "
                                    "(S/n) x (S/n) block", "zig-zag split computes chunk-sized "
                                    "blocks", "model gives"]}),
}


@pytest.mark.parametrize("folder", sorted(CASES))
def test_wrong_cp_ring_caught(folder):
    only, expected = CASES[folder]
    assert_fails_exactly(folder, "cp_ring", only, expected)
