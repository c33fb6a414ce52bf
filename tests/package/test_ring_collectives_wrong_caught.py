"""The collectives and ring_allreduce graders name the sub-step a wrong answer got wrong, the
same at every level (a challenge-level learner writes the ring, or the rooted builds, in one go
but the grader still checks each function on its own): each deliberately wrong lab in
tests/grading/wrong/{ring_allreduce,collectives}_*/ fails exactly the checks it should, with a
message that says which phase or which half is at fault, or, for the cost model, which term of
the derivation. (Older cases of these labs, a ring on the built-in, an all-gather one chunk off,
a tree with too many rounds, are in ``test_wrong_impls_caught.py``.)

Graded in process through the self-check engine (``wrong_labs.assert_fails_exactly``) on at most
2 ranks, as a small grading machine would.
"""
from __future__ import annotations

import pytest

from wrong_labs import assert_fails_exactly

RING = ("ring_reduce_scatter", "ring_all_gather", "ring_all_reduce_matches_builtin",
        "ring_all_reduce_pattern")
NOT_GRADED = "not graded until the numbers are right"

# folder -> (lab, checks run, {failing check: words its message must contain})
CASES = {
    "ring_allreduce_reduce_scatter_overwrites": ("ring_allreduce", RING, {
        "ring_reduce_scatter": ["rank ", "ring_reduce_scatter(sum)", "must hold the reduction of "
                                "all 2 ranks' copies", "Step through the ring"],
        "ring_all_reduce_matches_builtin": ["rank ", "ring_all_reduce(", "is wrong",
                                            "phase 1 on its own fails",
                                            "fix the reduce-scatter first"],
        "ring_all_reduce_pattern": [NOT_GRADED],
    }),
    "ring_allreduce_strided_copy_lost": ("ring_allreduce", RING, {
        "ring_all_reduce_matches_builtin": ["rank ", "(not contiguous)", "contiguous, passed "
                                            "before it", "must end up in the tensor given"],
        "ring_all_reduce_pattern": [NOT_GRADED],
    }),
    "ring_allreduce_ring_time_whole_tensor": ("ring_allreduce", ("cost_model",), {
        "cost_model": ["ring_time(S=", "n=2", "that is the value you get if you sent the whole "
                       "tensor in each step instead of one chunk of S / n"],
    }),
    "collectives_all_reduce_skips_broadcast": ("collectives", (
            "all_reduce_matches_builtin", "all_reduce_pattern"), {
        "all_reduce_matches_builtin": ["rank 1", "all_reduce(", "The ranks disagree",
                                       "only rank 0 holds", "the broadcast half"],
        "all_reduce_pattern": [NOT_GRADED],
    }),
}


@pytest.mark.parametrize("folder", sorted(CASES))
def test_wrong_sub_step_is_named(folder):
    lab, only, expected = CASES[folder]
    assert_fails_exactly(folder, lab, only, expected)
