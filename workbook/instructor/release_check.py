"""``workbook release --check DIR``: does a student release hold anything of the answer key?

The answer key, read from the course repository (never from the release):

* each solution block's distinctive lines: the code between ``### BEGIN SOLUTION`` and
  ``### END SOLUTION`` in ``solutions/*.py`` (and, for a ``challenge`` release, the bodies its
  challenge regions hand to the learner), less the lines that give nothing away (``trivial``:
  shorter than ``MIN_CHARS``, like ``pass`` or ``return out``, a comment, or a bare ``if tensor
  is not None:``) and the lines every class is given anyway: those of the lab stubs at the
  release's level, of the package and of the public grading tests (SP's pieces in the package,
  which later labs import, or a judge that recomputes the expected buckets; ``answer_lines``
  counts them);
* the names of hidden grading tests (``workbook.grading.points.hidden_tests``);
* a ``solutions/`` or ``wrong/`` folder, or a ``.git`` folder (the answers' history).

Every text file of the release is read line by line (a notebook cell by cell; a lesson's
recording of the reference, ``lessons/recorded/LAB.json.gz``, by the lines of text its outputs show,
``lesson_recording.output_lines``) and a line equal to a key line, once both are stripped of their
indentation, is a finding that names the file, the line and where the answer came from. Exit
status: 0 clean, 1 findings.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

from workbook.grading.labs import RELEASE_MANIFEST
from workbook.grading.markup import parse
from workbook.grading.points import hidden_tests
from workbook.instructor import assign, lesson_recording

MIN_CHARS = 16                       # a stripped line shorter than this is not distinctive
FORBIDDEN_FOLDERS = {"solutions": "the reference solutions", "wrong": "the wrong-lab fixtures",
                     ".git": "git history (the answers are in it)"}
TEXT_SUFFIXES = {".py", ".md", ".txt", ".json", ".toml", ".yml", ".yaml", ".cfg", ".ini", ".sh",
                 ".html", ".csv", ".ipynb", ""}


@dataclass(frozen=True)
class Finding:
    """One piece of the answer key found in a release."""
    path: str                    # from the release's top
    line: int                    # from 1; 0 for a folder
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}" if self.line else f"{self.path}: {self.what}"


CONTROL = re.compile(r"^(if|elif|else|for|while|with|try|except|return|yield)\b")
SHORT_CONTROL = 32                   # a control-flow line shorter than this is not distinctive


def trivial(line: str) -> bool:
    """Does a stripped line of an answer give nothing away on its own?"""
    return len(line) < MIN_CHARS or line.startswith("#") or \
        (bool(CONTROL.match(line)) and len(line) < SHORT_CONTROL)


def _stripped(lines) -> set[str]:
    return {line.strip() for line in lines}


def given_lines(root: Path, level: str) -> set[str]:
    """The stripped lines every class is handed at ``level``: the lab stubs, the package and
    the public grading tests (``release.public_tests``)."""
    from workbook.instructor.release import public_tests
    stubs = assign.make_labs(root / "solutions", root / "tests" / "grading", level)
    given = set()
    for lab in stubs.values():
        given |= _stripped((lab.text if isinstance(lab, assign.Lab) else lab).splitlines())
    for path in (root / "workbook").rglob("*.py"):
        given |= _stripped(path.read_text().splitlines())
    for path in (root / "tests" / "grading").glob("*.py"):
        given |= _stripped(public_tests(path.read_text(), path.name)[0].splitlines())
    return given


def answer_lines(root: Path, level: str) -> tuple[dict[str, str], int]:
    """``{stripped line: "solutions/LAB.py:N"}``, the answer key's distinctive lines for a
    release at ``level`` of the course at ``root``; and how many lines of the answers, not
    trivial, are left out because the class is given them anyway (``given_lines``)."""
    given = given_lines(root, level)
    key: dict[str, str] = {}
    shared = set()
    for path in sorted((root / "solutions").glob("*.py")):
        text = path.read_text()
        src = text.splitlines()
        blocks, regions = parse(text, path.name)
        spans = [(b.begin, b.end) for b in blocks]
        if level == "challenge" and regions:
            bodies = assign.challenge_bodies(src, ast.parse(text), regions)
            spans += [(first, end) for first, (end, *_rest) in bodies.items()]
        for first, last in spans:
            for k in range(first, last + 1):
                line = src[k].strip()
                if trivial(line):
                    continue
                if line in given:
                    shared.add(line)
                    continue
                key.setdefault(line, f"solutions/{path.name}:{k + 1}")
    return key, len(shared)


def hidden_names(root: Path) -> dict[str, str]:
    """``{test name: grading file}`` of every hidden grading test of the course."""
    names = {}
    for path in sorted((root / "tests" / "grading").glob("test_*.py")):
        for name in hidden_tests(path.read_text(), path.name):
            names[name] = f"tests/grading/{path.name}"
    return names


def _is_recording(path: Path) -> bool:
    return path.name.endswith(".json.gz") and \
        path.parent.as_posix().endswith(lesson_recording.RECORDED_DIR)


def _text_lines(path: Path) -> list[tuple[int, str, str]]:
    """``(line, where, text)`` of a text file: a notebook's code and markdown cell by cell
    (``where`` names the cell), any other file as it is; nothing for a binary file."""
    if _is_recording(path):                    # outputs, not code: read what they show
        try:
            shown = lesson_recording.output_lines(lesson_recording.load(path))
        except (OSError, ValueError, AttributeError) as exc:
            return [(0, " (not a recording)", f"unreadable: {exc}")]
        return [(k, where, line) for k, (where, line) in enumerate(shown, 1)]
    data = path.read_bytes()
    if b"\0" in data:
        return []
    text = data.decode("utf-8", errors="replace")
    if path.suffix == ".ipynb":
        try:
            cells = json.loads(text).get("cells", [])
        except ValueError:
            cells = None
        if cells is not None:
            out = []
            for c, cell in enumerate(cells, 1):
                source = cell.get("source", "")
                source = "".join(source) if isinstance(source, list) else source
                out += [(k, f" (cell {c})", line) for k, line in enumerate(source.splitlines(), 1)]
            return out
    return [(k, "", line) for k, line in enumerate(text.splitlines(), 1)]


def scan(release: Path, key: dict[str, str], hidden: dict[str, str]) -> list[Finding]:
    """Every piece of the answer key in the release folder ``release``."""
    release = Path(release)
    found: list[Finding] = []
    names = re.compile(r"\b(" + "|".join(map(re.escape, sorted(hidden))) + r")\b") if hidden \
        else None
    for path in sorted(release.rglob("*")):
        rel = path.relative_to(release).as_posix()
        if path.is_dir():
            if path.name in FORBIDDEN_FOLDERS:
                found.append(Finding(rel + "/", 0, f"a {path.name}/ folder: "
                                                   f"{FORBIDDEN_FOLDERS[path.name]}"))
            continue
        if any(part in FORBIDDEN_FOLDERS for part in path.relative_to(release).parts[:-1]) or \
                (path.suffix not in TEXT_SUFFIXES and not _is_recording(path)) or \
                rel == RELEASE_MANIFEST:
            continue
        for k, cell, line in _text_lines(path):
            where = key.get(line.strip())
            if where:
                found.append(Finding(rel + cell, k, f"a line of the answer ({where}): "
                                                    f"{_short(line.strip())}"))
            m = names.search(line) if names else None
            if m:
                found.append(Finding(rel + cell, k, f"the hidden test {m[1]} "
                                                    f"({hidden[m[1]]})"))
    return found


def _short(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def release_level(release: Path) -> str:
    """The level ``release/release.json`` names (``standard`` when it names none)."""
    path = Path(release) / RELEASE_MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"--check {release}: no {RELEASE_MANIFEST} there; name the "
                                f"folder `workbook release -o` wrote")
    try:
        return json.loads(path.read_text()).get("level") or assign.DEFAULT_LEVEL
    except ValueError:
        raise ValueError(f"--check {release}: {RELEASE_MANIFEST} is not JSON") from None


def check_release(root: Path, release: Path) -> tuple[list[Finding], str]:
    """The findings in ``release`` against the course at ``root``, and a line saying what was
    looked for."""
    release = Path(release).resolve()
    if not release.is_dir():
        raise FileNotFoundError(f"--check {release}: no such folder")
    if not (root / "solutions").is_dir():
        raise ValueError(f"--check needs the answer key: run it in the course repository "
                         f"(no solutions/ in {root})")
    level = release_level(release)
    key, shared = answer_lines(root, level)
    hidden = hidden_names(root)
    looked_for = (f"{len(key)} distinctive lines of the answers (level {level}), "
                  f"{len(hidden)} hidden test name(s), solutions/, wrong/ and .git/ folders; "
                  f"{shared} lines of the answers are also in the package or the public tests, "
                  f"which every class is given, and are not counted")
    return scan(release, key, hidden), looked_for
