"""What each grading test is worth, read from its marks without running it (``ast`` only).

``workbook assign`` writes each lab's task list with points; ``workbook progress`` names the next
task from the self-check's verdicts; both read the tests' marks here::

    @pytest.mark.points(4)
    @pytest.mark.tasks("ring_all_reduce")          # the lab functions/classes the test grades
    def test_ring_all_reduce_pattern(): ...

The arguments may be literals or module constants (``*NAMES`` for a tuple of names). Tests made
by a function of the test module (``test_a, test_b = _make("x", 2, 3)``) are read from the
decorators of the functions it returns, its parameters replaced by the call's literal arguments.
A literal ``parametrize`` multiplies a test's points by its cases. A ``points`` mark's
``visibility`` (Gradescope's: ``"hidden"``, ``"after_due_date"``, ...) is read too: a test that is
not ``"visible"`` is left out of a student release (``hidden_tests``).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from workbook.grading.markup import AssignError


@dataclass(frozen=True)
class Graded:
    """What a grading test is worth, the lab functions/classes it names, and when Gradescope
    shows it to the student (``visible``, the default, or ``hidden``, ``after_due_date``, ...)."""
    points: float
    tasks: tuple[str, ...]
    visibility: str = "visible"


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
    points, tasks, cases, visibility = None, [], 1, "visible"
    env = {**consts, **env}
    for dec in fn.decorator_list:
        kind = _mark(dec)
        if kind == "points":
            points = float(_literal(dec.args[0], env, where)) if dec.args else 1.0
            visibility = next((str(_literal(k.value, env, where)) for k in dec.keywords
                               if k.arg == "visibility"), visibility)
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
    return None if points is None else Graded(points * cases, tuple(dict.fromkeys(tasks)),
                                              visibility)


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


def hidden_tests(source: str, filename: str = "<tests>") -> set[str]:
    """The names of the tests in a grading module that Gradescope does not show the student
    when they submit (a ``points`` mark with a ``visibility`` other than ``"visible"``)."""
    return {name for name, g in graded_tests(source, filename).items()
            if g.visibility != "visible"}
