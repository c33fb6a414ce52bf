"""Grading a deliberately wrong lab the way a course's CI would, and checking what it failed.

Shared by the ``test_*_wrong_caught.py`` modules: each folder of tests/grading/wrong/ is graded
(in this process on the warm rank pools, ``grade_in_process``; or in a pytest subprocess,
``grade``, as a course's CI would) and the test checks that exactly the expected grading tests
failed, each with a message that teaches.

A folder is graded on the checks it must fail (``grade_where_caught``, ``checks_caught_by``),
not on every check of its lab: a full grading fails exactly those, so the others pass, at the
cost of an overlap run or a traced step each. ``WORKBOOK_WRONG_LABS_ALL_CHECKS=1`` grades every
check again, and the same assertions then prove that the selection hides no catch
(docs/test-suite.md, "Each lab's budget").
"""
from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib.metadata import entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GRADING = ROOT / "tests" / "grading"
WRONG = GRADING / "wrong"


def _plugin_args() -> list[str]:
    """``-p workbook.grading.plugin`` unless the installed package already registers it."""
    names = {ep.value for ep in entry_points(group="pytest11")}
    return [] if any(v.startswith("workbook.grading.plugin") for v in names) else \
        ["-p", "workbook.grading.plugin"]


def grade(folder: str, test_file: str, junit: Path, timeout: float = 300) -> dict[str, str | None]:
    """Grade ``tests/grading/wrong/FOLDER`` with ``tests/grading/TEST_FILE``:
    ``{test name: failure message, or None if it passed}``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("WORKBOOK_IMPL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:nbmake", *_plugin_args(), "--impl", str(WRONG / folder),
         str(GRADING / test_file), "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert junit.exists(), f"pytest did not run for {folder}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    outcome = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        outcome[case.get("name")] = None if failure is None else \
            (failure.get("message") or "") + "\n" + (failure.text or "")
    return outcome


def verdicts_in_process(folder: str, lab: str, only=None, max_ranks: int | None = None) -> list:
    """The self-check engine's verdicts on ``tests/grading/wrong/FOLDER`` (``engine.run_checks``:
    the grader's own test functions, the same messages), in this process on the warm rank pools,
    of the checks ``only`` names (None: all), under a rank cap of ``max_ranks`` (None: none)."""
    from workbook.grading import engine
    from workbook.grading.labs import ENV_IMPL
    env = {ENV_IMPL: str(WRONG / folder)}
    if max_ranks is not None:
        env[engine.ENV_MAX_RANKS] = str(max_ranks)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return engine.run_checks(lab, only=only)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def assert_fails_exactly(folder: str, lab: str, only, expected: dict, max_ranks: int = 2) -> None:
    """Grade ``tests/grading/wrong/FOLDER`` in process (``verdicts_in_process``: the checks
    ``only``, under a rank cap of ``max_ranks``, as a small grading machine would) and assert
    that exactly the checks of ``expected`` (names without ``[n]``) failed -- failed, not hung
    or errored -- each message holding every word ``expected`` lists for it. With
    ``$WORKBOOK_WRONG_LABS_ALL_CHECKS=1``: every check, under the same cap."""
    from workbook.grading import engine
    if all_checks():                    # the proof that ``only`` hides no catch (the cap
        only = None                     # is the module's own: its words are the cap's)
    verdicts = verdicts_in_process(folder, lab, only, max_ranks=max_ranks)
    assert verdicts, "no check ran"
    failed = {v.name.split("[")[0] for v in verdicts if v.status != engine.PASSED}
    assert failed == set(expected), (
        f"{folder}: expected exactly {sorted(expected)} to fail, got "
        + "; ".join(f"{v.name}: {v.status}: {v.message[:300]}" for v in verdicts
                    if v.status != engine.PASSED))
    for v in verdicts:
        if v.status == engine.PASSED:
            continue
        assert v.status == engine.FAILED, f"{folder}: {v.name} is {v.status}: {v.message[:800]}"
        for word in expected[v.name.split("[")[0]]:
            assert word in v.message, f"{folder}: {v.name}'s message lacks {word!r}:\n{v.message[:1500]}"


def grade_in_process(folder: str, lab: str, only=None,
                     max_ranks: int | None = None) -> dict[str, str | None]:
    """As ``grade``, through the self-check engine in this process (``verdicts_in_process``) on
    the warm rank pools instead of a pytest subprocess that starts its own: ``{test name: failure
    message, or None if it passed}``, of the checks ``only`` names (None: all), under a rank cap
    of ``max_ranks`` (None: none)."""
    from workbook.grading import engine
    return {f"test_{v.name}": None if v.status in (engine.PASSED, engine.SKIPPED) else
            v.message if v.status == engine.FAILED else f"{v.status}: {v.message}"
            for v in verdicts_in_process(folder, lab, only, max_ranks=max_ranks)}


#: set to 1: every wrong lab is graded on every check of its lab (the proof that grading it on
#: the checks it is caught by hides no catch: the checks that fail must be the same), with no
#: rank cap in ``grade_where_caught`` (whose caps are new) and its module's own in
#: ``assert_fails_exactly`` (whose cap of 2 the expected words are written for)
ENV_ALL_CHECKS = "WORKBOOK_WRONG_LABS_ALL_CHECKS"


def all_checks() -> bool:
    """Is ``$WORKBOOK_WRONG_LABS_ALL_CHECKS`` set (every wrong lab graded on every check)?"""
    return os.environ.get(ENV_ALL_CHECKS, "").strip() not in ("", "0")


def checks_caught_by(expected: dict, also=()) -> tuple[str, ...]:
    """The checks a wrong lab is graded on: every check ``expected`` says must fail (names with
    or without ``test_``, without ``[n]``) and the checks ``also`` names."""
    return tuple(dict.fromkeys(name.removeprefix("test_") for name in (*expected, *also)))


def grade_where_caught(folder: str, lab: str, expected: dict, also=(),
                       max_ranks: int | None = None) -> dict[str, str | None]:
    """``grade_in_process`` of ``tests/grading/wrong/FOLDER`` on the checks it must fail
    (``checks_caught_by(expected, also)``), under a rank cap of ``max_ranks`` (None: none).

    The lab's other checks are left out: today a full grading of FOLDER fails exactly the
    checks of ``expected``, so the others pass, and grading them costs time (an overlap run is
    a model trained on two ranks) for no catch. With ``$WORKBOOK_WRONG_LABS_ALL_CHECKS=1`` every
    check runs, with no rank cap: the same assertions then prove that the selection hides no
    catch (``docs/test-suite.md``, "Each lab's budget")."""
    if all_checks():
        return grade_in_process(folder, lab)
    return grade_in_process(folder, lab, checks_caught_by(expected, also), max_ranks=max_ranks)


def changed_definitions(folder: str, lab: str) -> set[str]:
    """The top-level functions and classes of ``tests/grading/wrong/FOLDER/LAB.py`` whose code
    differs from ``solutions/LAB.py``'s (docstrings aside), or that only one of them has.

    A wrong lab that is the solution but for one pure function nothing else calls (a prediction)
    can fail only that function's check: the rest of it is the reference, which the test
    command grades in full. Such a lab is graded on that check alone, once this says so."""
    import ast

    def code(node) -> str:
        for inner in ast.walk(node):                 # docstrings left out
            body = getattr(inner, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                    isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                inner.body = body[1:] or [ast.Pass()]
        return ast.dump(node)

    def definitions(path: Path) -> dict[str, str]:
        return {node.name: code(node) for node in ast.parse(path.read_text()).body
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    wrong = definitions(WRONG / folder / f"{lab}.py")
    right = definitions(ROOT / "solutions" / f"{lab}.py")
    return {name for name in wrong.keys() | right.keys() if wrong.get(name) != right.get(name)}


def grade_one_mistake(folder: str, lab: str, function: str) -> dict[str, str | None]:
    """``grade_in_process`` of a wrong lab that is the solution but for ``function`` (checked
    first, ``changed_definitions``), on that function's checks only."""
    changed = changed_definitions(folder, lab)
    assert changed == {function}, (f"{folder} must be solutions/{lab}.py with only {function} "
                                   f"changed, for its other checks to be left out; it differs in "
                                   f"{sorted(changed)}")
    from workbook.grading.points import graded_tests
    tests = GRADING / f"test_{lab}.py"
    only = [name[len("test_"):] for name, graded in graded_tests(tests.read_text(), str(tests)).items()
            if function in graded.tasks]
    assert only, f"no check of {lab} grades {function}"
    return grade_in_process(folder, lab, only)


def assert_caught(folder: str, outcome: dict, expected: dict, never=()) -> None:
    """Exactly the tests of ``expected`` failed, each message holding its words (and not
    "not implemented yet"); no first line of a message holds a word of ``never``."""
    assert outcome, "no grading test ran"
    failed = {name for name, message in outcome.items() if message is not None}
    surprises = "".join(f"\n{name} failed unexpectedly:\n{outcome[name][:1500]}"
                        for name in sorted(failed - set(expected)))
    assert failed == set(expected), (
        f"{folder}: expected exactly {sorted(expected)} to fail, got {sorted(failed)}{surprises}")
    for name, words in expected.items():
        message = outcome[name]
        first = message.split("\n", 1)[0]
        assert "not implemented yet" not in message
        for word in words:
            assert word in message, f"{folder}: {name}'s message lacks {word!r}:\n{message[:1500]}"
        for word in never:
            assert word not in first, f"{folder}: {name}'s message says {word!r}:\n{first[:500]}"
