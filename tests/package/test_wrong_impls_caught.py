"""The autograder catches known mistakes: each deliberately wrong lab in tests/grading/wrong/
fails exactly the tests it should, with a message that names the rank and what differed.

Each case grades one wrong folder through the self-check engine in this process, on the warm
rank pools (``wrong_labs.grade_where_caught``: the grader's own test functions and messages), on
the checks it must fail: a full grading fails exactly those (run 21 graded every check of every
folder here and asserted it), and ``WORKBOOK_WRONG_LABS_ALL_CHECKS=1`` grades every check again
to prove it after a grader changes. One case is also graded in full the way a course's CI runs
it, in a pytest subprocess (``--impl tests/grading/wrong/X``, JUnit XML read back), and must fail
the same tests with the same words.
"""
from __future__ import annotations

import pytest
from wrong_labs import assert_caught, grade, grade_where_caught

# folder -> (grading test file, {failing test: words its message must contain})
CASES = {
    "ring_off_by_one": ("test_ring_allreduce.py", {
        "test_ring_all_gather": ["rank ", "differs from the built-in at index", "expected"],
        "test_ring_all_reduce_matches_builtin": ["rank ", "ring_all_reduce(", "differs from the "
                                                 "built-in at index", "got"],
        "test_ring_all_reduce_pattern": ["not graded until the numbers are right",
                                         "ring_all_reduce_matches_builtin"],
    }),
    "ring_uses_builtin": ("test_ring_allreduce.py", {
        "test_ring_all_reduce_pattern": ["rank ", "dist.all_reduce", "ring_all_reduce("],
    }),
    "broadcast_uses_builtin": ("test_collectives.py", {
        "test_broadcast_pattern": ["rank ", "dist.broadcast", "broadcast(src="],
    }),
    "tree_too_many_rounds": ("test_collectives.py", {
        "test_tree_broadcast_pattern": ["rank ", "(the root)", "tree_broadcast(", "3 rounds",
                                        "ceil(log2 4) = 2"],
    }),
    "async_overlap_wait_immediately": ("test_async_overlap.py", {
        "test_overlapped_all_reduce_hides_communication": ["rank ", "hidden behind compute"],
        "test_pipelined_all_reduce_hides_communication": ["rank ", "hidden behind compute"],
    }),
    "async_overlap_never_wait": ("test_async_overlap.py", {
        "test_overlapped_all_reduce_numbers": ["rank ", "never waited on"],
        "test_overlapped_all_reduce_hides_communication": ["rank ", "never waited on"],
        "test_pipelined_all_reduce_numbers": ["rank ", "never waited on"],
        "test_pipelined_all_reduce_hides_communication": ["rank ", "never waited on"],
    }),
    "async_overlap_wrong_handle": ("test_async_overlap.py", {
        "test_pipelined_all_reduce_numbers": ["rank ", "chunk 0's all-reduce", "never waited on"],
        "test_pipelined_all_reduce_hides_communication": ["rank ", "never waited on"],
    }),
}


@pytest.mark.parametrize("folder", sorted(CASES))
def test_wrong_implementation_is_caught(folder):
    test_file, expected = CASES[folder]
    assert_caught(folder, grade_where_caught(folder, test_file[len("test_"):-len(".py")], expected),
                  expected)


def test_a_wrong_lab_is_caught_under_pytest_too(tmp_path):
    """The path an instructor's CI takes: ``pytest --impl`` in a subprocess, JUnit XML."""
    folder = "ring_uses_builtin"
    test_file, expected = CASES[folder]
    assert_caught(folder, grade(folder, test_file, tmp_path / "junit.xml"), expected)
