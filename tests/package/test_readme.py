"""The README is a front page that cannot go stale, and the pages in docs/ point at what exists.

* The README is at most 250 lines; the rest lives in ``docs/``.
* Its map of lessons and labs names every lesson (``lessons/NN_name.py``) and every lab of
  ``workbook.grading.labs.LABS``, so a new lesson or lab fails here until the map has it.
* Every module path that the README or a page of ``docs/`` writes, as a file
  (``workbook/runtime/gpu.py``, ``workbook/trace/``) or dotted (``workbook.runtime.gpu.plan``),
  exists: a file or folder, or a module, then a name defined or re-exported in it.
* Every relative link of those pages reaches a file of the repository.
* Every page of ``docs/`` is in the course site's navigation (``mkdocs.yml``).

Plain text checks: nothing is imported but ``workbook.grading.labs``.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from workbook.grading.labs import LABS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))
PAGES = [README, *DOCS]
MAX_README_LINES = 250
MAP_HEADING = "## The lessons and their labs"

LINK = re.compile(r"!?\[[^\]\n]*\]\((?P<target>[^)\s]+)\)|<(?:img|a)\b[^>]*\s(?:src|href)=\"(?P<html>[^\"]+)\"")
FILE_PATH = re.compile(r"(?<![\w./-])workbook/[\w./-]*")
DOTTED = re.compile(r"(?<![\w.])workbook(?:\.[A-Za-z_]\w*)+")


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _prose(text: str) -> str:
    """The text outside fenced code blocks (a shell session may show any path)."""
    out, fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
            continue
        if not fence:
            out.append(line)
    return "\n".join(out)


def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines, at most {MAX_README_LINES}: move the detail to a page "
        f"in docs/ and link it")


def _lesson_map() -> str:
    text = README.read_text()
    assert MAP_HEADING in text, f"README.md has no section {MAP_HEADING!r}"
    section = text.split(MAP_HEADING, 1)[1]
    return section.split("\n## ", 1)[0]


def test_readme_maps_every_lesson_and_lab():
    section = _lesson_map()
    lessons = sorted(p.stem for p in (ROOT / "lessons").glob("[0-9][0-9]_*.py"))
    assert lessons, "no lessons/NN_name.py found"
    missing = [name for name in lessons if name not in section]
    assert not missing, (f"README.md's lesson map ({MAP_HEADING!r}) does not name the lessons "
                         f"{missing}: add a row for each")
    missing = [lab for lab in LABS if f"`{lab}`" not in section]
    assert not missing, (f"README.md's lesson map ({MAP_HEADING!r}) does not name the labs "
                         f"{missing} (as `{missing[0]}`): add each to its lesson's row")


def _defines(module: Path, name: str) -> bool:
    """Whether ``module`` defines, imports or re-exports (by its name in quotes) ``name``."""
    src = module.read_text()
    n = re.escape(name)
    return bool(re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{n}\b|^\s*{n}\s*[:=]|"
                          rf"\bimport\b[^\n]*\b{n}\b|[\"']{n}[\"']", src, re.M))


def _module_path_exists(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else \
            base / "__init__.py" if (base / "__init__.py").is_file() else None
        if module is None:
            continue
        rest = parts[cut:]
        return not rest or _defines(module, rest[0])
    return False


def _mentions(page: Path) -> tuple[list[str], list[str]]:
    text = _prose(page.read_text())
    files = [m.rstrip(".,;:") for m in FILE_PATH.findall(text)]
    dotted = [m for m in DOTTED.findall(text)]
    return files, dotted


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_module_paths_exist(page):
    files, dotted = _mentions(page)
    wrong = sorted({f for f in files if not (ROOT / f).exists()})
    wrong += sorted({d for d in dotted if not _module_path_exists(d)})
    assert not wrong, (f"{_rel(page)} names module paths that do not exist: {wrong} "
                       f"(see `find workbook -name '*.py'` for where each lives now)")


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page):
    broken = []
    for m in LINK.finditer(_prose(page.read_text())):
        target = m.group("target") or m.group("html")
        if re.match(r"[a-z][a-z0-9+.-]*:|#|/", target):      # a URL, an anchor, a site path
            continue
        path = target.split("#", 1)[0]
        resolved = (page.parent / path).resolve()
        if ROOT not in resolved.parents and resolved != ROOT or not resolved.exists():
            broken.append(target)
    assert not broken, f"{_rel(page)} links to files that do not exist: {broken}"


def test_every_docs_page_is_in_the_site_navigation():
    config = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r"^\s*-\s*[^:#\n]+:\s*(\S+\.md)\s*$", config, re.M))
    missing = [_rel(p) for p in DOCS if p.relative_to(ROOT / "docs").as_posix() not in listed]
    assert not missing, f"pages missing from mkdocs.yml's nav: {missing}"


def test_checks_find_what_they_look_for():
    """The checks above would pass on nothing; they must see paths, links and lessons."""
    files, dotted = _mentions(ROOT / "docs" / "launcher.md")
    assert "workbook/runtime/launch.py" in files, files
    files, dotted = _mentions(ROOT / "docs" / "architecture.md")
    assert any(d.startswith("workbook.grading.labs") for d in dotted), dotted
    assert _module_path_exists("workbook.runtime.gpu.plan")
    assert not _module_path_exists("workbook.launch")                  # moved to workbook/runtime/
    assert not _module_path_exists("workbook.runtime.gpu.no_such_name")
    assert list(LINK.finditer(README.read_text())), "no link found in README.md"
