"""Where a self-check's traces go, and the self-check's numeric options.

* ``trace_folders``: the trace folder itself, and each subfolder of it that holds rank traces (a
  report that traces every variant apart, as dp_overlap's);
* the figures' traces go to ``runs/LAB/selfcheck-<date>-<time>/`` of the course folder, the
  newest ``KEEP_TRACES`` kept, nothing left in the temp dir (pp_overlap, the cheapest of the
  reports that trace each variant apart, on the solutions, on the shared rank pool);
* under torchrun every rank reads the folder rank 0 named;
* ``--timeout`` and ``--nproc`` out of range: one line, exit status 2.
"""
import os
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from workbook import selfcheck
from workbook.selfcheck import (KEEP_TRACES, main, new_trace_dir, positive_count, positive_seconds,
                                prune_trace_dirs, trace_folders)

ROOT = Path(__file__).resolve().parents[2]


def test_trace_folders(tmp_path):
    assert trace_folders(tmp_path / "missing") == []
    assert trace_folders(tmp_path) == []
    for folder in ("zero3", "naive", "empty"):
        (tmp_path / folder).mkdir()
    (tmp_path / "naive" / "rank0.trace.json").write_text("{}")
    (tmp_path / "zero3" / "rank1.trace.json.gz").write_bytes(b"")
    assert trace_folders(tmp_path) == [tmp_path / "naive", tmp_path / "zero3"]
    (tmp_path / "rank0.trace.json").write_text("{}")
    assert trace_folders(tmp_path)[0] == tmp_path


# --------------------------------------------------------------------------- runs/LAB
def _clock(monkeypatch, stamps):
    """``time.strftime`` in selfcheck gives ``stamps`` in turn (one self-check per stamp)."""
    it = iter(stamps)
    monkeypatch.setattr(selfcheck.time, "strftime", lambda fmt: next(it))


def test_new_trace_dir_keeps_the_newest_and_leaves_other_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBOOK_ROOT", str(tmp_path))
    runs = tmp_path / "runs" / "tp"
    (runs / "mine").mkdir(parents=True)                    # a --trace-dir of the learner's own
    _clock(monkeypatch, ["20260101-090000", "20260101-090000", "20260101-090001",
                         "20260101-090002", "20260101-090003"])
    made = [new_trace_dir("tp") for _ in range(5)]
    assert all(p.parent == runs for p in made)
    assert [p.name for p in made[:2]] == ["selfcheck-20260101-090000",
                                         "selfcheck-20260101-090000-02"]   # same second
    assert sorted(p.name for p in runs.iterdir()) == ["mine", *(p.name for p in made[-KEEP_TRACES:])]
    assert prune_trace_dirs(runs, 1) == made[-KEEP_TRACES:-1]
    assert sorted(p.name for p in runs.iterdir()) == ["mine", made[-1].name]


class _Store(dict):
    def set(self, key, value):
        self[key] = value.encode()

    def get(self, key):
        return self[key]


def test_torchrun_ranks_read_the_folder_rank_0_named(tmp_path, monkeypatch):
    """Rank 0 names the folder; rank 1, a second later by its own clock, uses the same one."""
    monkeypatch.setenv("WORKBOOK_ROOT", str(tmp_path))
    store = _Store()
    _clock(monkeypatch, ["20260101-090000", "20260101-090001"])
    rank0 = new_trace_dir("dp_overlap", SimpleNamespace(rank=0, local_rank=0, store=store))
    rank1 = new_trace_dir("dp_overlap", SimpleNamespace(rank=1, local_rank=1, store=store))
    assert rank0 == rank1 == tmp_path / "runs" / "dp_overlap" / "selfcheck-20260101-090000"
    assert rank0.is_dir()


def _point_tempdir_at(folder):
    """On a rank of the shared pool (which outlives this test): temp files go to ``folder``
    from now on; returns where they went before (for ``_restore_tempdir``)."""
    before = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = folder
    return before


def _restore_tempdir(before):
    env, tempdir = before
    if env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = env
    tempfile.tempdir = tempdir


def test_figures_traces_go_to_runs_lab_and_nothing_to_the_temp_dir(tmp_path, monkeypatch):
    from workbook.grading import engine
    from workbook.grading.labs import ENV_IMPL
    from workbook.pipeline_parallel import pp_overlap_report as report
    tmp, course = tmp_path / "tmp", tmp_path / "course"
    tmp.mkdir()
    runs = course / "runs" / "pp_overlap"
    for old in ("selfcheck-20000101-000000", "selfcheck-20000101-000001",
                "selfcheck-20000101-000002", "by-hand"):
        (runs / old).mkdir(parents=True)
    n = report.WORLD_SIZE
    # the pool starts (if it is not warm yet) before this test moves the course folder (its ranks
    # keep the WORKBOOK_* variables they start with, for the tests after this one) and the temp
    # dir (the folders a process keeps while it lives, multiprocessing's pymp-*, are no leftovers)
    before = engine.on_ranks(n, _point_tempdir_at, str(tmp), link=report.LINK)
    monkeypatch.setenv("WORKBOOK_ROOT", str(course))
    monkeypatch.setenv(ENV_IMPL, str(ROOT / "solutions"))
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    try:
        lines = []
        selfcheck._figures("pp_overlap", None, "none", None, 300.0, None, lines.append)
    finally:
        engine.on_ranks(n, _restore_tempdir, before[0], link=report.LINK)
    text = "\n".join(lines)
    assert "pp_overlap figures" in text and "figures skipped" not in text, text
    assert list(tmp.iterdir()) == [], "left in the temp dir"
    made = sorted(p.name for p in runs.glob("selfcheck-*"))
    assert len(made) == KEEP_TRACES and made[:2] == ["selfcheck-20000101-000001",
                                                    "selfcheck-20000101-000002"], made
    assert (runs / "by-hand").is_dir()
    new = runs / made[-1]
    variants = ("no_comm", *report.VARIANTS)
    for v in variants:
        assert sorted(p.name for p in (new / v).glob("rank*.trace.json")) == \
            [f"rank{r}.trace.json" for r in range(n)]
        assert f"  traces: {new / v}\n  trace report: {new / v / 'report.html'}" in text, text
    assert f"traces: {new} (a folder per variant: {', '.join(variants)})" in text, text
    assert "VARIANT" not in text and not re.search(r"traces: \S*\.\.\.", text), text


@pytest.fixture
def fake_report(monkeypatch):
    """A lab whose report is a stub, run by a stub ``on_ranks`` that records the trace folder
    it was given (and raises what ``calls["raise"]`` holds)."""
    import sys
    import types

    from workbook.grading import engine, labs
    report = types.ModuleType("fake_report")
    report.run, report.describe = (lambda trace_dir=None: None), (lambda results: "fake figures")
    monkeypatch.setitem(sys.modules, "fake_report", report)
    monkeypatch.setattr(labs, "lab_module", lambda lab, role: "fake_report")
    calls = {}

    def on_ranks(n, fn, trace_dir, **_):
        calls["trace_dir"] = trace_dir
        if calls.get("raise"):
            raise calls["raise"]
        return [None] * n
    monkeypatch.setattr(engine, "on_ranks", on_ranks)
    return calls


def test_a_read_only_course_folder_gives_figures_without_traces(tmp_path, monkeypatch, fake_report):
    def read_only(lab, job=None):
        raise PermissionError(f"[Errno 13] Permission denied: 'runs/{lab}'")
    monkeypatch.setattr(selfcheck, "new_trace_dir", read_only)
    lines = []
    selfcheck._figures("tp", None, "none", None, 60.0, None, lines.append)
    assert fake_report["trace_dir"] is None                  # the report's traces: temporary
    assert lines == ["  (figures without traces: [Errno 13] Permission denied: 'runs/tp'; "
                     "--trace-dir DIR writes them to DIR)", "fake figures"]


def test_a_report_that_traces_nothing_leaves_no_folder(tmp_path, monkeypatch, fake_report):
    monkeypatch.setenv("WORKBOOK_ROOT", str(tmp_path))
    lines = []
    selfcheck._figures("tp", None, "none", None, 60.0, None, lines.append)
    assert lines == ["fake figures"]
    assert list((tmp_path / "runs" / "tp").iterdir()) == []


def test_figures_that_fail_leave_no_folder_in_runs(tmp_path, monkeypatch, fake_report):
    monkeypatch.setenv("WORKBOOK_ROOT", str(tmp_path))
    fake_report["raise"] = RuntimeError("rank 1 fell over")
    lines = []
    selfcheck._figures("tp", None, "none", None, 60.0, None, lines.append)
    assert fake_report["trace_dir"].startswith(str(tmp_path / "runs" / "tp" / "selfcheck-"))
    assert lines == ["  figures skipped: RuntimeError: rank 1 fell over"]
    assert list((tmp_path / "runs" / "tp").iterdir()) == []


# --------------------------------------------------------------------------- usage errors
@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf", "soon"])
def test_timeout_must_be_a_positive_number_one_line_exit_2(value, capsys):
    with pytest.raises(SystemExit) as exc:
        main(str(ROOT / "solutions" / "tp.py"), ["--timeout", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == f"python solutions/tp.py: --timeout must be a positive number of seconds, " \
                  f"got {value}\n"


@pytest.mark.parametrize("value", ["0", "-1", "2.5", "two"])
def test_nproc_must_be_a_whole_number_at_least_1(value, capsys):
    with pytest.raises(SystemExit) as exc:
        main(str(ROOT / "solutions" / "tp.py"), ["--nproc", value])
    assert exc.value.code == 2
    assert capsys.readouterr().err == \
        f"python solutions/tp.py: --nproc must be a whole number, at least 1, got {value}\n"


def test_positive_seconds_and_count_accept_what_they_should():
    assert positive_seconds("0.5") == 0.5 and positive_seconds("60") == 60.0
    assert positive_count("4") == 4
