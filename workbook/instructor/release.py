"""A student release: the course a class is handed, without its answers (``workbook release``).

    workbook release --level standard -o DIR     make one in DIR (new or empty, outside the course)
    workbook release --check DIR                 scan it for the answer key (``release_check``)
    workbook release --update DIR                update it; a file edited since is never overwritten

The repository is the course *and* its answer key. A release holds what a learner needs:

* the package (``workbook/``), the lessons (``lessons/``), the labs generated at the release's
  level from ``solutions/`` with ``workbook assign``'s own functions (the instructor's ``labs/``
  is never read or touched), with ``labs/hints.json`` holding that level's tasks and hints only;
* the public grading tests: ``tests/grading/*.py`` with every test Gradescope does not show the
  student (a ``points`` mark whose ``visibility`` is not ``"visible"``) taken out;
* a README whose set-up commands fit the release (``python3 -m workbook.bootstrap test`` grades
  the learner's labs there), the learner's pages of ``docs/``, ``pyproject.toml``,
  ``environment.yml``, ``.ci/run``, ``.gitignore`` and ``LICENSE``;
* ``release.json`` (``RELEASE_MANIFEST``): the level, the commit it was made from (and whether
  the course had changes not committed), what was left out, the lessons that stand the
  reference in for an unfinished lab, the recording of what the reference showed in them
  (below) and a hash of every file it wrote;
* ``lessons/recorded/LAB.json.gz``: for each lesson that stands the reference in for an unfinished
  lab, what the cells that depend on the reference printed and drew, recorded from the
  reference on the instructor's machine when the release is made
  (``workbook.instructor.lesson_recording``); the lesson shows them, labelled as the
  reference's, until the learner's lab is finished (``workbook.lessons``).

Left out: ``solutions/``, ``tests/grading/wrong/``, ``tests/package``, ``tests/bench``,
``tests/gpu`` (they read the solutions), hidden tests, the instructor's pages
(``INSTRUCTOR_DOCS``), ``mkdocs.yml`` and git's history. A kept page's links to a page left out
are taken out (``unlink_missing``).
"""
from __future__ import annotations

import ast
import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path, PurePosixPath

from workbook.grading.labs import LABS, RELEASE_MANIFEST
from workbook.grading.points import hidden_tests
from workbook.instructor import assign, lesson_recording

INSTRUCTOR_DOCS = ("instructors.md", "test-suite.md", "site.md")   # the docs/ a class is not given
PLAIN_FILES = ("LICENSE", "environment.yml", ".gitignore", ".ci/run")
SKIP = re.compile(r"(^|/)(__pycache__|\.ipynb_checkpoints|\.pytest_cache)(/|$)|\.pyc$")
LEFT_OUT = ["solutions/", "tests/grading/wrong/", "tests/package/", "tests/bench/", "tests/gpu/",
            "mkdocs.yml", ".git/", *(f"docs/{page}" for page in INSTRUCTOR_DOCS)]
STANDS_IN = lesson_recording.STANDS_IN                # a lesson's code that runs the reference
SETUP_HEADING = "## Set-up"
RELEASE_SETUP = """## Set-up: two commands

This is the course as your class hands it out, its labs at the `{level}` level. On a fresh
machine with Python 3.10+ (each command creates `.venv/` or reuses it, and installs only what is
missing: a CPU build of torch where there is no NVIDIA GPU, never the multi-GB CUDA build on a
CPU machine):

```bash
python3 -m workbook.bootstrap demo    # 4 CPU ranks run every collective on a simulated DGX-H100 link, traced
python3 -m workbook.bootstrap test    # grades your labs/ with the course's tests (what `workbook grade` runs)
```

The demo prints each collective's time, an async all-reduce hidden behind compute, and where the
per-rank traces and the HTML trace report went (`runs/demo/`). The test command grades every lab
in `labs/` with the tests of `tests/grading/`: each test you have not done yet says "not
implemented yet", and it exits 0 once every lab has full marks.

This copy holds no reference answers. Where a lesson shows a lab's figures ({lessons}), it
runs your lab once its tasks are written; until then it shows what the reference produced,
recorded when this release was made and labelled as such, and names the tasks to finish.

After set-up, `.venv/bin/workbook` (or `source .venv/bin/activate`, then `workbook`) is the one
command for everything else; `workbook --help` lists its commands, and
[the learner's loop](docs/learners.md) says what each does.

"""


class ReleaseError(ValueError):
    """A release that cannot be made or updated as asked; the message says what to change."""


# --------------------------------------------------------------------------- what a release holds
def _not_ignored(root: Path, folder: str) -> list[Path] | None:
    """The files under ``root/folder`` that git does not ignore (None: not a git checkout)."""
    out = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", folder)
    return None if out is None else [root / rel for rel in out.split("\0") if rel]


def _tree(root: Path, folder: str) -> dict[str, bytes]:
    """Every file under ``root/folder`` that git does not ignore (outside git: every file but
    caches), by its path from ``root``."""
    listed = _not_ignored(root, folder)
    paths = listed if listed is not None else (root / folder).rglob("*")
    out = {}
    for path in sorted(paths):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not SKIP.search(rel):
            out[rel] = path.read_bytes()
    return out


def public_tests(source: str, filename: str = "<tests>") -> tuple[str, list[str]]:
    """A grading module's text without its hidden tests (``hidden_tests``), and their names. A
    hidden ``def test_...`` goes with its decorators; in ``test_a, test_b = _make(...)`` a hidden
    name becomes ``_`` (the whole line goes when every name is hidden)."""
    hidden = hidden_tests(source, filename)
    if not hidden:
        return source, []
    lines = source.splitlines(keepends=True)
    cuts: list[tuple[int, int, str]] = []               # (first line, last line, replacement)
    for node in ast.parse(source, filename).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in hidden:
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            cuts.append((first, node.end_lineno, ""))
        elif isinstance(node, ast.Assign):
            target = node.targets[0]
            elts = target.elts if isinstance(target, ast.Tuple) else [target]
            names = [e.id if isinstance(e, ast.Name) else "" for e in elts]
            if not hidden.intersection(names):
                continue
            if all(n in hidden for n in names):
                cuts.append((node.lineno, node.end_lineno, ""))
                continue
            for e in elts:
                if isinstance(e, ast.Name) and e.id in hidden:
                    e.id = "_"
            cuts.append((node.lineno, node.end_lineno, ast.unparse(node) + "\n"))
    for first, last, text in sorted(cuts, reverse=True):
        lines[first - 1:last] = [text] if text else []
    return "".join(lines), sorted(hidden)


def _link_target(page: str, target: str) -> str | None:
    """The release path a relative link of ``page`` points at (None: a URL or an anchor)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return None
    parts: list[str] = []
    for part in PurePosixPath(page).parent.joinpath(target.split("#")[0]).parts:
        if part == "..":
            if parts:
                parts.pop()
        elif part != ".":
            parts.append(part)
    return "/".join(parts)


LINK = re.compile(r"(?P<open>[ \t]*\n?[ \t]*\()?(?<!!)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)\)"
                  r"(?(open)\)|)")
ROW_LINK = re.compile(r"^\|\s*\[[^\]\n]*\]\((?P<target>[^)\s]+)\)\s*\|")


def unlink_missing(page: str, text: str, present: set[str]) -> str:
    """``text`` (a Markdown page at ``page``) without its links to paths the release lacks: a
    table row that such a link opens goes, a link in parentheses goes with them, any other
    link becomes its words alone."""
    folders = {str(folder) for p in present for folder in PurePosixPath(p).parents}

    def missing(target: str) -> bool:
        path = _link_target(page, target)
        return path is not None and path not in present and path.rstrip("/") not in folders

    def keep(m: re.Match) -> str:
        if not missing(m["target"]):
            return m[0]
        return "" if m["open"] else m["text"]
    lines = [line for line in text.splitlines(keepends=True)
             if not ((row := ROW_LINK.match(line)) and missing(row["target"]))]
    return LINK.sub(keep, "".join(lines))


def _numbers(lessons: list[str]) -> str:
    """``lessons 04-11`` (or ``lessons 04, 06``) for the lesson files named."""
    numbers = sorted(int(Path(lesson).name[:2]) for lesson in lessons)
    if not numbers:
        return "none"
    if numbers == list(range(numbers[0], numbers[-1] + 1)) and len(numbers) > 2:
        return f"lessons {numbers[0]:02d}-{numbers[-1]:02d}"
    return "lessons " + ", ".join(f"{n:02d}" for n in numbers)


def release_readme(course_readme: str, level: str, lessons: list[str]) -> str:
    """The course README with its set-up section replaced by the release's (``RELEASE_SETUP``)."""
    start = course_readme.find(f"\n{SETUP_HEADING}")
    end = course_readme.find("\n## ", start + 1)
    if start < 0 or end < 0:
        raise ReleaseError(f"README.md has no {SETUP_HEADING!r} section followed by another: "
                           f"the release replaces that section with its own set-up")
    setup = RELEASE_SETUP.format(level=level, lessons=_numbers(lessons))
    return course_readme[:start + 1] + setup + course_readme[end + 1:]


def lessons_standing_in(root: Path) -> list[dict]:
    """The lessons whose code runs the reference where the learner's lab does not run yet:
    ``[{lesson, lab, lines}]``. In a release they need recorded reference outputs."""
    found = []
    for path in sorted((root / "lessons").glob("[0-9][0-9]_*.py")):
        lines = [k for k, line in enumerate(path.read_text().splitlines(), 1)
                 if STANDS_IN.search(line) and not line.lstrip().startswith("#")]
        number = int(path.name[:2])
        if lines:
            found.append({"lesson": f"lessons/{path.name}",
                          "lab": LABS[number - 1] if 1 <= number <= len(LABS) else None,
                          "lines": lines})
    return found


def _git(root: Path, *args: str) -> str | None:
    """``git ARGS``'s output in ``root`` (None: not a git checkout, or no git)."""
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _commit(root: Path) -> dict:
    """The commit a release is made from, and whether the course had changes not committed."""
    head = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain")
    return {"commit": head.strip() if head else None,
            "uncommitted_changes": None if status is None else bool(status.strip())}


def release_files(root: Path, level: str, record: bool | tuple = True) -> dict[str, bytes]:
    """``{path: bytes}`` of everything a release at ``level`` holds, made from the course at
    ``root`` (``RELEASE_MANIFEST`` last, with a hash of every other file). ``record``: run the
    lessons that stand the reference in and keep what it showed (``recorded_lessons``); False
    records none, a collection of lab names only their lessons (the package's tests)."""
    if level not in assign.LEVELS:
        raise ReleaseError(f"unknown level {level!r}: choose one of {', '.join(assign.LEVELS)}")
    for need in ("workbook", "solutions", "lessons", "tests/grading", "README.md", "pyproject.toml"):
        if not (root / need).exists():
            raise ReleaseError(f"{root} has no {need}: run `workbook release` from the course "
                               f"repository (or set WORKBOOK_ROOT to it)")
    files = _tree(root, "workbook") | _tree(root, "lessons")
    made = {level: assign.make_labs(root / "solutions", root / "tests" / "grading", level)}
    for rel, text in assign.expected_labs(root / "solutions", level=level, made=made).items():
        files[f"labs/{rel}"] = text.encode()
    hidden_count = 0
    for path in sorted((root / "tests" / "grading").glob("*.py")):
        text, hidden = public_tests(path.read_text(), f"tests/grading/{path.name}")
        hidden_count += len(hidden)
        files[f"tests/grading/{path.name}"] = text.encode()
    for name in PLAIN_FILES:
        if (root / name).is_file():
            files[name] = (root / name).read_bytes()
    pyproject = (root / "pyproject.toml").read_text()     # plain `pytest` runs the grading tests
    files["pyproject.toml"] = re.sub(r'(?m)^testpaths\s*=.*$', 'testpaths = ["tests/grading"]',
                                     pyproject).encode()
    docs = {rel: data for rel, data in _tree(root, "docs").items()
            if PurePosixPath(rel).name not in INSTRUCTOR_DOCS}
    files |= docs
    standing_in = lessons_standing_in(root)
    if record is not True:                   # False: none; a collection of labs: only theirs
        standing_in_recorded = [s for s in standing_in if record and s["lab"] in record]
    else:
        standing_in_recorded = standing_in
    recorded = recorded_lessons(root, standing_in_recorded, files) if standing_in_recorded \
        else None
    files["README.md"] = release_readme((root / "README.md").read_text(), level,
                                        [s["lesson"] for s in standing_in]).encode()
    present = set(files)
    for rel in [r for r in files if r.endswith(".md")]:
        files[rel] = unlink_missing(rel, files[rel].decode(), present).encode()
    manifest = {
        "what": "a student release of the Overlap Workbook course (workbook release)",
        "level": level,
        "made_from": _commit(root),
        "labs": LABS,
        "left_out": LEFT_OUT + [f"{hidden_count} hidden test(s) of tests/grading"],
        "lessons_needing_reference_outputs": standing_in,
        "recorded_lessons": recorded,
        "files": {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(files.items())},
    }
    files[RELEASE_MANIFEST] = (json.dumps(manifest, indent=1) + "\n").encode()
    return files


def recorded_lessons(root: Path, standing_in: list[dict],
                     files: dict[str, bytes]) -> dict:
    """Record the reference's outputs for the lessons ``standing_in`` with the release's own
    stub labs, add them to ``files`` (``lessons/recorded/LAB.json.gz``) and return the manifest's
    entry: the commit, the machine, the seconds it took and each file's size. (A recording
    holds outputs, never code; ``release_check`` reads the text they show for answer lines.)"""
    labs = {rel[len("labs/"):]: data for rel, data in files.items() if rel.startswith("labs/")}
    todo = [s for s in standing_in if s["lab"]]
    recorded, entry = lesson_recording.record_lessons(root, todo, labs, _commit(root))
    files |= recorded
    return entry


# --------------------------------------------------------------------------- writing it
def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_output(out: Path, root: Path) -> Path:
    """``out`` resolved, once it is fit for a new release: not the course nor inside it, not a
    file, not a folder with anything in it."""
    out = Path(out).expanduser().resolve()
    if out == root.resolve():
        raise ReleaseError(f"-o {out} is the course repository itself: name a new folder "
                           f"outside it")
    if _inside(out, root.resolve()):
        raise ReleaseError(f"-o {out} is inside the course repository {root}: name a folder "
                           f"outside it (a release must not sit beside the answers)")
    if out.is_file():
        raise ReleaseError(f"-o {out} is a file: name a new or empty folder")
    if out.is_dir() and any(out.iterdir()):
        raise ReleaseError(f"-o {out} is not empty: name a new or empty folder (to refresh a "
                           f"release, use --update {out})")
    return out


def _write_all(files: dict[str, bytes], folder: Path) -> None:
    for rel, data in files.items():
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        if rel == ".ci/run" or rel.endswith(".sh"):
            target.chmod(0o755)


def make_release(root: Path, out: Path, level: str = assign.DEFAULT_LEVEL,
                 record: bool | tuple = True) -> dict[str, bytes]:
    """Write a release of the course at ``root`` into ``out`` at ``level``; return its files
    (``record``: with the lessons' recorded reference outputs, ``release_files``).
    Everything is checked and made first, then written to a folder beside ``out`` and renamed, so
    an error leaves nothing behind."""
    out = check_output(out, root)
    files = release_files(root, level, record)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        _write_all(files, staging)
        if out.is_dir():
            out.rmdir()                                  # empty: checked above
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return files


def _recorded_as_made(manifest: dict) -> bool | tuple:
    """What ``--update`` records again: nothing if the release recorded nothing; every lesson
    that stands the reference in now if it recorded every one that did then; else the same labs
    (a partial release, as the package's tests make)."""
    entry = manifest.get("recorded_lessons")
    if not entry:
        return False
    labs = tuple(entry.get("per_lesson_seconds", {}))
    then = {s["lab"] for s in manifest.get("lessons_needing_reference_outputs", []) if s["lab"]}
    return True if then <= set(labs) else labs


def update_release(root: Path, folder: Path, level: str | None = None,
                   record: bool | None = None) -> list[str]:
    """Bring the release in ``folder`` up to date with the course at ``root``; return what was
    done, a line per file. ``record`` (default: as the release was made) records the lessons'
    reference outputs again (``recorded_lessons``; unchanged ones come from the cache). A file the learner edited since the release (its hash differs from
    the manifest's) is never overwritten: the course's new version goes beside it as
    ``NAME.new``. Files the new release no longer holds are removed when unedited."""
    folder = Path(folder).expanduser().resolve()
    manifest_path = folder / RELEASE_MANIFEST
    if not manifest_path.is_file():
        raise ReleaseError(f"--update {folder}: no {RELEASE_MANIFEST} there, so it is not a "
                           f"release made by `workbook release` (make one with -o)")
    if _inside(folder, root.resolve()):
        raise ReleaseError(f"--update {folder} is inside the course repository {root}")
    old = json.loads(manifest_path.read_text())
    level = level or old.get("level", assign.DEFAULT_LEVEL)
    if record is None:
        record = _recorded_as_made(old)
    files = release_files(root, level, record)
    recorded: dict[str, str] = old.get("files", {})

    def edited(rel: str) -> bool:
        path = folder / rel
        return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() != recorded.get(rel)

    done = []
    for rel, data in files.items():
        path = folder / rel
        if rel == RELEASE_MANIFEST or (path.is_file() and path.read_bytes() == data):
            continue
        if edited(rel):
            _write_all({f"{rel}.new": data}, folder)
            done.append(f"kept {rel} (edited since the release); the course's version: {rel}.new")
        else:
            _write_all({rel: data}, folder)
            done.append(f"wrote {rel}")
    for rel in sorted(set(recorded) - set(files)):
        if (folder / rel).is_file() and not edited(rel):
            (folder / rel).unlink()
            done.append(f"removed {rel} (no longer in the release)")
    _write_all({RELEASE_MANIFEST: files[RELEASE_MANIFEST]}, folder)
    return done
