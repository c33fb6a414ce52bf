"""The async_overlap grader catches a wrong derivation of the prediction: the deliberately wrong
lab in tests/grading/wrong/async_overlap_prediction_*/ fails the prediction check alone, with a
message that names the term it got wrong:

* payload_bytes: the all-reduce charged its payload, not its bus bytes -> named on 4 ranks (on
  2 the two are equal);
* no_overlap: every chunk's compute and all-reduce added up -> named on the first setting.
 (The schedule's own mistakes, never waiting, waiting at
once, the wrong handle, are cases of ``test_wrong_impls_caught.py``.)

The prediction is arithmetic: its check runs without ranks, through the self-check engine in
this process (``wrong_labs.assert_fails_exactly``), and only that check.
"""
from __future__ import annotations

import pytest

from wrong_labs import assert_fails_exactly

# folder -> (checks run, {failing check: words its message must contain})
CASES = {
    "async_overlap_prediction_payload_bytes": (("predict_pipelined_ms",), {
        "predict_pipelined_ms": ["predict_pipelined_ms(link, n=4", "payload bytes",
                                 "bus bytes, 2(n-1)/n"]}),
    "async_overlap_prediction_no_overlap": (("predict_pipelined_ms",), {
        "predict_pipelined_ms": ["predict_pipelined_ms(link, n=2", "as if nothing overlapped"]}),
}


@pytest.mark.parametrize("folder", sorted(CASES))
def test_wrong_async_overlap_prediction_caught(folder):
    only, expected = CASES[folder]
    assert_fails_exactly(folder, "async_overlap", only, expected)
