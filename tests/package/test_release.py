"""A student release (``workbook release``): the course a class is handed, without its answers.

A release is made at each level into a fresh folder and ``--check`` passes on it; an answer line,
a hidden test's name or a solutions/ folder planted in one is named by ``--check``; bad input is
one line, exit status 2, nothing written; the instructor's own ``labs/`` is never touched; in a
release, the package finds its course and ``solutions`` is one clear line (its hints and its
stubs' self-check: ``test_release_learner.py``). No lesson is executed here.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workbook import cli
from workbook.grading.labs import LABS, RELEASE_MANIFEST, repo_root
from workbook.grading.markup import level_of
from workbook.grading.points import Graded, graded_tests, hidden_tests
from workbook.instructor import assign, release, release_check

ROOT = repo_root()
LEVELS = assign.LEVELS


def _labs_bytes() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((ROOT / "labs").iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """A release at each level, made once; the instructor's labs/ read before and after."""
    before = _labs_bytes()
    base = tmp_path_factory.mktemp("releases")
    made = {level: base / level for level in LEVELS}
    for level, folder in made.items():
        release.make_release(ROOT, folder, level, record=False)   # test_release_lessons records
    return made, before, _labs_bytes()


def _cli(argv, capsys) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exc:                   # argparse's own usage error
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _course_env(release_dir: Path) -> dict:
    """The environment of a learner in the release: its own package first, no course root set."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORKBOOK_ROOT", "WORKBOOK_IMPL")}
    env["PYTHONPATH"] = str(release_dir)
    return env


# --------------------------------------------------------------------------- what a release holds
@pytest.mark.parametrize("level", LEVELS)
def test_a_release_at_each_level_holds_the_course_without_its_answers(level, releases, capsys):
    made, _, _ = releases
    folder = made[level]
    for rel in ["workbook/cli.py", "lessons/01_collectives.py", "lessons/01_collectives.ipynb",
                "labs/hints.json", "README.md", "LICENSE", "pyproject.toml", "environment.yml",
                ".ci/run", "docs/learners.md", "docs/labs.md", RELEASE_MANIFEST,
                *(f"labs/{lab}.py" for lab in LABS), *(f"tests/grading/test_{lab}.py" for lab in LABS)]:
        assert (folder / rel).is_file(), f"{rel} is missing from the {level} release"
    for rel in ["solutions", "tests/grading/wrong", "tests/package", "tests/bench", "tests/gpu",
                ".git", "docs/instructors.md", "docs/test-suite.md", "mkdocs.yml"]:
        assert not (folder / rel).exists(), f"{rel} is in the {level} release"
    stubs = assign.make_labs(ROOT / "solutions", ROOT / "tests" / "grading", level)
    for lab in LABS:
        text = (folder / "labs" / f"{lab}.py").read_text()
        assert level_of(text) == level and text == stubs[f"{lab}.py"].text
    hints = json.loads((folder / "labs" / "hints.json").read_text())
    assert sorted(hints) == sorted(LABS)
    assert all(list(by_level) == [level] for by_level in hints.values())   # its own level only
    manifest = json.loads((folder / RELEASE_MANIFEST).read_text())
    assert manifest["level"] == level
    assert [s["lab"] for s in manifest["lessons_needing_reference_outputs"]] == LABS[3:]
    code, out, err = _cli(["release", "--check", str(folder)], capsys)
    assert code == 0, out + err
    assert "holds nothing of the answer key" in out


def test_making_releases_leaves_the_instructors_labs_as_they_were(releases):
    _, before, after = releases
    assert before == after and before


def test_the_release_readme_has_two_setup_commands_and_every_link_reaches_a_file(releases):
    folder = releases[0]["standard"]
    readme = (folder / "README.md").read_text()
    setup = readme.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    block = setup.split("```bash", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line.strip()]
    assert [c.split("#")[0].strip() for c in commands] == [
        "python3 -m workbook.bootstrap demo", "python3 -m workbook.bootstrap test"]
    last = max(int(p.name[:2]) for p in (ROOT / "lessons").glob("[0-9][0-9]_*.py"))
    assert "standard" in setup and f"lessons 04-{last:02d}" in setup   # every lab's lesson from 04
    for page in [folder / "README.md", *sorted((folder / "docs").glob("*.md")),
                 folder / "lessons" / "README.md"]:
        rel = page.relative_to(folder).as_posix()
        for m in re.finditer(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)", page.read_text()):
            target = release._link_target(rel, m[1])
            if target is not None:
                assert (folder / target).exists(), f"{rel} links to {m[1]}, not in the release"


def test_the_test_command_of_a_release_grades_the_learners_labs(releases, monkeypatch):
    from workbook import bootstrap
    monkeypatch.setattr(bootstrap, "ROOT", releases[0]["standard"])
    [(title, _, cmd)] = bootstrap.stages()
    assert title == bootstrap.RELEASE_TITLE and [str(c) for c in cmd[1:]] == [
        "-m", "workbook.cli", "grade"]


# --------------------------------------------------------------------------- --check
def test_check_names_an_answer_line_a_hidden_test_and_forbidden_folders(releases, tmp_path,
                                                                        capsys):
    folder = tmp_path / "release"
    shutil.copytree(releases[0]["standard"], folder)
    key, _ = release_check.answer_lines(ROOT, "standard")
    line, source = next(iter(key.items()))
    lesson = folder / "lessons" / "03_traces_and_async.py"
    lesson.write_text(lesson.read_text() + f"\n# %%\n    {line}\n")
    planted_at = len(lesson.read_text().splitlines())
    notebook = folder / "lessons" / "03_traces_and_async.ipynb"
    nb = json.loads(notebook.read_text())
    nb["cells"].append({"cell_type": "code", "metadata": {}, "execution_count": None,
                        "outputs": [], "source": ["x = 1\n", line + "\n"]})
    notebook.write_text(json.dumps(nb))
    (folder / "solutions").mkdir()
    (folder / "tests" / "grading" / "wrong").mkdir()
    code, out, _ = _cli(["release", "--check", str(folder)], capsys)
    assert code == 1
    assert f"lessons/03_traces_and_async.py:{planted_at}: a line of the answer ({source})" in out
    assert f"lessons/03_traces_and_async.ipynb (cell {len(nb['cells'])}):2: a line of the " \
           f"answer ({source})" in out
    assert "solutions/: a solutions/ folder" in out
    assert "tests/grading/wrong/: a wrong/ folder" in out
    # hidden test names: the course has none today, so scan() is given one
    labs = folder / "labs" / "tp.py"
    labs.write_text(labs.read_text() + "# see test_tp_on_7_ranks\n")
    found = release_check.scan(folder, {}, {"test_tp_on_7_ranks": "tests/grading/test_tp.py"})
    assert [str(f) for f in found if "hidden" in f.what] == [
        f"labs/tp.py:{len(labs.read_text().splitlines())}: the hidden test test_tp_on_7_ranks "
        f"(tests/grading/test_tp.py)"]


def test_a_challenge_releases_key_holds_the_given_code_its_challenges_take_away():
    """At challenge level the code a challenge region hands to the learner (given at standard)
    is answer too: the key grows by exactly such lines."""
    standard, _ = release_check.answer_lines(ROOT, "standard")
    challenge, _ = release_check.answer_lines(ROOT, "challenge")
    stubs = assign.make_labs(ROOT / "solutions", ROOT / "tests" / "grading", "standard")
    given_at_standard = {line.strip() for lab in stubs.values()
                         for line in getattr(lab, "text", lab).splitlines()}
    grown = set(challenge) - set(standard)
    assert grown and grown <= given_at_standard


HIDDEN = textwrap.dedent('''\
    import pytest


    @pytest.mark.points(2)
    @pytest.mark.tasks("broadcast")
    def test_seen():
        pass


    @pytest.mark.points(3, visibility="hidden")
    @pytest.mark.tasks("broadcast")
    def test_secret():
        pass


    def _pair(name, when):
        @pytest.mark.points(1, visibility=when)
        @pytest.mark.tasks(name)
        def one():
            pass

        @pytest.mark.points(1)
        @pytest.mark.tasks(name)
        def two():
            pass
        return one, two


    test_late_one, test_late_two = _pair("Ring", "after_due_date")
''')


def test_hidden_tests_are_read_from_their_marks_and_left_out_of_the_public_tests():
    graded = graded_tests(HIDDEN)
    assert graded["test_seen"] == Graded(2.0, ("broadcast",))                  # visible: default
    assert graded["test_secret"] == Graded(3.0, ("broadcast",), "hidden")
    assert graded["test_late_one"].visibility == "after_due_date"
    assert hidden_tests(HIDDEN) == {"test_secret", "test_late_one"}
    public, names = release.public_tests(HIDDEN)
    assert names == ["test_late_one", "test_secret"]
    assert "test_secret" not in public and "test_late_one" not in public
    assert "def test_seen" in public and "_, test_late_two = _pair('Ring', 'after_due_date')" in public
    compile(public, "public", "exec")
    assert hidden_tests(public) == set() and "test_seen" in graded_tests(public)


# --------------------------------------------------------------------------- bad input
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine\n")
    inside = ROOT / "release-out"
    cases = [
        (["release", "-o", str(busy)], "is not empty"),
        (["release", "-o", str(ROOT)], "is the course repository itself"),
        (["release", "-o", str(inside)], "is inside the course repository"),
        (["release", "--level", "hard", "-o", str(tmp_path / "new")], "invalid choice: 'hard'"),
        (["release", "--level", "guided"], "give one of -o DIR"),
        (["release", "-o", str(tmp_path / "a"), "--check", str(busy)], "not -o and --check"),
        (["release", "--check", str(busy)], "no release.json there"),
        (["release", "--update", str(busy)], "no release.json there"),
    ]
    for argv, message in cases:
        code, out, err = _cli(argv, capsys)
        assert code == 2 and message in err, (argv, out, err)
        assert len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in busy.iterdir()) == ["notes.txt"]
    assert not inside.exists() and not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]       # no staging folder left


# --------------------------------------------------------------------------- --update
def test_update_never_overwrites_a_file_the_learner_edited(tmp_path, capsys):
    folder = tmp_path / "class"
    release.make_release(ROOT, folder, "standard", record=False)
    mine = (folder / "labs" / "collectives.py").read_text() + "\n# my work\n"
    (folder / "labs" / "collectives.py").write_text(mine)
    manifest = json.loads((folder / RELEASE_MANIFEST).read_text())
    (folder / "docs" / "old.md").write_text("a page the course dropped\n")      # unedited
    manifest["files"]["docs/old.md"] = hashlib.sha256(b"a page the course dropped\n").hexdigest()
    (folder / RELEASE_MANIFEST).write_text(json.dumps(manifest))
    code, out, err = _cli(["release", "--update", str(folder), "--level", "guided"], capsys)
    assert code == 0, err
    assert (folder / "labs" / "collectives.py").read_text() == mine               # kept
    assert "kept labs/collectives.py (edited since the release)" in out
    assert level_of((folder / "labs" / "collectives.py.new").read_text()) == "guided"
    assert level_of((folder / "labs" / "tp.py").read_text()) == "guided"          # unedited: new
    assert not (folder / "docs" / "old.md").exists()
    assert json.loads((folder / RELEASE_MANIFEST).read_text())["level"] == "guided"
    code, out, _ = _cli(["release", "--update", str(folder)], capsys)
    assert code == 0 and "wrote" not in out                                        # up to date


# --------------------------------------------------------------------------- a learner in a release
@pytest.mark.parametrize("argv, message", [
    (["grade", "--impl", "solutions"], "this course is a student release"),
    (["run", "tp", "--impl", "solutions"], "this course is a student release"),
    (["assign"], "no solutions/ in"),
    (["assign", "--level", "guided", "--force"], "no solutions/ in"),
])
def test_in_a_release_what_needs_the_reference_is_one_line(argv, message, releases, monkeypatch,
                                                            capsys):
    folder = releases[0]["standard"]
    labs = {p.name: p.read_bytes() for p in (folder / "labs").iterdir()}
    monkeypatch.setenv("WORKBOOK_ROOT", str(folder))
    code, _, err = _cli(argv, capsys)
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in (folder / "labs").iterdir()} == labs


def test_in_a_release_the_package_finds_its_course(releases, tmp_path):
    """The release's own package, run from outside it, takes the release for its course. (Its
    hints, one rung at a time, and its stubs' self-check, exit 1 on TODO lines, run the same way
    in ``test_release_learner.py``: `workbook hint`, and `workbook run` of every lab.)"""
    folder = tmp_path / "release"
    shutil.copytree(releases[0]["standard"], folder)
    where = subprocess.run([sys.executable, "-c", "import workbook.grading.labs as l; "
                            "print(l.repo_root(), l.is_release())"],
                           cwd=tmp_path, env=_course_env(folder), capture_output=True, text=True,
                           timeout=60)
    assert where.stdout.split() == [str(folder.resolve()), "True"], where.stderr


def test_in_a_release_the_site_command_says_it_needs_the_course(releases, monkeypatch, tmp_path,
                                                                capsys):
    from workbook import site
    folder = releases[0]["standard"]
    monkeypatch.setattr(site, "ROOT", folder)
    monkeypatch.setattr(site, "CONFIG", folder / "mkdocs.yml")
    assert site.main(["build", "-o", str(tmp_path / "site")]) == 2
    assert "not from a student release" in capsys.readouterr().err
    assert not (tmp_path / "site").exists()
