"""Grading a class locally: ``workbook grade --class-dir DIR --csv scores.csv``.

One folder per student; each is graded in a subprocess of its own, and a broken submission
(missing files, a lab that hangs at import) gets a row with a note, never stops the run.
The rank cap keeps it fast: collectives on one rank is the smallest lab there is; the two
students with files are graded at once (``--jobs 2``: collectives reads no measured time).
"""
from __future__ import annotations

import csv
import shutil
import subprocess
import sys
import time
from pathlib import Path

from workbook.instructor.classroom import grade_student, lab_max_points

ROOT = Path(__file__).resolve().parents[2]


def _class(tmp_path: Path) -> Path:
    root = tmp_path / "submissions"
    (root / "alice").mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / "collectives.py", root / "alice" / "collectives.py")
    (root / "bob" / "labs").mkdir(parents=True)                # files one folder down
    shutil.copy(ROOT / "labs" / "collectives.py", root / "bob" / "labs" / "collectives.py")
    (root / "carol").mkdir()                                     # handed in the wrong file
    (root / "carol" / "collective.py").write_text("print('hello')\n")
    return root


def test_class_csv(tmp_path):
    root = _class(tmp_path)
    out = tmp_path / "scores.csv"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "workbook.cli", "grade", "--class-dir", str(root),
                           "--lab", "collectives", "--csv", str(out), "--max-ranks", "1",
                           "--jobs", "2"],
                          cwd=ROOT, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["student"]: r for r in csv.DictReader(out.open())}
    full = lab_max_points("collectives")
    assert list(rows) == ["alice", "bob", "carol"]
    assert list(rows["alice"]) == ["student", "collectives", "total", "max", "notes"]
    alice, bob, carol = rows["alice"], rows["bob"], rows["carol"]
    assert float(alice["collectives"]) == float(alice["total"]) == full == float(alice["max"])
    assert alice["notes"] == ""
    assert float(bob["total"]) == 0 and float(bob["max"]) == full
    assert "files found in labs/" in bob["notes"] and "not implemented yet" in bob["notes"]
    assert float(carol["total"]) == 0 and "missing collectives.py" in carol["notes"]
    assert "alice" in proc.stdout and f"total {full:g}/{full:g}" in proc.stdout
    assert "2 at a time" in proc.stdout
    lines = [line.split()[0] for line in proc.stdout.splitlines()[1:4]]
    assert lines == ["alice", "bob", "carol"], proc.stdout          # in order, though graded at once
    kept = tmp_path / "scores-results"
    assert sorted(p.name for p in kept.iterdir()) == ["alice.json", "alice.log", "bob.json",
                                                      "bob.log"]
    print(f"graded 3 students in {time.monotonic() - t0:.0f} s")


def test_a_hanging_submission_is_stopped(tmp_path):
    """A lab that never finishes importing: the student's time limit ends it (and every process
    it started), the row says so, and the caller goes on."""
    student = tmp_path / "dave"
    student.mkdir()
    (student / "collectives.py").write_text("import time\ntime.sleep(600)\n")
    t0 = time.monotonic()
    r = grade_student(student, ["collectives"], timeout=8, max_ranks=1, workdir=tmp_path / "work")
    assert time.monotonic() - t0 < 40
    assert r.scores == {"collectives": 0.0}
    assert any("time limit of 8 s" in n for n in r.notes), r.notes
    left = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "work") not in left, left


def test_usage_errors(tmp_path, capsys):
    """Each a one-line error, exit status 2 (``workbook.cli.main`` in this process: the same
    parser and messages as the command, without a Python started for each)."""
    from workbook import cli
    for args, says in ((["--class-dir", str(tmp_path / "none")], "is not a folder"),
                       (["--class-dir", str(tmp_path), "--lab", "nope"], "unknown lab"),
                       (["--csv", str(tmp_path / "s.csv")], "use it with --class-dir"),
                       (["--jobs", "2"], "use it with --class-dir"),
                       (["--max-ranks", "0"], "at least 1")):
        code = cli.main(["grade", *args])
        err = capsys.readouterr().err
        assert code == 2 and says in err, (args, err)
