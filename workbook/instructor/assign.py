"""Assignment generation: the learner's ``labs/`` is made from the reference ``solutions/``.

A solution file marks the learner's part of each task as a block with three hint rungs, and
whole components as challenge regions (the markup: ``workbook.grading.markup``). One solution
makes the lab at three levels, which the instructor picks (``workbook assign --level``):

* ``guided``: each block becomes the idea (hint 1) and a near-code ``# TODO:`` (hint 3) above a
  ``raise NotImplementedError("not implemented yet: <lab>.<function>")``;
* ``standard`` (the default): each block becomes the ``raise`` alone; the docstrings are the spec,
  and the hints come on request (``workbook hint LAB TASK``, read from ``labs/hints.json``);
* ``challenge``: every function whose ``def`` lies in a challenge region loses its whole body
  (given code included) to the ``raise``: the learner writes the component from its docstrings.

Under the generated header, each lab lists its tasks: one numbered line per top-level function
or class that holds a block (at ``challenge``, one per region), its goal and its points. Points
come from the lab's grading tests, read with ``ast`` (``workbook.grading.points``): a test's
points are split evenly among the tasks it names (``@pytest.mark.tasks``), so the list adds up to
the lab's total; a task no test names says "not graded on its own". The same tests grade every
level. Labs are never edited by hand in this repository: ``check`` (``workbook assign --check``,
run by CI) fails when ``labs/`` differs from what the generator makes.
"""
from __future__ import annotations

import ast
import json
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from workbook.grading.markup import BEGIN, AssignError, Block, Region, level_of, parse  # noqa: F401
from workbook.grading.points import Graded, graded_tests  # noqa: F401 (the assign API)

LEVELS = ("guided", "standard", "challenge")
DEFAULT_LEVEL = "standard"
HINTS_FILE = "hints.json"
HEADER = ("# Generated from solutions/{name} by `workbook assign` (level: {level}): this is your "
          "file to edit.\n"
          "# Replace each `raise NotImplementedError` with your code; check it with `workbook run "
          "{lab}`\n"
          "# (or `workbook watch {lab}`). Stuck on task N? `workbook hint {lab} N`, one hint at a "
          "time.\n")
WIDTH = 99                                   # generated comment lines are wrapped to this width
MIN_CHALLENGE_LINES = 20


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise AssignError(f"unknown level {level!r}: choose one of {', '.join(LEVELS)}")


# --------------------------------------------------------------------------- the task list
@dataclass
class Task:
    """One line of a lab's task list: a top-level function or class that holds blocks, or (at
    ``challenge``) a region of them."""
    name: str
    goal: str
    members: list[str] = field(default_factory=list)    # a class's stubbed methods
    points: float | None = None                         # None: not graded (or not known)
    covers: list[str] = field(default_factory=list)     # the top-level names it stands for
    blocks: list[Block] = field(default_factory=list)   # its blocks, for the hints
    region: str = ""                                    # a challenge region's title
    region_line: int = -1                               # its BEGIN CHALLENGE line (from 0)
    learner_lines: int = 0                              # code lines the learner writes

    def title(self) -> str:
        """``Ring.step``; ``Ring.__init__ and .step``; a region's title."""
        if self.region:
            return self.region
        if not self.members:
            return self.name
        dotted = [f".{m}" for m in self.members]
        listed = dotted[0] if len(dotted) == 1 else f"{', '.join(dotted[:-1])} and {dotted[-1]}"
        return self.name + listed

    def rungs(self) -> list[list[str]]:
        """Hint rung k of every block, each line naming its function when the task has several."""
        several = len(self.blocks) > 1
        return [[f"{b.where}: {b.rungs[k]}" if several else b.rungs[k]
                 for b in self.blocks if b.rungs[k]] for k in range(3)]


def _summary(doc: str | None) -> str:
    """The first sentence of a docstring's first paragraph, on one line (``x`` shown as `x`)."""
    if not doc:
        return ""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split()).replace("``", "`")
    return re.split(r"(?<!e\.g\.)(?<!i\.e\.)(?<!vs\.)(?<=[.!?])\s+", paragraph, maxsplit=1)[0]


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def tasks_of(tree: ast.Module, blocks: list[Block], regions: list[Region], level: str) -> list[Task]:
    """The task list of a solution: a task per top-level def/class holding blocks, except that at
    ``challenge`` every top-level def/class inside a region joins that region's one task."""
    tops = [n for n in tree.body if isinstance(n, _DEFS)]
    tasks: dict[str, Task] = {}
    if level == "challenge":
        for r in regions:
            inside = [n.name for n in tops if r.begin < n.lineno - 1 < r.end]
            tasks[f"region:{r.begin}"] = Task(inside[0] if inside else r.title, "",
                                              covers=inside, region=r.title or ", ".join(inside),
                                              region_line=r.begin)
    for b in blocks:
        line = b.begin + 1
        top = next((n for n in tops if n.lineno <= line <= n.end_lineno), None)
        if top is None:
            tasks.setdefault("(module level)", Task("(module level)", b.rungs[0])).blocks.append(b)
            continue
        region = next((k for k, t in tasks.items() if top.name in t.covers and t.region), None)
        if region is not None:
            tasks[region].blocks.append(b)
            continue
        method = next((n for n in top.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and n.lineno <= line <= n.end_lineno), None) \
            if isinstance(top, ast.ClassDef) else None
        task = tasks.get(top.name)
        if task is None:
            goal = _summary(ast.get_docstring(top)) or \
                (_summary(ast.get_docstring(method)) if method else "") or b.rungs[0]
            task = tasks[top.name] = Task(top.name, goal, covers=[top.name])
        task.blocks.append(b)
        if method is not None and method.name not in task.members:
            task.members.append(method.name)
    order = {n.name: n.lineno for n in tops}
    return sorted(tasks.values(), key=lambda t: min([order.get(c, 0) for c in t.covers] or [0]))


def score_tasks(tasks: list[Task], graded: dict[str, Graded], where: str) -> None:
    """Give each task its points: every test's points split evenly among the tasks it names."""
    owner_of = {name: t for t in tasks for name in t.covers}
    for t in tasks:
        t.points = 0.0
    for test, g in graded.items():
        if not g.tasks:
            raise AssignError(f"{where}::{test} has points but no @pytest.mark.tasks(...): name "
                              f"the lab functions/classes it grades")
        owners = list(dict.fromkeys(name.split(".")[0] for name in g.tasks))
        for owner in owners:
            if owner not in owner_of:
                raise AssignError(f"{where}::{test} names task {owner!r}, which holds no "
                                  f"### BEGIN SOLUTION block; tasks: {', '.join(owner_of)}")
        for task in {id(owner_of[o]): owner_of[o] for o in owners}.values():
            share = sum(1 for o in owners if owner_of[o] is task)
            task.points += g.points * share / len(owners)


def _pts(points: float) -> str:
    value = round(points, 2)
    return f"{value:g} pt" if value == 1 else f"{value:g} pts"


def task_list(tasks: list[Task], graded: bool) -> str:
    """The comment block under the header: a numbered line (wrapped) per task."""
    if graded:
        total = sum(t.points or 0.0 for t in tasks)
        lines = ["#", f"# Your tasks ({_pts(total)} in all):"]
    else:
        lines = ["#", "# Your tasks:"]
    width = len(str(len(tasks)))
    for k, t in enumerate(tasks, 1):
        if not graded:
            worth = ""
        elif t.points:
            worth = f" ({_pts(t.points)})"
        else:
            worth = " (not graded on its own)"
        first = f"#   {k:>{width}}. "
        entry = f"{t.title()}{worth}: {t.goal}" if t.goal else f"{t.title()}{worth}"
        lines += _wrap(entry, first, "#" + " " * (len(first) - 1))
    return "\n".join(lines) + "\n"


_UNBREAKABLE = re.compile(r"`[^`]*`|(?<=\S) [-+*/=<>] (?=\S)")


def _wrap(text: str, first: str, rest: str) -> list[str]:
    """``text`` wrapped to ``WIDTH`` as comment lines, never inside `code` or around ``a + b``."""
    glued = _UNBREAKABLE.sub(lambda m: m[0].replace(" ", "\0"), text)
    return [line.replace("\0", " ") for line in textwrap.wrap(
        glued, WIDTH, initial_indent=first, subsequent_indent=rest, break_long_words=False,
        break_on_hyphens=False)]


# --------------------------------------------------------------------------- challenge bodies
def _header_end(src: list[str], node) -> int:
    """The line (from 0) that ends a def's signature: the ``:`` outside any bracket."""
    depth = 0
    for i in range(node.lineno - 1, len(src)):
        code = src[i].split("#", 1)[0]
        for ch in code:
            depth += ch in "([{"
            depth -= ch in ")]}"
        if depth == 0 and code.rstrip().endswith(":"):
            return i
    raise AssignError(f"line {node.lineno}: cannot find the end of def {node.name}'s signature")


def _functions_in(nodes, region: Region):
    """The functions whose ``def`` line lies in ``region``, looking into classes, not functions."""
    for n in nodes:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if region.begin < n.lineno - 1 < region.end:
                yield n
        elif isinstance(n, ast.ClassDef):
            yield from _functions_in(n.body, region)


def challenge_bodies(src: list[str], tree: ast.Module, regions: list[Region]
                     ) -> dict[int, tuple[int, str, str, Region]]:
    """``{first body line: (last body line, indent, dotted name, region)}`` (lines from 0) of
    every function a challenge region hands to the learner: its body after the docstring."""
    bodies = {}
    for region in regions:
        for fn in _functions_in(tree.body, region):
            first = fn.body[0]
            has_doc = isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None),
                                                                 ast.Constant) \
                and isinstance(first.value.value, str)
            if has_doc and len(fn.body) == 1:
                continue                                        # nothing but a docstring
            start = first.end_lineno if has_doc else _header_end(src, fn) + 1
            stmt = fn.body[1] if has_doc else first
            indent = src[stmt.lineno - 1][:len(src[stmt.lineno - 1]) - len(src[stmt.lineno - 1].lstrip())]
            end = fn.end_lineno - 1
            while end + 1 < len(src) and src[end + 1].strip().startswith("#") and \
                    src[end + 1].startswith(indent) and "CHALLENGE" not in src[end + 1]:
                end += 1                        # trailing comments and a block's END marker
            name = ".".join(_dotted(tree, fn))
            bodies[start] = (end, indent, name, region)
    return bodies


def _dotted(tree: ast.Module, target) -> list[str]:
    def walk(nodes, path):
        for n in nodes:
            if n is target:
                return path + [n.name]
            if isinstance(n, ast.ClassDef):
                found = walk(n.body, path + [n.name])
                if found:
                    return found
        return None
    return walk(tree.body, []) or [target.name]


def _learner_lines(lines: list[str]) -> int:
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


# --------------------------------------------------------------------------- labs from solutions
@dataclass
class Lab:
    """One generated lab: its text and its tasks (with their blocks and hints)."""
    text: str
    tasks: list[Task]
    level: str


def make_lab(text: str, lab: str, filename: str, graded: dict[str, Graded] | None = None,
             tests_name: str = "", level: str = DEFAULT_LEVEL) -> Lab:
    """The lab of one solution file at ``level`` (see the module docstring)."""
    _check_level(level)
    blocks, regions = parse(text, filename)
    try:
        tree = ast.parse(text, filename)
    except SyntaxError as exc:
        raise AssignError(f"{filename}:{exc.lineno}: not valid Python ({exc.msg})") from None
    src = text.splitlines()
    bodies = challenge_bodies(src, tree, regions) if level == "challenge" else {}
    by_line = {b.begin: b for b in blocks}
    markers = {r.begin: r for r in regions} | {r.end: None for r in regions}
    learner = {r.begin: 0 for r in regions}
    out: list[str] = []
    i = 0
    while i < len(src):
        if i in markers:
            region = markers[i]
            if region is not None and level == "challenge":
                out += _wrap(f"Challenge: {region.title}. Every function below, down to the end "
                             f"of the component, is yours to write from its docstring.",
                             f"{region.indent}# ", f"{region.indent}# ")
            i += 1
            continue
        if i in bodies:
            end, indent, name, region = bodies[i]
            learner[region.begin] += _learner_lines(src[i:end + 1])   # markup lines are comments
            out.append(f'{indent}raise NotImplementedError("not implemented yet: {lab}.{name}")')
            i = end + 1
            continue
        block = by_line.get(i)
        if block is None:
            out.append(src[i])
            i += 1
            continue
        if level == "guided":
            if block.rungs[0]:
                out += _wrap(block.rungs[0], f"{block.indent}# Idea: ", f"{block.indent}#       ")
            if block.rungs[2]:
                out += _wrap(block.rungs[2], f"{block.indent}# TODO: ", f"{block.indent}#       ")
        out.append(f'{block.indent}raise NotImplementedError("not implemented yet: '
                   f'{lab}.{block.where}")')
        i = block.end + 1
    if level == "challenge":
        for region in regions:
            if learner[region.begin] < MIN_CHALLENGE_LINES:
                raise AssignError(f"{filename}:{region.begin + 1}: challenge region "
                                  f"{region.title!r} leaves {learner[region.begin]} lines to the "
                                  f"learner; a challenge is at least {MIN_CHALLENGE_LINES}")
    tasks = tasks_of(tree, blocks, regions, level)
    for t in tasks:
        t.learner_lines = learner[t.region_line] if t.region else \
            sum(_learner_lines(b.code) for b in t.blocks)
    scored = bool(graded) and any(g.tasks for g in graded.values())
    if scored:
        score_tasks(tasks, graded, tests_name or f"tests/grading/test_{lab}.py")
    body = "\n".join(out) + "\n"
    header = HEADER.format(name=filename, lab=lab, level=level)
    return Lab(header + task_list(tasks, scored) + body, tasks, level)


def strip_solutions(text: str, lab: str, filename: str, graded: dict[str, Graded] | None = None,
                    tests_name: str = "", level: str = DEFAULT_LEVEL) -> str:
    """The lab file of one solution file at ``level`` (``make_lab``'s text)."""
    return make_lab(text, lab, filename, graded, tests_name, level).text


def _graded_for(solutions: Path, tests: Path | None, lab: str):
    tests = solutions.parent / "tests" / "grading" if tests is None else tests
    test_file = tests / f"test_{lab}.py"
    shown = f"tests/grading/{test_file.name}"
    return (graded_tests(test_file.read_text(), shown) if test_file.is_file() else None), shown


def make_labs(solutions: Path, tests: Path | None = None, level: str = DEFAULT_LEVEL
              ) -> dict[str, Lab | str]:
    """``{relative path: Lab}`` for every solution file with blocks (a plain copy for the rest)."""
    result: dict[str, Lab | str] = {}
    for path in sorted(solutions.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = str(path.relative_to(solutions))
        text = path.read_text()
        if "### BEGIN SOLUTION" not in text:
            result[rel] = text
            continue
        graded, shown = _graded_for(solutions, tests, path.stem)
        result[rel] = make_lab(text, path.stem, rel, graded, shown, level)
    return result


def every_level(solutions: Path, tests: Path | None = None) -> dict[str, dict[str, Lab | str]]:
    """``{level: make_labs(...)}``: the labs at each level, made once for everything below."""
    return {level: make_labs(solutions, tests, level) for level in LEVELS}


def hints_of(made: dict[str, dict[str, Lab | str]]) -> dict:
    """``labs/hints.json`` from ``every_level``: per lab and level, each task's three rungs."""
    table: dict[str, dict] = {}
    for level, labs in made.items():
        for rel, lab in labs.items():
            if isinstance(lab, Lab):
                table.setdefault(Path(rel).stem, {})[level] = [
                    {"title": t.title(), "names": t.covers, "points": t.points,
                     "rungs": t.rungs()} for t in lab.tasks]
    return table


def expected_labs(solutions: Path, tests: Path | None = None, level: str = DEFAULT_LEVEL,
                  made: dict | None = None) -> dict[str, str]:
    """``{relative path: text}`` of everything ``generate`` writes into ``labs/`` at ``level``
    (``made``: ``every_level``'s result, when the caller has it already)."""
    made = every_level(solutions, tests) if made is None else made
    result = {rel: (lab.text if isinstance(lab, Lab) else lab) for rel, lab in made[level].items()}
    result[HINTS_FILE] = json.dumps(hints_of(made), indent=1, sort_keys=True) + "\n"
    return result


def generate(solutions: Path, labs: Path, level: str = DEFAULT_LEVEL, force: bool = False
             ) -> list[str]:
    """Write ``labs/`` from ``solutions/`` at ``level``; return the files that changed.

    A lab file made at another level is replaced only when it is unedited (it equals what its own
    level makes) or with ``force``; otherwise nothing is written and ``AssignError`` names the
    files whose edits would be lost."""
    made = every_level(solutions)
    expected = expected_labs(solutions, level=level, made=made)
    edited = []
    for rel, text in expected.items():
        target = labs / rel
        if not target.exists() or force or rel == HINTS_FILE:
            continue
        old = target.read_text()
        was = level_of(old)
        if was is None or was == level or old == text:
            continue
        unedited = made[was].get(rel) if was in made else None
        if getattr(unedited, "text", unedited) != old:
            edited.append(str(target))
    if edited:
        raise AssignError(f"switching labs/ to level {level!r} would overwrite your edits in "
                          f"{', '.join(edited)}; keep a copy, then add --force")
    changed = []
    for rel, text in expected.items():
        target = labs / rel
        if not target.exists() or target.read_text() != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            changed.append(rel)
    return changed


def check(solutions: Path, labs: Path, level: str | None = None) -> list[str]:
    """The lab files that drift from what ``generate`` would write (missing, changed, extra);
    ``level``: by default the level the lab files say they were made at (else standard)."""
    if level is None:
        found = [level_of(p.read_text()) for p in sorted(labs.glob("*.py"))]
        level = next((lv for lv in found if lv), DEFAULT_LEVEL)
    expected = expected_labs(solutions, level=level)
    drift = [rel for rel, text in expected.items()
             if not (labs / rel).exists() or (labs / rel).read_text() != text]
    extra = [str(p.relative_to(labs)) for p in labs.rglob("*.py")
             if "__pycache__" not in p.parts and str(p.relative_to(labs)) not in expected]
    return drift + [f"{e} (not in solutions/)" for e in extra]
