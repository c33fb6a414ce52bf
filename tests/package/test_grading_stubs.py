"""``workbook.grading.stubs``: an untouched generated stub is told in the grading process, in
the words its rank would raise, and anything the learner wrote is left to the ranks."""
from __future__ import annotations

import pytest

from workbook.grading.labs import load_lab
from workbook.grading.stubs import raise_if_stub, stub_message


def test_the_generated_stubs_are_read_and_the_solutions_are_not():
    for impl in ("labs", "solutions"):
        dp, ps = load_lab("dp_overlap", impl), load_lab("pp_schedules", impl)
        got = [stub_message(f) for f in (dp.NaiveDP.finish_gradient_sync, dp.Zero3.before_forward,
                                         ps.OverlappedChunkedExecutor.forward_step)]
        if impl == "labs":
            assert got == ["not implemented yet: dp_overlap.NaiveDP.finish_gradient_sync",
                           "not implemented yet: dp_overlap.ShardedTrainer.before_forward",
                           "not implemented yet: pp_schedules.OverlappedChunkedExecutor.forward_step"]
        else:
            assert got == [None, None, None]
    # given code before the raise (the stub's optimizer step runs Adam first): not a stub
    assert stub_message(load_lab("dp_overlap", "labs").ShardedTrainer.optimizer_step) is None


def _written(x):
    """Anything but the stub's one line."""
    if x:
        raise NotImplementedError("not implemented yet: lab.written")
    return x


def _other_error():
    raise ValueError("not implemented yet: lab.other")


def _stub():
    """A docstring, then the generated line."""
    raise NotImplementedError("not implemented yet: lab.stub")


def test_only_the_stubs_line_counts_and_the_first_stub_is_raised():
    assert stub_message(_written) is None and stub_message(_other_error) is None
    assert stub_message(print) is None                         # no source to read
    assert stub_message(_stub) == "not implemented yet: lab.stub"
    raise_if_stub(_written, _other_error)                      # nothing raised
    with pytest.raises(NotImplementedError, match=r"^not implemented yet: lab\.stub$"):
        raise_if_stub(_written, _stub, _other_error)
