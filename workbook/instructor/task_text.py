"""How much of each answer a lab's text gives away: the share of its identifiers named as code.

    python -m workbook.instructor.task_text [LAB ...] [--level L]

A lab teaches when its text states what to build and leaves the how to the learner. For every
task this measures the share of the *answer's identifiers* (the names its reference code uses)
that the *task's text* in the generated lab writes as code. The issue behind it measured 29 % on
average with near-code hints in the lab file; a spec-only (``standard``) lab is held to at most
5 % on average and 15 % for any task (``tests/package/test_task_text.py``).

* The answer's identifiers: every name, attribute and keyword argument in the task's blocks, less
  Python's builtins, ``self``/``cls``, the modules the solution imports (``torch``, ``dist``), the
  parameters of the function that holds the block, and the task's own functions, classes and
  methods (signatures are the contract, and the lab prints them anyway). A challenge task's
  answer is every body it hands over.
* The task's text: its line in the task list, and every docstring and comment inside its
  top-level function or class in the generated lab.
* Named as code: inside backticks, dotted (``.grad``, ``a.b``), called (``f(``), indexed
  (``x[``), or an identifier no prose word looks like (``snake_case``, ``CamelCase``). "the
  model's parameters" in prose names nothing; ``model.parameters()`` names both.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

from workbook.instructor.assign import DEFAULT_LEVEL, LEVELS, Lab, Task, make_labs

SKIP = set(dir(builtins)) | {"self", "cls"}
_SPAN = re.compile(r"`+([^`]+)`+")
_DOTTED = re.compile(r"(?<![\w.])(?:\w+)?(?:\.\w+)+")
_CALLED = re.compile(r"\b(\w+)[(\[]")
_CODE_WORD = re.compile(r"\b(?:\w*_\w*|[a-z]+[A-Z]\w*|[A-Z][a-z0-9]+[A-Z]\w*)\b")
_WORD = re.compile(r"[A-Za-z_]\w*")


def imported_names(tree: ast.Module) -> set[str]:
    """Names the solution binds by ``import`` (modules such as ``torch``, ``dist``, ``nn``)."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch"):
            names |= {a.asname or a.name for a in node.names if a.name[:1].islower()}
    return names


def _params(tree: ast.Module, line: int) -> set[str]:
    """The parameters of the innermost function around line ``line`` (from 1)."""
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.lineno <= line <= node.end_lineno:
            if best is None or node.lineno > best.lineno:
                best = node
    if best is None:
        return set()
    a = best.args
    return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs} | \
        {x.arg for x in (a.vararg, a.kwarg) if x}


def identifiers(code: str) -> set[str]:
    """Every name, attribute and keyword argument that ``code`` (dedented lines) uses."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return {t.string for t in tokenize.generate_tokens(io.StringIO(code).readline)
                if t.type == tokenize.NAME}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.keyword) and node.arg:
            found.add(node.arg)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
    return found


def named_as_code(text: str) -> set[str]:
    """The identifiers ``text`` writes as code (the module docstring says which forms count)."""
    found = set()
    for span in _SPAN.findall(text):
        found |= set(_WORD.findall(span))
    for dotted in _DOTTED.findall(text):
        found |= set(_WORD.findall(dotted))
    found |= set(_CALLED.findall(text)) | set(_CODE_WORD.findall(text))
    return found


def _text_of(lab_text: str, names: list[str], entry: str) -> str:
    """The task's text in a generated lab: its task-list entry, and every docstring and comment
    inside its top-level functions/classes."""
    tree = ast.parse(lab_text)
    spans = [(n.lineno, n.end_lineno) for n in tree.body
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
             and n.name in names]
    parts = [entry]
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                any(a <= node.lineno <= b for a, b in spans):
            parts.append(ast.get_docstring(node) or "")
    for tok in tokenize.generate_tokens(io.StringIO(lab_text).readline):
        if tok.type == tokenize.COMMENT and any(a <= tok.start[0] <= b for a, b in spans):
            parts.append(tok.string.lstrip("#"))
    return "\n".join(parts)


@dataclass
class Share:
    """One task's figure: ``named`` of the answer's ``answer`` identifiers are in its text."""
    lab: str
    task: str
    answer: set[str]
    named: set[str]

    @property
    def share(self) -> float:
        return len(self.named) / len(self.answer) if self.answer else 0.0


def task_shares(solution_text: str, lab: str, generated: Lab) -> list[Share]:
    """The share of every task of ``generated`` (made from ``solution_text``)."""
    sol_tree = ast.parse(solution_text)
    skip = SKIP | imported_names(sol_tree)
    sol_lines = solution_text.splitlines()
    shares = []
    for task in generated.tasks:
        answer: set[str] = set()
        spans = _answer_spans(sol_tree, task) if task.region else \
            [(b.begin + 1, b.end + 1) for b in task.blocks]
        for first, last in spans:
            code = "\n".join(sol_lines[first - 1:last])
            answer |= identifiers(_dedent(code)) - _params(sol_tree, first)
        answer -= skip | _interface(sol_tree, task)
        entry = f"{task.title()}: {task.goal}"
        named = answer & named_as_code(_text_of(generated.text, task.covers, entry))
        shares.append(Share(lab, task.title(), answer, named))
    return shares


def _interface(tree: ast.Module, task: Task) -> set[str]:
    """The names the task's own signatures give: its functions, classes and methods (the task
    list and the ``def`` lines print them; naming them is the contract, not the answer)."""
    names = set(task.covers) | set(task.members)
    for node in tree.body:
        if getattr(node, "name", None) in task.covers:
            names |= {n.name for n in ast.walk(node)
                      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    return names


def _answer_spans(tree: ast.Module, task: Task) -> list[tuple[int, int]]:
    """A challenge task's answer: the bodies (after the docstring) of every function in it."""
    spans = []
    for node in tree.body:
        if getattr(node, "name", None) not in task.covers:
            continue
        for fn in ast.walk(node):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
                if body:
                    spans.append((body[0].lineno, body[-1].end_lineno))
    return spans


def _dedent(code: str) -> str:
    lines = [line for line in code.splitlines() if line.strip()]
    cut = min((len(line) - len(line.lstrip()) for line in lines), default=0)
    return "\n".join(line[cut:] if line.strip() else "" for line in code.splitlines())


def lab_shares(solutions: Path, level: str = DEFAULT_LEVEL, labs=None) -> list[Share]:
    """Every task's share, over the labs of ``solutions/`` (or the named ones), at ``level``."""
    result = []
    for rel, generated in make_labs(solutions, level=level).items():
        name = Path(rel).stem
        if isinstance(generated, Lab) and (not labs or name in labs):
            result += task_shares((solutions / rel).read_text(), name, generated)
    return result


def main(argv=None) -> int:
    from workbook.grading.labs import repo_root
    parser = argparse.ArgumentParser(prog="python -m workbook.instructor.task_text",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("labs", nargs="*", help="labs to measure (default: all)")
    parser.add_argument("--level", choices=LEVELS, default=None,
                        help="one level (default: every level)")
    args = parser.parse_args(argv)
    for level in [args.level] if args.level else LEVELS:
        shares = lab_shares(repo_root() / "solutions", level, args.labs)
        mean = sum(s.share for s in shares) / len(shares) if shares else 0.0
        print(f"level {level}: {len(shares)} tasks, {mean:.1%} of the answers' identifiers "
              f"named on average, at most {max((s.share for s in shares), default=0):.1%}")
        for s in shares:
            names = ", ".join(sorted(s.named)) or "-"
            print(f"  {s.share:6.1%}  {s.lab}: {s.task}  ({len(s.named)}/{len(s.answer)}: {names})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
