"""Lessons in a student release: where a lesson stands the reference in for an unfinished lab, the
release shows the reference's outputs recorded when it was made, labelled, and no cell fails.

A release is made once for the module (``workbook release``; the recordings come from the
instructor's cache ``runs/recorded-lessons/`` when the lessons, references and package are
unchanged, else each lesson is run once here). Then the lessons recorded are executed headless
in the release, with the release's own package and stub labs, the way ``test_notebooks.py`` runs
the course's lessons.

The recording is made afresh each time (not from the instructor's cache), so that it is also the
one headless run of its lessons in the course (``test_notebooks.py`` leaves them to it).

Which lessons: by default one, lesson 5 (about 10 s to record and 10 s to run on a quiet 2-core
machine), because recording all eight costs 200-265 s here, more than the whole suite may
spend on one lab (docs/test-suite.md). ``WORKBOOK_RELEASE_EVERY_LESSON=1`` records and runs every
lesson that stands the reference in (docs/instructors.md, "Lessons in a release", gives the
figures of that run).
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import textwrap
import time
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
pytest.importorskip("nbclient")

from workbook.grading.labs import RELEASE_MANIFEST                               # noqa: E402
from workbook.instructor import lesson_recording, release, release_check      # noqa: E402

# the module's release records lessons 04-11 once when the cache is cold: 200 s on 2 shared cores
pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
CELL_TIMEOUT_S = 120
ALL_STANDING_IN = release.lessons_standing_in(ROOT)
EVERY_LESSON = os.environ.get("WORKBOOK_RELEASE_EVERY_LESSON") == "1"
RECORDED = tuple(s["lab"] for s in ALL_STANDING_IN) if EVERY_LESSON else ("sp",)
STANDING_IN = [s for s in ALL_STANDING_IN if s["lab"] in RECORDED]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A standard-level release with its recordings, and how long making it took.

    Recorded afresh, never from the instructor's cache (``CACHE_DIR`` is a folder of this
    module's for as long as it runs): the recording executes each lesson of ``RECORDED`` headless
    in the course, stub labs and the reference beside them, and an error in any cell stops it
    (``RecordingError``), which is what ``test_notebooks.py`` checks of a lesson: it leaves these
    lessons to this run (``test_notebooks.RECORDED_RUN``) instead of executing them twice."""
    base = tmp_path_factory.mktemp("release")
    folder = base / "class"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lesson_recording, "CACHE_DIR", str(base / "recorded-lessons"))
        patch.setenv("WORKBOOK_LESSONS_TEST_SIZE", "1")       # the kernels record the test size
        t0 = time.perf_counter()
        release.make_release(ROOT, folder, "standard", record=RECORDED)
        print(f"release made in {time.perf_counter() - t0:.1f} s")
        entry = json.loads((folder / RELEASE_MANIFEST).read_text())["recorded_lessons"]
        assert all(entry["per_lesson_seconds"][lab] != "cached" for lab in RECORDED), entry
        yield folder


def _in_release(monkeypatch, folder: Path) -> None:
    """This process and the kernels it starts see the release as the course, with its package."""
    monkeypatch.setenv("WORKBOOK_ROOT", str(folder))
    monkeypatch.setenv("PYTHONPATH", str(folder))
    monkeypatch.setenv("WORKBOOK_LESSONS_NO_GRADE", "1")
    monkeypatch.setenv("WORKBOOK_LESSONS_TEST_SIZE", "1")       # as the recording was made


def _run(folder: Path, lesson: str):
    """The lesson executed headless in ``folder``: its cells' outputs and the seconds it took."""
    from workbook.lessons import run_headless
    nb = jupytext.read(folder / lesson)
    t0 = time.perf_counter()
    run_headless(nb, CELL_TIMEOUT_S, path=folder / "lessons")
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    return outputs, time.perf_counter() - t0


def _printed(outputs) -> str:
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")


# --------------------------------------------------------------------------- which cells
def test_the_cells_that_depend_on_the_reference_are_read_from_the_code():
    cells = [
        "import torch\nRANKS = 2",                                  # 0 clean
        'ref = reference_lab("tp")',                                # 1 names the reference
        "table = {}\nfig = draw(RANKS)",                            # 2 clean
        "table['a'] = ref.run(RANKS)",                              # 3 reads ref: changes table
        "print(table)",                                             # 4 reads the changed table
        "fig = draw(RANKS)\nfig",                                   # 5 fig set again: clean
        'impl = "labs" if ok else "solutions"\n# "solutions" in a comment',   # 6 names it
        "def show():\n    return impl\n",                           # 7 its body reads impl
        "show()",                                                   # 8
        'print("done")  # the reference is not named here',         # 9 clean
    ]
    assert lesson_recording.dependent_cells(cells) == [1, 3, 4, 6, 7, 8]


def test_every_lesson_that_stands_the_reference_in_is_found():
    """Lessons 4-14 fall back to the reference (the issue's audit; lesson 12 only in section 7,
    its runs on ranks: on paper it draws PyTorch's orders; lesson 13 from section 4 on, its runs
    on ranks); each names its own lab."""
    assert [(s["lesson"][8:10], s["lab"]) for s in ALL_STANDING_IN] == [
        ("04", "tp"), ("05", "sp"), ("06", "domino"), ("07", "overlap_math"),
        ("08", "tp_overlap"), ("09", "dp_overlap"), ("10", "pp_overlap"), ("11", "cp_ring"),
        ("12", "pp_schedules"), ("13", "ep_overlap"), ("14", "capstone")]


# --------------------------------------------------------------------------- the recordings
def test_the_release_holds_a_recording_per_lesson_naming_commit_and_machine(made):
    manifest = json.loads((made / RELEASE_MANIFEST).read_text())
    entry = manifest["recorded_lessons"]
    assert entry["made_from"]["commit"] and entry["machine"]["cores"] >= 1
    for s in STANDING_IN:
        rel = lesson_recording.recording_file(s["lab"])
        recording = lesson_recording.load(made / rel)
        assert recording["lesson"] == s["lesson"] and recording["cells"], rel
        assert recording["made_from"]["commit"] and recording["machine"]["torch"]
        assert any(c["outputs"] for c in recording["cells"]), rel
        assert entry["bytes"][rel] == len((made / rel).read_bytes()) < 500_000, rel
        assert manifest["files"][rel]
    print("sizes:", entry["bytes"], "recording took", entry["seconds"], "s:",
          entry["per_lesson_seconds"])


def test_recordings_hold_no_answer_and_check_reads_them(made, tmp_path, monkeypatch):
    """``--check`` passes on the release with its recordings; a line of a solution planted in a
    recorded output is found, named by file and recorded cell. (The answer key and the hidden
    tests' names are read from the course once for the test's three readings: the same course,
    the same key.)"""
    for name in ("answer_lines", "hidden_names"):
        monkeypatch.setattr(release_check, name, functools.cache(getattr(release_check, name)))
    found, _ = release_check.check_release(ROOT, made)
    assert [str(f) for f in found] == []
    key, _ = release_check.answer_lines(ROOT, "standard")
    line = next(line for line, where in key.items() if where.startswith("solutions/sp.py"))
    planted = tmp_path / "planted"
    shutil.copytree(made, planted)
    path = planted / lesson_recording.recording_file("sp")
    recording = lesson_recording.load(path)
    recording["cells"][0]["outputs"].append(
        {"output_type": "stream", "name": "stdout", "text": f"a traceback:\n    {line}\n"})
    path.write_bytes(lesson_recording.dump(recording))
    found, _ = release_check.check_release(ROOT, planted)
    assert len(found) == 1 and str(found[0]).startswith(
        f"lessons/recorded/sp.json.gz (recorded cell {recording['cells'][0]['cell']}):"), found
    assert "a line of the answer (solutions/sp.py:" in str(found[0])


# --------------------------------------------------------------------------- the given piece
def test_the_given_piece_says_whose_outputs_the_lesson_shows(made, tmp_path, monkeypatch):
    from workbook import lessons
    assert lessons.yours_reference_or_recorded("sp") == "reference"         # the course itself
    assert lessons.reference_lab("sp").__file__.endswith("solutions/sp.py")
    folder = tmp_path / "class"
    shutil.copytree(made, folder)
    _in_release(monkeypatch, folder)
    assert lessons.open_tasks("sp") == list(range(1, 14))
    assert lessons.yours_reference_or_recorded("sp") == "recorded"
    label = lessons._SHOWN["label"]
    assert label.startswith("recorded from the reference solutions/sp.py when this release "
                            "was made (commit ") and label.endswith(
        "finish tasks 1-13 of labs/sp.py to see yours")
    with pytest.raises(RuntimeError, match="finish tasks 1-13 of labs/sp.py"):
        lessons.reference_lab("sp")
    shutil.copy(ROOT / "solutions" / "sp.py", folder / "labs" / "sp.py")           # all done
    assert lessons.open_tasks("sp") == []
    assert lessons.yours_reference_or_recorded("sp") == "yours"
    assert lessons.reference_lab("sp").__file__ == str(folder / "labs" / "sp.py")
    text = (ROOT / "labs" / "sp.py").read_text()
    half = text.replace('raise NotImplementedError("not implemented yet: sp.all_gather_sequence")',
                        "return None")
    (folder / "labs" / "sp.py").write_text(half)
    assert 1 not in lessons.open_tasks("sp") and 2 in lessons.open_tasks("sp")
    if "domino" not in RECORDED:             # a lesson whose recording this release lacks
        with pytest.raises(FileNotFoundError, match="no recording of the reference"):
            lessons.yours_reference_or_recorded("domino")


# --------------------------------------------------------------------------- the lessons run
@pytest.mark.parametrize("lesson", [s["lesson"] for s in STANDING_IN], ids=lambda p: p[8:-3])
def test_a_lesson_runs_in_the_release_showing_the_recorded_reference(lesson, made, monkeypatch):
    lab = next(s["lab"] for s in STANDING_IN if s["lesson"] == lesson)
    _in_release(monkeypatch, made)
    outputs, seconds = _run(made, lesson)
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, f"{lesson}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    printed = _printed(outputs)
    assert f"labs/{lab}.py: tasks 1-" in printed and "not finished yet" in printed
    recorded = lesson_recording.load(made / lesson_recording.recording_file(lab))
    label = f">>> recorded from the reference solutions/{lab}.py when this release was made"
    assert printed.count(label) == len(recorded["cells"]), printed[-2000:]
    figures = sum("application/vnd.plotly.v1+json" in o.get("data", {}) for o in outputs)
    recorded_figures = sum("application/vnd.plotly.v1+json" in o.get("data", {})
                           for c in recorded["cells"] for o in c["outputs"])
    assert figures >= recorded_figures
    print(f"{lesson}: {seconds:.1f} s in the release, {len(recorded['cells'])} cells recorded")


OWN_LESSONS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "lessons").glob("[0-9][0-9]_*.py")
                     if str(p.relative_to(ROOT)) not in {s["lesson"] for s in ALL_STANDING_IN})


@pytest.mark.skipif(not EVERY_LESSON, reason="every lesson: WORKBOOK_RELEASE_EVERY_LESSON=1 "
                    "(lessons 0-3 never use the reference; the test command runs them in the "
                    "course, test_notebooks.py / test_browser.py)")
@pytest.mark.parametrize("lesson", OWN_LESSONS, ids=lambda p: p[8:-3])
def test_a_lesson_that_never_uses_the_reference_runs_in_the_release(lesson, made, monkeypatch):
    _in_release(monkeypatch, made)
    outputs, seconds = _run(made, lesson)
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, f"{lesson}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    assert "recorded from the reference" not in _printed(outputs)
    print(f"{lesson}: {seconds:.1f} s in the release, nothing recorded")


def test_a_finished_lab_runs_its_lesson_live_in_the_release(made, tmp_path, monkeypatch):
    """Lesson 5 with a finished ``labs/sp.py``: nothing recorded is shown, no cell needs the
    reference."""
    folder = tmp_path / "class"
    shutil.copytree(made, folder)
    shutil.copy(ROOT / "solutions" / "sp.py", folder / "labs" / "sp.py")
    _in_release(monkeypatch, folder)
    outputs, seconds = _run(folder, "lessons/05_sequence_parallel.py")
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, f"{errors[0].get('ename')}: {errors[0].get('evalue')}"
    assert "recorded from the reference" not in _printed(outputs)
    print(f"lesson 05 with a finished lab: {seconds:.1f} s")


def test_a_recording_made_from_a_lesson_keeps_only_the_outputs_that_depend_on_it(tmp_path):
    """The recorder on a two-cell lesson of its own: the clean cell is not kept, and a widget
    view is dropped while printed text and figures stay."""
    kept = lesson_recording._kept
    assert kept({"output_type": "display_data", "data": {
        "application/vnd.jupyter.widget-view+json": {"model_id": "x"},
        "text/plain": "VBox(children=(...))"}}) is None
    figure = {"output_type": "display_data", "data": {
        "application/vnd.plotly.v1+json": {"data": []}, "text/html": "<div>big</div>"}}
    assert kept(figure) == {"output_type": "display_data",
                            "data": {"application/vnd.plotly.v1+json": {"data": []}}}
    assert kept({"output_type": "error", "ename": "E", "traceback": ["code"]}) is None
    script = tmp_path / "lessons" / "99_tiny.py"
    script.parent.mkdir()
    script.write_text(textwrap.dedent('''\
        # %%
        print("clean")

        # %%
        impl = "solutions"
        print("shown by", impl)
    '''))
    recording = lesson_recording.record_lesson(script, "tp", ROOT, timeout=60)
    assert [(c["cell"], c["outputs"]) for c in recording["cells"]] == [
        (1, [{"output_type": "stream", "name": "stdout", "text": "shown by solutions\n"}])]


def test_a_lesson_that_fails_while_recording_stops_the_release_in_one_line(tmp_path):
    """A cell that raises while the reference is recorded: one line naming the lesson, never
    the traceback (it would show the reference's code), and nothing cached."""
    course = tmp_path / "course"
    (course / "lessons").mkdir(parents=True)
    (course / "solutions").mkdir()
    (course / "workbook").mkdir()
    (course / "solutions" / "tp.py").write_text("SECRET_ANSWER = 42\n")
    (course / "lessons" / "04_broken.py").write_text(
        '# %%\nimpl = "solutions"\n\n# %%\nraise ValueError("the reference broke here")\n')
    with pytest.raises(lesson_recording.RecordingError) as caught:
        lesson_recording.record_lessons(course, [{"lesson": "lessons/04_broken.py", "lab": "tp"}],
                                        {"tp.py": b""}, {"commit": None})
    message = str(caught.value)
    assert message.startswith("recording lessons/04_broken.py with the reference failed ("), message
    assert "the reference broke here" in message and len(message.splitlines()) == 1
    assert not list((course / lesson_recording.CACHE_DIR).glob("tp-*"))     # nothing cached


def test_an_update_keeps_the_recordings_and_rewrites_none_unchanged(made, tmp_path):
    """``--update`` of a recorded release records again (from the cache): the same bytes, so no
    recording is rewritten; one the learner deleted comes back."""
    folder = tmp_path / "class"
    shutil.copytree(made, folder)
    assert release.update_release(ROOT, folder) == []
    sp = lesson_recording.recording_file("sp")
    (folder / sp).unlink()
    assert release.update_release(ROOT, folder) == [f"wrote {sp}"]
    assert json.loads((folder / RELEASE_MANIFEST).read_text())["recorded_lessons"]["bytes"]
