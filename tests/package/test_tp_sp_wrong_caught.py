"""The tp and sp graders catch the classic tensor-parallel mistakes.

Each deliberately wrong folder in tests/grading/wrong/ is graded through the self-check engine
in this process (the grader's own checks and messages, on the warm rank pools). The test checks that exactly the expected grading tests fail, and that each failure message names
the rank and the tensor (or collective) that went wrong. The sp fixture holds no ``tp.py``:
the sp grader checks lab 5 against the reference alone.
"""
from __future__ import annotations

import pytest
from wrong_labs import assert_caught, grade_in_process

TRACE_TP = ("test_tp_block_pattern_from_trace[2]", "test_tp_block_pattern_from_trace[3]")

# folder -> (grading file, {failing test: words its message must contain}, words no message may hold)
CASES = {
    # forward right, gradients wrong: f forgot its backward all-reduce
    "tp_missing_backward_allreduce": ("test_tp.py", {
        "test_conjugate_ops": ["rank ", "copy_to_tensor_parallel_region", "gradient of the input"],
        "test_parallel_linears": ["rank ", "ColumnParallelLinear", "gradient of the input",
                                  "differs from the reference"],
        "test_tp_mlp": ["rank ", "TPMLP", "gradient of the input"],
        "test_tp_attention": ["rank ", "TPAttention", "gradient of the input"],
        "test_tp_block": ["rank ", "TPBlock", "gradient of the input"],
        "test_tp_model": ["rank ", "TPModel", "gradient of "],
        "test_tp_model_collectives": ["rank ", "backward", "all-reduces of B*S*H"],
        **{t: ["rank ", "backward", "expected exactly 2 all_reduce, got 0"] for t in TRACE_TP},
    }, ["output differs", "loss differs"]),
    # the row-parallel bias is counted n times
    "tp_row_bias_every_rank": ("test_tp.py", {
        "test_parallel_linears": ["rank ", "RowParallelLinear", "output differs from the reference"],
        "test_tp_mlp": ["rank ", "TPMLP", "output differs"],
        "test_tp_attention": ["rank ", "TPAttention", "output differs"],
        "test_tp_block": ["rank ", "TPBlock", "output differs"],
        "test_tp_model": ["rank ", "TPModel", "loss differs"],
    }, []),
    # right numbers, wrong communication: full weights all-gathered on every rank
    "tp_allgathers_full_weights": ("test_tp.py", {
        "test_tp_model_collectives": ["rank ", "dist.all_gather_into_tensor", "only all-reduces"],
        **{t: ["rank ", "forward", "all_gather", "never weights"] for t in TRACE_TP},
    }, ["differs from the reference"]),
    # SP: the norms' gradients stay partial
    "sp_ln_grad_not_synced": ("test_sp.py", {
        "test_sp_block": ["rank ", "SPBlock", "gradient of blocks.1.norm1.weight",
                          "synchronised after backward", "differs"],
        "test_sp_model": ["rank ", "SPModel", ".norm", "synchronised after backward"],
    }, ["output differs", "loss differs"]),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("folder", sorted(CASES))
def test_wrong_tp_sp_is_caught(folder):
    test_file, expected, never = CASES[folder]
    assert_caught(folder, grade_in_process(folder, test_file[len("test_"):-len(".py")]),
                  expected, never)
