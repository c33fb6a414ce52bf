"""The overlap_math grader catches a cost model that forgets the bus factor."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_missing_bus_factor_loses_the_right_points(tmp_path):
    out = tmp_path / "results.json"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    str(ROOT / "tests/grading/test_overlap_math.py"), "--impl",
                    str(ROOT / "tests/grading/wrong/overlap_math_no_bus_factor"),
                    "--gradescope", str(out)], cwd=ROOT, capture_output=True, timeout=300)
    tests = {t["name"].split("::")[1]: t for t in json.loads(out.read_text())["tests"]}
    failed = {name for name, t in tests.items() if t["status"] == "failed"}
    assert failed == {"collective_time_uses_bus_factors", "tp_dp_zero3_pp_predictions",
                      "predictions_match_the_measured_trace"}
    assert "collective_time predicts" in tests["predictions_match_the_measured_trace"]["output"]
    assert "bus factor" in tests["collective_time_uses_bus_factors"]["output"]
    assert "collective_time is not right yet" in tests["tp_dp_zero3_pp_predictions"]["output"]
    assert "rank 0" in tests["predictions_match_the_measured_trace"]["output"]
