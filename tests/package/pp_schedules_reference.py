"""Lab ``pp_schedules``'s reference schedules for the package's tests, loaded from their file.

The lab is not registered yet (no ``LABS`` entry, grader or ``labs/`` file), so its reference
is read from its path: ``solutions/pp_schedules.py``, or ``solutions/pp_schedules.py.draft``
while it is staged under a name ``workbook assign`` does not read.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load(name: str, *candidates: str):
    """A lab file as a module, from the first of ``candidates`` (repo paths) that exists."""
    path = next(ROOT / c for c in candidates if (ROOT / c).exists())
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    loader.exec_module(module)
    return module


SOL = load("pp_schedules_reference_lab", "solutions/pp_schedules.py",
           "solutions/pp_schedules.py.draft")
LAB10 = load("pp_overlap_reference_lab", "solutions/pp_overlap.py")


def ranks(schedule, p: int, v: int, m: int) -> list[list[tuple]]:
    """Every rank's actions under ``schedule`` (one of ``SOL.SCHEDULES``' functions)."""
    return SOL.all_ranks(schedule, p, v, m)
