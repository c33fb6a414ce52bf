"""The dp_overlap grader catches the mistakes the lab is about: each deliberately wrong lab in
tests/grading/wrong/dp_overlap_*/ fails exactly the checks it should, with a message that teaches.

* bucket_started_early: a bucket's all-reduce starts at its first gradient -> the bucketed
  numerics, naming the bucket; the bucketed traffic and overlap earn nothing until the numbers
  are right (numbers first: each names the numerics check to fix);
* buckets_in_forward_order: buckets in order of use -> make_buckets, and the bucketed overlap
  test on structure (every bucket issued after the last gradient was ready);
* gather_waited_at_once: each parameter all-gather waited on as it starts -> both ZeRO overlap
  tests, on structure;
* reduce_scatter_waited_at_once: each gradient reduce-scatter waited on as it starts -> both
  ZeRO overlap tests, on structure (no GEMM ran between a reduce-scatter's start and its wait:
  counted, not timed, so it fails at once on every run, as the timing policy puts structure
  first);
  these three are caught by the grader's structure run (the overlap step on a model of hidden
  size 64 with the same 7 layers, on the untimed link: no measured run);
* grad_averaged_twice: ZeRO divides by n twice -> the ZeRO-1/2 and ZeRO-3 numerics, naming 1/n;
  numbers first, every ZeRO traffic and overlap check;
* shard_wrong_slice: ZeRO-1/2's Adam steps the next rank's slice -> the ZeRO-1/2 numerics, and
  numbers first, ZeRO-1's and ZeRO-2's traffic and ZeRO-2's overlap; ZeRO-3's, whose numbers
  are right, keep their points (each variant waits on its own numbers only);
* prediction_payload_bytes: the exposed tail predicted with payload bytes, not bus bytes ->
  the prediction test, naming the payload/bus-bytes term (caught at n = 4: equal at n = 2);
* prediction_all_buckets: every bucket counted as exposed -> the prediction test, naming it.

To keep CI short, each folder runs through the self-check engine (``engine.run_checks``: the
grader's own test functions, the same messages) in this process, on the warm rank pools, under a
cap of 2 ranks, on the checks it must fail (``wrong_labs.checks_caught_by``) and those ``ALSO``
names: a full grading fails exactly the checks of ``CASES`` (``WORKBOOK_WRONG_LABS_ALL_CHECKS=1``
grades every check with no cap, and these tests then prove it), and a check that passes costs a
traced step (traffic, 2 and 3 ranks) or a profiled one (overlap) for no catch. shard_wrong_slice
keeps ZeRO-3's numerics and traffic: they pass, proving that numbers first holds back only the
variant whose numbers are wrong.
"""
from __future__ import annotations

import pytest

from wrong_labs import assert_fails_exactly, checks_caught_by

NUMBERS = ["rank ", "ranks", "on the first step the optimizer read a gradient of"]
NOT_GRADED = "not graded until the numbers are right"


def refused(checks, numbers_check: str) -> dict:
    """{check: the words of its refusal} for ``checks`` refused until ``numbers_check`` passes."""
    return {c: [NOT_GRADED, f"fix {numbers_check} first"] for c in checks}


# folder -> {failing check (without [n]): words its message must contain}
FAILS = {
    "dp_overlap_bucket_started_early": {
        "bucketed_dp": NUMBERS + ["BucketedDP", "before all of its gradients were accumulated"],
        **refused(("traffic_bucketed", "bucketed_all_reduce_hidden"), "bucketed_dp")},
    "dp_overlap_buckets_in_forward_order": {
        "make_buckets": ["reverse order of use"],
        "bucketed_all_reduce_hidden": ["rank ", "issued only after the last gradient was ready",
                                       "more than one bucket"]},
    "dp_overlap_gather_waited_at_once": {
        t: ["rank ", "all-gathers were waited on right after they started", "layer i + 1"]
        for t in ("zero2_traffic_hidden", "zero3_gathers_hidden")},
    "dp_overlap_reduce_scatter_waited_at_once": {
        t: ["rank ", "of the backward pass's 7 reduce-scatters were waited on right after they "
            "started", "wait for them all only after backward"]
        for t in ("zero2_traffic_hidden", "zero3_gathers_hidden")},
    "dp_overlap_grad_averaged_twice": {
        "zero_1_and_2": NUMBERS + ["ShardedTrainer(stage=1)", "1/2 of the average",
                                   "divided by n twice"],
        "zero3": NUMBERS + ["Zero3", "1/2 of the average", "divided by n twice"],
        **refused(("traffic_zero1", "traffic_zero2", "zero2_traffic_hidden"), "zero_1_and_2"),
        **refused(("traffic_zero3", "zero3_gathers_hidden"), "zero3")},
    "dp_overlap_shard_wrong_slice": {
        "zero_1_and_2": ["rank ", "after 3 Adam steps", "though the first step's gradients were "
                         "right", "flat.data[flat.shard]"],
        **refused(("traffic_zero1", "traffic_zero2", "zero2_traffic_hidden"), "zero_1_and_2")},
    "dp_overlap_prediction_payload_bytes": {
        "predict_exposed_ms": ["predict_exposed_ms on 4 ranks", "the model gives",
                               "used the payload bytes S", "2(n-1)/n x S bus bytes"]},
    "dp_overlap_prediction_all_buckets": {
        "predict_exposed_ms": ["predict_exposed_ms on 2 ranks", "summed every bucket's "
                               "all-reduce", "first-layer gradient"]},
}


# folder -> checks run besides those it must fail: they pass (shard_wrong_slice: ZeRO-3, whose
# numbers are right, keeps its points; the traffic check stands for the overlap check, behind the
# same numbers-first gate, at a third of the cost)
ALSO = {"dp_overlap_shard_wrong_slice": ("zero3", "traffic_zero3")}
# folder -> (checks run, {failing check: words}), as tests/bench/grading_stability.py reads it
CASES = {folder: (checks_caught_by(fails, ALSO.get(folder, ())), fails)
         for folder, fails in FAILS.items()}


@pytest.mark.parametrize("folder", sorted(CASES))
def test_wrong_dp_overlap_caught(folder):
    only, expected = CASES[folder]
    assert_fails_exactly(folder, "dp_overlap", only, expected)
