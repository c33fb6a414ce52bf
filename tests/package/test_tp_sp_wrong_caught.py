"""The tp and sp graders catch the classic tensor-parallel mistakes.

Each deliberately wrong folder in tests/grading/wrong/ is graded through the self-check engine
in this process (the grader's own checks and messages, on the warm rank pools). The test checks that exactly the expected grading tests fail, and that each failure message names
the rank and the tensor (or collective) that went wrong, the sub-step (the embedding or the loss
inside the model's test, as a challenge-level component would be graded), and, where the ranks'
results match a classic mistake, its likely cause in the words of the spec and the lesson. The sp fixture holds no ``tp.py``:
the sp grader checks lab 5 against the reference alone.

Each folder is graded on the checks it must fail only, on at most 2 ranks
(``wrong_labs.grade_where_caught``): every one of these mistakes shows on 2 ranks, and a full
grading (every check, 1 to 4 ranks: ``WORKBOOK_WRONG_LABS_ALL_CHECKS=1``) fails exactly the
same checks, with the same words. The numerics run of every part on 3 and 4 ranks, and the
checks that pass, were most of each folder's time.
"""
from __future__ import annotations

import pytest
from wrong_labs import assert_caught, grade_where_caught

TRACE_TP = ("test_tp_block_pattern_from_trace[2]", "test_tp_block_pattern_from_trace[3]")
RANK_CAP = 2            # every mistake below shows on 2 ranks (a pattern check of 3 is graded on 2)

# folder -> (grading file, {failing test: words its message must contain}, words no message may hold)
CASES = {
    # forward right, gradients wrong: f forgot its backward all-reduce
    "tp_missing_backward_allreduce": ("test_tp.py", {
        "test_conjugate_ops": ["rank ", "copy_to_tensor_parallel_region", "gradient of the input",
                               "Likely cause: f's backward returned this rank's own gradient"],
        "test_parallel_linears": ["rank ", "ColumnParallelLinear", "gradient of the input",
                                  "differs from the reference", "Likely cause", "its own share",
                                  "The conjugate pair f and g"],
        "test_tp_mlp": ["rank ", "TPMLP", "gradient of the input", "its own share"],
        "test_tp_attention": ["rank ", "TPAttention", "gradient of the input", "its own share"],
        "test_tp_block": ["rank ", "TPBlock", "gradient of the input"],
        "test_tp_model": ["rank ", "TPModel", "gradient of "],
        "test_tp_model_collectives": ["rank ", "backward", "all-reduces of B*S*H"],
        **{t: ["rank ", "backward", "expected exactly 2 all_reduce, got 0"] for t in TRACE_TP},
    }, ["output differs", "loss differs"]),
    # the row-parallel bias is counted n times
    "tp_row_bias_every_rank": ("test_tp.py", {
        "test_parallel_linears": ["rank ", "RowParallelLinear", "output differs from the reference",
                                  "Likely cause", "extra cop", "after the sum, once"],
        "test_tp_mlp": ["rank ", "TPMLP", "output differs", "after the sum, once"],
        "test_tp_attention": ["rank ", "TPAttention", "output differs"],
        "test_tp_block": ["rank ", "TPBlock", "output differs"],
        "test_tp_model": ["rank ", "TPModel", "loss differs"],
    }, []),
    # right numbers, wrong communication: full weights all-gathered on every rank
    "tp_allgathers_full_weights": ("test_tp.py", {
        "test_tp_model_collectives": ["rank ", "dist.all_gather_into_tensor", "only all-reduces"],
        **{t: ["rank ", "forward", "all_gather", "never weights"] for t in TRACE_TP},
    }, ["differs from the reference"]),
    # the vocab-parallel loss shifts by each rank's own maximum: named as the loss, not the model
    "tp_loss_max_per_rank": ("test_tp.py", {
        "test_tp_model": ["rank ", "vocab_parallel_cross_entropy", "loss differs",
                          "Likely cause", "maximum over the whole vocabulary"],
    }, ["TPModel"]),
    # the vocab-parallel embedding never sums the ranks' lookups: named as the embedding
    "tp_embedding_not_summed": ("test_tp.py", {
        "test_tp_model": ["rank ", "VocabParallelEmbedding", "output differs", "Likely cause",
                          "summed over the ranks"],
        "test_tp_model_collectives": ["rank ", "forward", "1 for the embedding"],
    }, []),
    # SP: the norms' gradients stay partial
    "sp_ln_grad_not_synced": ("test_sp.py", {
        "test_sp_block": ["rank ", "SPBlock", "gradient of blocks.1.norm1.weight",
                          "synchronised after backward", "differs", "Likely cause",
                          "tagged sequence-parallel"],
        "test_sp_model": ["rank ", "SPModel", ".norm", "synchronised after backward",
                          "tagged sequence-parallel"],
    }, ["output differs", "loss differs"]),
    # SP: each shard draws a dropout mask of its own shape, not its slice of the reference's
    "sp_dropout_mask_of_shard": ("test_sp.py", {
        "test_sp_block": ["rank ", "SPBlock", "output differs", "Likely cause",
                          "right without dropout", "Two new duties"],
        "test_sp_model": ["rank ", "SPModel", "loss differs", "right without dropout"],
    }, ["synchronised after backward"]),
    # SP: the learned positions' gradient stays partial: named as the embedding
    "sp_positions_not_tagged": ("test_sp.py", {
        "test_sp_model": ["rank ", "SPEmbedding", "embed.pos.weight", "synchronised after backward",
                          "Likely cause", "tagged sequence-parallel"],
    }, ["output differs", "loss differs"]),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("folder", sorted(CASES))
def test_wrong_tp_sp_is_caught(folder):
    test_file, expected, never = CASES[folder]
    lab = test_file[len("test_"):-len(".py")]
    assert_caught(folder, grade_where_caught(folder, lab, expected, max_ranks=RANK_CAP),
                  expected, never)
