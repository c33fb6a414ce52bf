"""The overlap_math grader catches a cost model that forgets the bus factor: exactly the three
checks that price a collective fail, each message naming what is wrong.

Graded through the self-check engine in this process (``wrong_labs.grade_in_process``: the
grader's own test functions and messages, on the warm rank pools), as every wrong lab is; the
pytest-subprocess path a course's CI takes is covered once, in ``test_wrong_impls_caught.py``.
"""
from wrong_labs import assert_caught, grade_in_process

FOLDER = "overlap_math_no_bus_factor"
EXPECTED = {
    "test_collective_time_uses_bus_factors": ["bus factor"],
    "test_tp_dp_zero3_pp_predictions": ["collective_time is not right yet"],
    "test_predictions_match_the_measured_trace": ["collective_time predicts", "rank 0"],
}


def test_missing_bus_factor_loses_the_right_points():
    assert_caught(FOLDER, grade_in_process(FOLDER, "overlap_math"), EXPECTED)
