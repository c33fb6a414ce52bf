"""The domino grader catches the mistakes the lab is about: each deliberately wrong lab in
tests/grading/wrong/domino_*/ fails exactly the tests it should, with a message that teaches.

* waits_immediately: numbers right, every all-reduce waited at once -> both overlap tests;
* never_waits: WaitInBackward forgets to wait -> the registry names the leaked handle;
* wrong_chunk_order: chunks joined in reverse -> the numerics tests (final hidden states);
* early_backward_wait: no lookahead, the backward waits right after starting -> backward overlap.

Each folder is graded in its own pytest subprocess, one after the other: the overlap tests
measure wall-clock time, and four graders at once on a small machine would disturb each other.
"""
from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GRADING = ROOT / "tests" / "grading"
NUMERICS = ("test_domino_matches_reference_tp2", "test_domino_matches_reference_tp4")
BOTH_OVERLAPS = ("test_forward_communication_hidden", "test_backward_communication_hidden")

# folder -> {failing test: words its message must contain}
CASES = {
    "domino_waits_immediately": {
        "test_forward_communication_hidden": ["rank ", "forward pass", "hidden behind compute",
                                              "at least 90%"],
        "test_backward_communication_hidden": ["rank ", "backward pass", "at least 80%"],
    },
    "domino_never_waits": {
        **{t: ["rank ", "never waited on", ".bwd"] for t in NUMERICS},
        "test_registry_empty_after_each_step": ["rank ", "never waited on", "chunk"],
        **{t: ["never waited on"] for t in BOTH_OVERLAPS},
    },
    "domino_wrong_chunk_order": {
        t: ["rank ", "final hidden states (chunks in batch order)", "differs", "expected"]
        for t in NUMERICS},
    "domino_early_backward_wait": {
        "test_backward_communication_hidden": ["rank ", "backward pass", "WaitInBackward",
                                               "at least 80%"],
    },
}


def _grade(folder: Path, junit: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("WORKBOOK_IMPL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "--impl", str(folder), str(GRADING / "test_domino.py"),
         "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("domino_wrong")
    result = {}
    for folder in CASES:
        out, _ = _grade(GRADING / "wrong" / folder, tmp / f"{folder}.xml").communicate(timeout=600)
        junit = tmp / f"{folder}.xml"
        assert junit.exists(), f"pytest did not run for {folder}:\n{out[-3000:]}"
        cases = {}
        for case in ET.parse(junit).getroot().iter("testcase"):
            failure = case.find("failure")
            if failure is None:
                failure = case.find("error")
            cases[case.get("name")] = None if failure is None else \
                (failure.get("message") or "") + "\n" + (failure.text or "")
        result[folder] = cases
    return result


@pytest.mark.parametrize("folder", sorted(CASES))
def test_wrong_domino_is_caught(folder, outcomes):
    outcome, expected = outcomes[folder], CASES[folder]
    assert outcome, "no grading test ran"
    failed = {name for name, message in outcome.items() if message is not None}
    assert failed == set(expected), (
        f"{folder}: expected exactly {sorted(expected)} to fail, got {sorted(failed)}")
    for name, words in expected.items():
        message = outcome[name]
        assert "not implemented yet" not in message
        for word in words:
            assert word in message, f"{folder}: {name}'s message lacks {word!r}:\n{message[:1500]}"
