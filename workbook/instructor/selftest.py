"""CI's check that the generated stubs are gradable, at every level the course hands out::

    python -m workbook.instructor.selftest stubs [--level standard|challenge|guided ...]

Grading ``labs/`` straight after ``workbook assign`` (the ``standard`` level; any other level is
generated into a temporary folder first) must run to the end (no hang), give 0 points,
and fail every graded test with the one-line "not implemented yet: <lab>.<function>" message. A
test that passes on a stub grades nothing of the learner's work; a stub failure with any other
message means the learner would read a stack dump instead of a TODO.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from workbook.grading.labs import repo_root


def check_stubs(level: str = "standard") -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        impl = "labs"
        if level != "standard":
            impl = str(Path(tmp) / f"labs_{level}")
            subprocess.check_call([sys.executable, "-m", "workbook.cli", "assign", "--level", level,
                                   "-o", impl], cwd=repo_root(), stdout=subprocess.DEVNULL)
        subprocess.call([sys.executable, "-m", "workbook.cli", "grade", "--impl", impl,
                         "--gradescope", str(out)], cwd=repo_root())
        if not out.exists():
            print("grading labs/ did not finish: no results written")
            return 1
        results = json.loads(out.read_text())
    bad = [t for t in results["tests"]
           if t["status"] == "passed" or not t["output"].startswith("not implemented yet")]
    for t in bad:
        why = "passes on a stub" if t["status"] == "passed" else f"says: {t['output'][:200]!r}"
        print(f"stub check: {t['name']} {why}")
    print(f"{level} stubs scored {results['score']:g} / {results['max_score']:g} over {len(results['tests'])} "
          f"graded tests; {len(bad)} not reported as 'not implemented yet'")
    return 1 if bad or results["score"] or not results["tests"] else 0


def main(argv: list[str]) -> int:
    levels = argv[2::2] if argv[1::2] == ["--level"] * len(argv[1::2]) else None
    if argv[:1] != ["stubs"] or levels is None or \
            any(lv not in ("guided", "standard", "challenge") for lv in levels):
        raise SystemExit("usage: python -m workbook.instructor.selftest stubs "
                         "[--level guided|standard|challenge ...]")
    codes = [check_stubs(level) for level in levels or ["standard"]]
    return max(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
