"""The autograder catches known mistakes: each deliberately wrong lab in tests/grading/wrong/
fails exactly the tests it should, with a message that names the rank and what differed.

Each case grades one wrong folder in a pytest subprocess (``--impl tests/grading/wrong/X``,
JUnit XML read back), the way a course's CI would run it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GRADING = ROOT / "tests" / "grading"

# folder -> (grading test file, {failing test: words its message must contain})
CASES = {
    "ring_off_by_one": ("test_ring_allreduce.py", {
        "test_ring_all_gather": ["rank ", "differs from the built-in at index", "expected"],
        "test_ring_all_reduce_matches_builtin": ["rank ", "ring_all_reduce(", "differs from the "
                                                 "built-in at index", "got"],
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


def _plugin_args() -> list[str]:
    """``-p workbook.grading.plugin`` unless the installed package already registers it."""
    names = {ep.value for ep in entry_points(group="pytest11")}
    return [] if any(v.startswith("workbook.grading.plugin") for v in names) else \
        ["-p", "workbook.grading.plugin"]


def _grade(folder: Path, test_file: str, tmp_path: Path) -> dict[str, str | None]:
    """{test name: failure message, or None if it passed}."""
    junit = tmp_path / "junit.xml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("WORKBOOK_IMPL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *_plugin_args(), "--impl", str(folder),
         str(GRADING / test_file), "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert junit.exists(), f"pytest did not run:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    outcome = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        outcome[case.get("name")] = None if failure is None else \
            (failure.get("message") or "") + "\n" + (failure.text or "")
    return outcome


@pytest.mark.parametrize("folder", sorted(CASES))
def test_wrong_implementation_is_caught(folder, tmp_path):
    test_file, expected = CASES[folder]
    outcome = _grade(GRADING / "wrong" / folder, test_file, tmp_path)
    assert outcome, "no grading test ran"
    failed = {name for name, message in outcome.items() if message is not None}
    assert failed == set(expected), (
        f"{folder}: expected exactly {sorted(expected)} to fail, got {sorted(failed)}")
    for name, words in expected.items():
        message = outcome[name]
        assert "not implemented yet" not in message
        for word in words:
            assert word in message, f"{folder}: {name}'s message lacks {word!r}:\n{message[:1500]}"
