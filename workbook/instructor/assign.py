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

Under the generated header, each lab starts with its task list: one numbered line per top-level
function or class that holds a block (``Ring.__init__ and .step`` for a class's stubbed
methods), its goal (the first sentence of its docstring, else the block's hint) and the points
it carries. Points come from the lab's grading tests, ``tests/grading/test_<lab>.py``, read with
``ast`` (nothing is imported, neither torch nor the tests)::

    @pytest.mark.points(4)
    @pytest.mark.tasks("ring_all_reduce")          # the lab functions/classes the test grades
    def test_ring_all_reduce_pattern(): ...

* A name is a function or class of the lab, or a method (``ColumnParallelLinear.forward``),
  which counts for its class's line. A test's points (times its cases, for a literal
  ``parametrize``) are split evenly among the lines it names; a line's points are the sum of
  its shares, so the list adds up to the lab's total.
* The arguments may be literals or module constants (``*NAMES`` for a tuple of names). Tests
  made by a function of the test module (``test_a, test_b = _make("x", 2, 3)``) are read from
  the decorators of the functions it returns, its parameters replaced by the call's literal
  arguments.
* Once a test module names tasks, every test with points must name at least one, and only
  functions or classes that hold a block: anything else is an ``AssignError``. A line no test
  names says "not graded on its own".
* A lab whose test module has no ``tasks`` marker at all (or no test module) gets the list
  without points.
"""
from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

BEGIN = re.compile(r"^(?P<indent>\s*)### BEGIN SOLUTION\s*(?P<hint>.*)$")
END = re.compile(r"^\s*### END SOLUTION\s*$")
DEF = re.compile(r"^(?P<indent>\s*)(?:async\s+)?(?:def|class)\s+(?P<name>\w+)")
HEADER = ("# Generated from solutions/{name} by `workbook assign`: this is your file to edit.\n"
          "# Replace each `raise NotImplementedError` with your code, then grade it with\n"
          "#     workbook grade --lab {lab}\n")
WIDTH = 99                                   # generated comment lines are wrapped to this width


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


# --------------------------------------------------------------------------- the tests' marks
@dataclass(frozen=True)
class Graded:
    """What a grading test is worth, and the lab functions/classes it names."""
    points: float
    tasks: tuple[str, ...]


def _mark(node: ast.expr) -> str | None:
    """The mark a decorator applies: ``"points"`` for ``pytest.mark.points(...)`` (or ``mark.points(...)``)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        owner = node.func.value
        if (isinstance(owner, ast.Attribute) and owner.attr == "mark") or \
                (isinstance(owner, ast.Name) and owner.id == "mark"):
            return node.func.attr
    return None


def _literal(node: ast.expr, env: dict[str, ast.expr], where: str):
    """The value of ``node``: a literal, or a name bound to one (a module constant, or a parameter
    of a test-making function)."""
    if isinstance(node, ast.Name) and node.id in env:
        node = env[node.id]
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise AssignError(f"{where}: {ast.unparse(node)!r} is not a literal, so `workbook assign` "
                          f"cannot read it without running the tests") from None


def _cases(values: ast.expr, consts: dict[str, ast.expr], where: str) -> int:
    """How many cases a ``parametrize`` makes of a literal list (or a module constant holding one)."""
    if isinstance(values, ast.Name) and values.id in consts:
        values = consts[values.id]
    if isinstance(values, (ast.List, ast.Tuple, ast.Set)):
        return len(values.elts)
    raise AssignError(f"{where}: cannot count the cases of {ast.unparse(values)!r} without running "
                      f"the tests; give parametrize a literal list")


def _graded(fn: ast.FunctionDef | ast.AsyncFunctionDef, env: dict, consts: dict,
            where: str) -> Graded | None:
    points, tasks, cases = None, [], 1
    env = {**consts, **env}
    for dec in fn.decorator_list:
        kind = _mark(dec)
        if kind == "points":
            points = float(_literal(dec.args[0], env, where)) if dec.args else 1.0
        elif kind == "tasks":
            for arg in dec.args:                     # "name", NAME or *NAMES (module constants)
                names = _literal(arg.value, env, where) if isinstance(arg, ast.Starred) else \
                    [_literal(arg, env, where)]
                if not all(isinstance(name, str) for name in names):
                    raise AssignError(f"{where}: tasks() takes names (strings), got {names!r}")
                tasks.extend(names)
        elif kind == "parametrize":
            values = dec.args[1] if len(dec.args) > 1 else \
                next((k.value for k in dec.keywords if k.arg == "argvalues"), None)
            if values is not None:
                cases *= _cases(values, consts, where)
    return None if points is None else Graded(points * cases, tuple(dict.fromkeys(tasks)))


def _bind(fn: ast.FunctionDef, call: ast.Call) -> dict[str, ast.expr]:
    """The parameters of ``fn`` bound to the argument nodes of ``call`` (and to defaults)."""
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    env = dict(zip(params[len(params) - len(fn.args.defaults):], fn.args.defaults))
    env.update((a.arg, d) for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is not None)
    env.update(zip(params, call.args))
    env.update((k.arg, k.value) for k in call.keywords if k.arg is not None)
    return env


def _made_by(fn: ast.FunctionDef) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions that ``fn`` defines and returns (``return a, b``), in order."""
    inner = {n.name: n for n in fn.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    ret = next((n.value for n in fn.body if isinstance(n, ast.Return)), None)
    names = ret.elts if isinstance(ret, ast.Tuple) else [ret]
    return [inner[n.id] for n in names if isinstance(n, ast.Name) and n.id in inner]


def graded_tests(source: str, filename: str = "<tests>") -> dict[str, Graded]:
    """``{test name: Graded}`` for every test with a ``points`` mark in a grading module's source
    (see the module docstring for the two forms it reads)."""
    tree = ast.parse(source, filename)
    makers = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    consts = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Name)}
    found: dict[str, Graded | None] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            found[node.name] = _graded(node, {}, consts, f"{filename}::{node.name}")
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                isinstance(node.value.func, ast.Name) and node.value.func.id in makers:
            target = node.targets[0]
            names = [e.id if isinstance(e, ast.Name) else "" for e in
                     (target.elts if isinstance(target, ast.Tuple) else [target])]
            if not any(n.startswith("test_") for n in names):
                continue
            maker = makers[node.value.func.id]
            made = _made_by(maker)
            if len(made) != len(names):
                raise AssignError(f"{filename}:{node.lineno}: {maker.name}() returns {len(made)} "
                                  f"test function(s) `workbook assign` can read, not {len(names)}")
            env = _bind(maker, node.value)
            for name, fn in zip(names, made):
                if name.startswith("test_"):
                    found[name] = _graded(fn, env, consts, f"{filename}::{name}")
    return {name: g for name, g in found.items() if g is not None}


# --------------------------------------------------------------------------- the task list
@dataclass
class Task:
    """One line of a lab's task list: a top-level function or class that holds blocks."""
    name: str
    goal: str
    members: list[str] = field(default_factory=list)    # a class's stubbed methods
    points: float | None = None                         # None: not graded (or not known)

    def title(self) -> str:
        """``Ring.step``; ``Ring.__init__ and .step``; ``Ring.put, .wait and .check``."""
        if not self.members:
            return self.name
        dotted = [f".{m}" for m in self.members]
        listed = dotted[0] if len(dotted) == 1 else f"{', '.join(dotted[:-1])} and {dotted[-1]}"
        return self.name + listed


def _summary(doc: str | None) -> str:
    """The first sentence of a docstring's first paragraph, on one line (``x`` shown as `x`)."""
    if not doc:
        return ""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split()).replace("``", "`")
    return re.split(r"(?<!e\.g\.)(?<!i\.e\.)(?<!vs\.)(?<=[.!?])\s+", paragraph, maxsplit=1)[0]


def tasks_of(text: str, stubs: list[tuple[int, str]], filename: str) -> list[Task]:
    """The task list of a solution file: ``stubs`` holds each block's (line number, hint)."""
    try:
        body = ast.parse(text, filename).body
    except SyntaxError as exc:
        raise AssignError(f"{filename}:{exc.lineno}: not valid Python ({exc.msg})") from None
    tops = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    tasks: dict[str, Task] = {}
    for line, hint in stubs:
        top = next((n for n in tops if n.lineno <= line <= n.end_lineno), None)
        if top is None:
            tasks.setdefault("(module level)", Task("(module level)", hint))
            continue
        method = next((n for n in top.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and n.lineno <= line <= n.end_lineno), None) \
            if isinstance(top, ast.ClassDef) else None
        task = tasks.get(top.name)
        if task is None:
            goal = _summary(ast.get_docstring(top)) or \
                (_summary(ast.get_docstring(method)) if method else "") or hint
            task = tasks[top.name] = Task(top.name, goal)
        if method is not None and method.name not in task.members:
            task.members.append(method.name)
    return list(tasks.values())


def score_tasks(tasks: list[Task], graded: dict[str, Graded], where: str) -> None:
    """Give each task its points: every test's points split evenly among the tasks it names."""
    by_name = {t.name: t for t in tasks}
    for t in tasks:
        t.points = 0.0
    for test, g in graded.items():
        if not g.tasks:
            raise AssignError(f"{where}::{test} has points but no @pytest.mark.tasks(...): name "
                              f"the lab functions/classes it grades")
        owners = list(dict.fromkeys(name.split(".")[0] for name in g.tasks))
        for owner in owners:
            if owner not in by_name:
                raise AssignError(f"{where}::{test} names task {owner!r}, which holds no "
                                  f"### BEGIN SOLUTION block; tasks: {', '.join(by_name)}")
            by_name[owner].points += g.points / len(owners)


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


def _todo(indent: str, hint: str) -> list[str]:
    """The hint as a ``# TODO:`` comment, wrapped."""
    return _wrap(hint, f"{indent}# TODO: ", f"{indent}#       ")


# --------------------------------------------------------------------------- labs from solutions
def strip_solutions(text: str, lab: str, filename: str,
                    graded: dict[str, Graded] | None = None, tests_name: str = "") -> str:
    """The stub for one solution file (see the module docstring). ``graded``: the lab's grading
    tests (``graded_tests``); None or without any ``tasks`` mark: the task list has no points."""
    src = text.splitlines()
    out: list[str] = []
    stubs: list[tuple[int, str]] = []
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
        hint = m["hint"].strip().removeprefix("hint:").strip()
        stubs.append((start + 1, hint))
        if hint:
            out += _todo(indent, hint)
        out.append(f'{indent}raise NotImplementedError("not implemented yet: {where}")')
        i += 1
    tasks = tasks_of(text, stubs, filename)
    scored = bool(graded) and any(g.tasks for g in graded.values())
    if scored:
        score_tasks(tasks, graded, tests_name or f"tests/grading/test_{lab}.py")
    body = "\n".join(out) + "\n"
    return HEADER.format(name=filename, lab=lab) + task_list(tasks, scored) + body


def expected_labs(solutions: Path, tests: Path | None = None) -> dict[str, str]:
    """``{relative path: generated text}`` for every solution file; the task points come from
    ``tests/grading/test_<lab>.py`` (``tests``: that folder, by default beside ``solutions``)."""
    tests = solutions.parent / "tests" / "grading" if tests is None else tests
    result = {}
    for path in sorted(solutions.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(solutions)
        text = path.read_text()
        if "### BEGIN SOLUTION" not in text:
            result[str(rel)] = text
            continue
        test_file = tests / f"test_{path.stem}.py"
        shown = f"tests/grading/{test_file.name}"
        graded = graded_tests(test_file.read_text(), shown) if test_file.is_file() else None
        result[str(rel)] = strip_solutions(text, path.stem, str(rel), graded, shown)
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
