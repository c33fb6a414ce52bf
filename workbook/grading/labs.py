"""Finding and importing the implementation under test: ``labs/``, ``solutions/`` or a folder.

The choice travels in the environment variable ``WORKBOOK_IMPL`` so that every rank process,
started by the launcher, imports the same files the grader asked for. When the learner's
``labs/`` is graded, ``solutions/`` cannot be imported (a learner's file that tries gets an
ImportError), so the reference can never leak into the work being graded.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

from workbook.runtime.messages import first_line

ENV_IMPL = "WORKBOOK_IMPL"
ENV_ROOT = "WORKBOOK_ROOT"
#: The file a student release has at its top (``workbook release``): what it holds, at which
#: level; a release has no ``solutions/``.
RELEASE_MANIFEST = "release.json"
NO_SOLUTIONS_IN_RELEASE = ("this course is a student release: the reference solutions/ stay with "
                           "the instructor; use labs (your files) or a folder of lab files")
LABS = ["collectives", "ring_allreduce", "async_overlap", "tp", "sp", "domino", "overlap_math",
        "tp_overlap", "dp_overlap", "pp_overlap", "cp_ring", "pp_schedules", "ep_overlap",
        "capstone"]
#: The family folder of ``workbook/`` that holds each lab's given pieces, bench, report and helpers.
FAMILY = {"collectives": "communication", "ring_allreduce": "communication",
          "async_overlap": "communication", "overlap_math": "communication",
          "tp": "tensor_parallel", "sp": "tensor_parallel", "domino": "tensor_parallel",
          "tp_overlap": "tensor_parallel", "dp_overlap": "data_parallel",
          "pp_overlap": "pipeline_parallel", "cp_ring": "context_parallel",
          "pp_schedules": "pipeline_parallel", "ep_overlap": "expert_parallel",
          "capstone": "capstone"}


def lab_module(lab: str, role: str) -> str:
    """The dotted name of lab ``lab``'s ``role`` module (``report``, ``bench``, ``lesson``):
    ``workbook.<family>.<lab>_<role>``; a lab's name finds all its files."""
    return f"workbook.{FAMILY[lab]}.{lab}_{role}"


def repo_root() -> Path:
    """The course folder: $WORKBOOK_ROOT, else the checkout or student release this package
    lives in, else cwd."""
    if os.environ.get(ENV_ROOT):
        return Path(os.environ[ENV_ROOT]).resolve()
    here = Path(__file__).resolve().parents[2]
    is_course = (here / "solutions").is_dir() or (here / RELEASE_MANIFEST).is_file()
    return here if is_course else Path.cwd()


def is_release(root: Path | None = None) -> bool:
    """Is the course folder a student release (``workbook release``): no answers in it?"""
    return ((root or repo_root()) / RELEASE_MANIFEST).is_file()


def impl_dir(impl: str | None = None) -> Path:
    """``labs`` (the default), ``solutions``, or a path to a folder of lab files. ``solutions``
    in a student release (which has none) is a ``ValueError`` in one line."""
    impl = impl or os.environ.get(ENV_IMPL, "labs")
    if impl == "solutions" and is_release() and not (repo_root() / "solutions").is_dir():
        raise ValueError(NO_SOLUTIONS_IN_RELEASE)
    if impl in ("labs", "solutions"):
        return repo_root() / impl
    path = Path(impl).resolve()
    if not path.is_dir():
        raise ValueError(f"--impl must be labs, solutions or a folder of lab files; {impl!r} is none")
    return path


def use_impl(impl: str) -> Path:
    """Grade or self-check ``impl`` from now on, in this process and the ranks it starts: set
    ``WORKBOOK_IMPL``, and block ``solutions/`` unless it is the implementation under test."""
    folder = impl_dir(impl)                       # fails early with a clear message
    os.environ[ENV_IMPL] = impl if impl in ("labs", "solutions") else str(folder)
    if folder.name != "solutions":
        block_solutions()
    return folder


class _BlockSolutions(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "solutions" or name.startswith("solutions."):
            raise ImportError("solutions/ is not importable while labs/ is being graded")
        return None


def block_solutions() -> None:
    if not any(isinstance(f, _BlockSolutions) for f in sys.meta_path):
        sys.meta_path.insert(0, _BlockSolutions())


class LabDoesNotImport(ImportError):
    """The lab file under test fails to import (a syntax error, a bad import, a top-level
    error): no check can run it. The message names the file, the line and the error."""

    def __reduce__(self):                   # travels back from a rank as itself
        return (type(self), self.args)


def import_problem(path: Path, exc: BaseException) -> str:
    """``not run: the lab does not import (labs/tp.py, line 12: SyntaxError: ...).``"""
    import traceback
    where = f"{path.parent.name}/{path.name}"
    if isinstance(exc, SyntaxError) and exc.lineno:
        what = f"line {exc.lineno}: {type(exc).__name__}: {exc.msg}"
    else:
        lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__)
                 if Path(f.filename) == path]
        first = first_line(str(exc))
        what = (f"line {lines[-1]}: " if lines else "") + f"{type(exc).__name__}: {first}".rstrip(": ")
    return f"not run: the lab does not import ({where}, {what.rstrip('.:')})."


def load_lab(name: str, impl: str | None = None):
    """Import lab ``name`` from the implementation under test (cached per file)."""
    folder = impl_dir(impl)
    if folder.name != "solutions":
        block_solutions()
    path = folder / f"{name}.py"
    if not path.is_file():
        known = ", ".join(LABS)
        raise FileNotFoundError(f"no lab file {path}: the labs are {known}")
    module_name = f"workbook_impl_{abs(hash(str(folder))) % 10**8}_{name}"
    module = sys.modules.get(module_name)
    if module is not None and getattr(module, "__workbook_mtime__", None) == path.stat().st_mtime:
        return module
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    module.__workbook_mtime__ = path.stat().st_mtime
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:                # noqa: BLE001 - a half-run module is never kept
        sys.modules.pop(module_name, None)
        raise LabDoesNotImport(import_problem(path, exc)) from exc
    import cloudpickle                      # its functions travel to rank processes by value
    cloudpickle.register_pickle_by_value(module)
    return module


def run_reference_in(namespace: dict, name: str) -> None:
    """Execute ``solutions/NAME.py`` inside ``namespace`` (a module's ``globals()``).

    For the deliberately wrong labs in ``tests/grading/wrong/``: such a file starts from the
    reference and then redefines only the part it gets wrong, so the mistake is all it holds. The
    reference's functions look names up in ``namespace``, so they call the wrong part too. The
    file is executed, not imported, so the solutions blocker does not apply."""
    path = repo_root() / "solutions" / f"{name}.py"
    doc = namespace.get("__doc__")
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    namespace["__doc__"] = doc
