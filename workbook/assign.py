"""Assignment generation: the learner's ``labs/`` is made from the reference ``solutions/``.

In a solution file, the part a learner writes stands between two marker lines::

        ### BEGIN SOLUTION hint: send to every rank but the root
        for peer in range(world):
            ...
        ### END SOLUTION

``generate`` copies every solution file to ``labs/`` with each such block replaced by the hint
(as a TODO comment) and a ``raise NotImplementedError("not implemented yet: <lab>.<function>")``
at the block's indentation, which the grader turns into a one-line message. Labs are never
edited by hand in this repository: ``check`` (``workbook assign --check``, run by CI) fails when
``labs/`` differs from what the generator makes.
"""
from __future__ import annotations

import re
from pathlib import Path

BEGIN = re.compile(r"^(?P<indent>\s*)### BEGIN SOLUTION\s*(?P<hint>.*)$")
END = re.compile(r"^\s*### END SOLUTION\s*$")
DEF = re.compile(r"^(?P<indent>\s*)(?:async\s+)?(?:def|class)\s+(?P<name>\w+)")
HEADER = ("# Generated from solutions/{name} by `workbook assign`: this is your file to edit.\n"
          "# Replace each `raise NotImplementedError` with your code, then grade it with\n"
          "#     workbook grade --lab {lab}\n")


class AssignError(ValueError):
    pass


def _enclosing(lines: list[str], index: int, indent: int) -> str:
    """The dotted name of the function/class that holds line ``index``."""
    names, limit = [], indent
    for line in reversed(lines[:index]):
        m = DEF.match(line)
        if m and len(m["indent"]) < limit:
            names.append(m["name"])
            limit = len(m["indent"])
            if limit == 0:
                break
    return ".".join(reversed(names)) or "<module>"


def strip_solutions(text: str, lab: str, filename: str) -> str:
    """The stub for one solution file (see the module docstring)."""
    src = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(src):
        m = BEGIN.match(src[i])
        if END.match(src[i]):
            raise AssignError(f"{filename}:{i + 1}: ### END SOLUTION without a BEGIN")
        if not m:
            out.append(src[i])
            i += 1
            continue
        start, indent = i, m["indent"]
        i += 1
        while i < len(src) and not END.match(src[i]):
            if BEGIN.match(src[i]):
                raise AssignError(f"{filename}:{i + 1}: nested ### BEGIN SOLUTION")
            i += 1
        if i == len(src):
            raise AssignError(f"{filename}:{start + 1}: ### BEGIN SOLUTION is never closed")
        where = f"{lab}.{_enclosing(src, start, len(indent))}"
        hint = m["hint"].strip()
        if hint:
            out.append(f"{indent}# TODO: {hint.removeprefix('hint:').strip()}")
        out.append(f'{indent}raise NotImplementedError("not implemented yet: {where}")')
        i += 1
    body = "\n".join(out) + "\n"
    return HEADER.format(name=filename, lab=lab) + body


def expected_labs(solutions: Path) -> dict[str, str]:
    """``{relative path: generated text}`` for every solution file."""
    result = {}
    for path in sorted(solutions.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(solutions)
        text = path.read_text()
        result[str(rel)] = strip_solutions(text, path.stem, str(rel)) if "### BEGIN SOLUTION" in text \
            else text
    return result


def generate(solutions: Path, labs: Path) -> list[str]:
    """Write ``labs/`` from ``solutions/``; return the files that changed."""
    changed = []
    for rel, text in expected_labs(solutions).items():
        target = labs / rel
        if not target.exists() or target.read_text() != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            changed.append(rel)
    return changed


def check(solutions: Path, labs: Path) -> list[str]:
    """The lab files that drift from what ``generate`` would write (missing, changed, extra)."""
    expected = expected_labs(solutions)
    drift = [rel for rel, text in expected.items()
             if not (labs / rel).exists() or (labs / rel).read_text() != text]
    extra = [str(p.relative_to(labs)) for p in labs.rglob("*.py")
             if "__pycache__" not in p.parts and str(p.relative_to(labs)) not in expected]
    return drift + [f"{e} (not in solutions/)" for e in extra]
