"""The tp and sp graders catch the classic tensor-parallel mistakes.

Each deliberately wrong folder in tests/grading/wrong/ is graded in a pytest subprocess
(``--impl tests/grading/wrong/X``, JUnit XML read back), as a course's CI would run it. The
test checks that exactly the expected grading tests fail, and that each failure message names
the rank and the tensor (or collective) that went wrong. The sp fixture holds ``tp.py`` as a
link to the reference lab 4, which the sp grader compares with.
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
        "test_sp_matches_tp_lab": ["rank ", "SPModel vs lab 4's TPModel", ".norm"],
    }, ["output differs", "loss differs"]),
}


def _plugin_args() -> list[str]:
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
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert junit.exists(), f"pytest did not run:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    outcome = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        outcome[case.get("name")] = None if failure is None else \
            (failure.get("message") or "") + "\n" + (failure.text or "")
    return outcome


@pytest.mark.timeout(300)
@pytest.mark.parametrize("folder", sorted(CASES))
def test_wrong_tp_sp_is_caught(folder, tmp_path):
    test_file, expected, never = CASES[folder]
    outcome = _grade(GRADING / "wrong" / folder, test_file, tmp_path)
    assert outcome, "no grading test ran"
    failed = {name for name, message in outcome.items() if message is not None}
    assert failed == set(expected), (
        f"{folder}: expected exactly {sorted(expected)} to fail, got {sorted(failed)}")
    for name, words in expected.items():
        message = outcome[name]
        first = message.split("\n", 1)[0]
        assert "not implemented yet" not in message
        for word in words:
            assert word in message, f"{folder}: {name}'s message lacks {word!r}:\n{message[:1500]}"
        for word in never:
            assert word not in first, f"{folder}: {name}'s message says {word!r}:\n{first[:500]}"
