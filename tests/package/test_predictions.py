"""Predictions (``workbook.grading.predictions``): the judge, the report's table, and the guard
that a prediction is derived, not read from the package's own model.

The six overlap labs' prediction checks run here on a deliberately wrong lab each
(``tests/grading/wrong/<lab>_prediction_reads_the_model``): its prediction calls the model, so
the number is right, and the check must still fail, saying why. No ranks: the checks are
arithmetic, run through the self-check engine in this process.
"""
import math

import pytest

from wrong_labs import assert_fails_exactly
from workbook.grading.predictions import comparison_lines, judge_prediction, reads_the_model

MISTAKES = {"used the payload bytes": 50.0, "left out the latency": 90.0}


@pytest.mark.parametrize("got, words", [
    (100.0, None),
    (101.5, None),                                              # within 2 %
    (50.0, ["50 ms", "100 ms", "if you used the payload bytes"]),
    (90.4, ["left out the latency"]),
    (300.0, ["3 x the model", "Recheck each term: alpha, beta"]),
    (None, ["must be a number", "NoneType"]),
    ("100", ["must be a number", "str"]),
    (True, ["must be a number", "bool"]),
    (math.nan, ["must be a finite number"]),
])
def test_judge_prediction(got, words):
    message = judge_prediction(got, 100.0, MISTAKES, what="the tail", terms="alpha, beta")
    if words is None:
        assert message is None
    else:
        assert message and all(w in message for w in words), message
        assert "\n" not in message and not message.rstrip().endswith(":")


def test_a_mistake_equal_to_the_model_is_never_named():
    assert judge_prediction(100.0, 100.0, {"forgot (n-1)/n": 100.0}, what="x") is None
    message = judge_prediction(50.0, 100.0, {"same as the model": 100.0, "halved": 50.0}, what="x")
    assert "halved" in message and "same as the model" not in message


def test_the_comparison_table():
    lines = comparison_lines([("exposed tail", 52.3, 52.3, 755.0), ("step", None, 7220.0, None)])
    assert "you predicted" in lines[0] and "measured" in lines[0]
    assert lines[1].split()[-3:] == ["52.3", "52.3", "755"]
    assert lines[2].split()[-3:] == ["-", "7,220", "-"]


def _model(x):
    return 2 * x


def test_reads_the_model_sees_calls_imports_and_the_function_itself():
    def derived(x):
        doubled = x * 2                       # a local named like nothing of the model's
        return doubled

    def calls(x):
        return _model(x)

    def imports(x):
        from workbook.grading.predictions import judge_prediction as model    # noqa: F401
        return 0.0

    assert reads_the_model(derived, ("_model",)) is None
    assert "calls the package's model (_model)" in reads_the_model(calls, ("_model",))
    assert "judge_prediction" in reads_the_model(imports, ("judge_prediction",))
    assert "the package's own" in reads_the_model(judge_prediction, ("x",))


CHECKS = {"async_overlap": "predict_pipelined_ms", "domino": "predict_exposed_ms",
          "tp_overlap": "predict_ring_exposed_ms", "dp_overlap": "predict_exposed_ms",
          "pp_overlap": "predict_step_ms", "cp_ring": "predict_forward_exposed"}


@pytest.mark.parametrize("lab", sorted(CHECKS))
def test_a_prediction_read_from_the_model_is_refused(lab):
    check = CHECKS[lab]
    assert_fails_exactly(f"{lab}_prediction_reads_the_model", lab, (check,),
                         {check: ["calls the package's model", "derive the figure"]})
