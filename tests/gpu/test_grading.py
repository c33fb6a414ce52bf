"""Every lab's grader on the GPUs: ``workbook grade --impl solutions --lab LAB`` with the ranks on
CUDA (``WORKBOOK_BACKEND=cuda``, see conftest), and the solutions must score full marks.

This is the real grading path, a ``workbook grade`` process per lab with its Gradescope results
read back, so a failure names the check and says why in the grader's own words. Checks graded on
the simulated link still run on CPU ranks (the link is a CPU device's: ``engine.on_ranks``);
every other check runs on the ranks the header of this run lists (NCCL, or gloo with CUDA tensors).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbook.grading.labs import LABS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("lab", LABS)
def test_solutions_score_full_marks_on_the_gpus(lab, on_gpus, tmp_path):
    for n, layout in on_gpus.items():
        print(f"{n} rank(s): {layout.summary()}")
    results = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "workbook.cli", "grade", "--impl", "solutions",
                           "--lab", lab, "--gradescope", str(results)],
                          capture_output=True, text=True, cwd=ROOT, env=dict(os.environ),
                          timeout=3500)
    print(proc.stdout[-4000:])
    assert results.exists(), (f"workbook grade --lab {lab} wrote no results (exit {proc.returncode}):"
                              f"\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    doc = json.loads(results.read_text())
    failed = [t for t in doc["tests"] if t["score"] < t["max_score"]]
    assert not failed, (f"{lab} on the GPUs: {doc['score']:g} / {doc['max_score']:g}\n" +
                        "\n".join(f"  {t['name']}: {t['output']}" for t in failed))
    assert doc["score"] == doc["max_score"] > 0
