"""Lab ``capstone``'s grader (``tests/grading/test_capstone.py``) catches each wrong lab of
``tests/grading/wrong/capstone_*`` with words that teach (issue 32's four mistakes).

(That the reference earns full marks and the stub nothing is the test command's "grading
solutions/" and "grading labs/" stages, as for every lab: not graded a second time here.)

* dp_group_across_tp (``mesh_ranks`` gives the TP groups as the DP groups) -> the mesh on
  paper, and TP x DP's numbers, which name the DP group that is a TP group;
* same_shard (``dp_shard`` ignores the DP rank) -> the shard on paper, and PP x DP's numbers,
  which name the two DP ranks that trained on the same rows;
* clip_norm_per_rank (``global_grad_norm`` never sums over the TP group) -> TP x DP's numbers
  and the norm check, which name the step and the two TP ranks' norms;
* stage_boundary_off_by_one (``stage_blocks`` ends each stage one block late) -> the stages on
  paper, and PP x DP's numbers, which name the block that runs on two stages;
* prediction_forward_only and prediction_dp_payload (``predict_traffic`` alone wrong: the TP
  traffic of the forward pass only; the DP payload for its bus bytes) -> the prediction check
  alone, on paper, the wrong derivation named.

Each wrong lab runs through the self-check engine in this process, on the warm 4-rank pool,
only the checks its mistake can reach (its earlier pieces are the package's stand-ins: a wrong
lab's folder holds its capstone.py alone).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from wrong_labs import assert_fails_exactly

ROOT = Path(__file__).resolve().parents[2]
LAB = "capstone"
WRONG = ROOT / "tests" / "grading" / "wrong"

CASES = {
    "capstone_dp_group_across_tp": (
        ("mesh_ranks", "tp_dp_numbers"), {
            "mesh_ranks": ["mesh_ranks(4, inner=2, dp=2)", "are the inner (TP/PP) groups",
                           "lesson 14, section 1"],
            "tp_dp_numbers": ["the loss of step 0", "DP group [0, 1] is one of the TP groups",
                              "averaged over the wrong ranks"]}),
    "capstone_same_shard": (
        ("dp_shard", "pp_dp_numbers"), {
            "dp_shard": ["DP ranks 0 and 1 get the same rows", "lesson 14, section 2"],
            "pp_dp_numbers": ["two DP ranks of the DP group [0, 2]", "the same rows [0, 1, 2, 3]",
                              "its own shard"]}),
    "capstone_clip_norm_per_rank": (
        ("tp_dp_numbers", "global_grad_norm"), {
            "tp_dp_numbers": ["the loss of step", "clipped by a gradient norm",
                              "summed over the TP group"],
            "global_grad_norm": ["rank 0 clipped by a gradient norm", "rank 1 by",
                                 "the whole model's", "lesson 14, section 3"]}),
    "capstone_stage_boundary_off_by_one": (
        ("stage_blocks", "pp_dp_numbers"), {
            "stage_blocks": ["stage_blocks(4, 2, 0) = [0, 1, 2], expected [0, 1]",
                             "block 2 runs on two stages", "lesson 14, section 5"],
            "pp_dp_numbers": ["hold blocks [[0, 1], [1]]", "exactly one stage"]}),
    # the prediction alone wrong: graded on paper (no rank starts), beside a check it passes
    "capstone_prediction_forward_only": (
        ("predict_traffic", "lr_at"), {
            "predict_traffic": ["predict_traffic('tp'", "the TP group's bytes",
                                "count the forward pass only"]}),
    "capstone_prediction_dp_payload": (
        ("predict_traffic", "lr_at"), {
            "predict_traffic": ["predict_traffic('tp'", "the DP group's bytes",
                                "count the payload (the gradients' bytes) instead of the bus "
                                "bytes"]}),
}


@pytest.mark.parametrize("folder", sorted(CASES))
def test_a_wrong_lab_fails_exactly_its_checks(folder):
    only, expected = CASES[folder]
    assert_fails_exactly(folder, LAB, only, expected, max_ranks=4)


def test_the_wrong_labs_are_all_listed():
    on_disk = {p.name for p in WRONG.glob(f"{LAB}_*") if p.is_dir()}
    assert on_disk == set(CASES), sorted(on_disk ^ set(CASES))

