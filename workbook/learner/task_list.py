"""A lab's task list as the learner's copy has it: from ``labs/hints.json`` at the lab's level.

``workbook assign`` writes ``hints.json`` beside the labs: for every lab and level, the numbered
tasks (title, the functions/classes each stands for, points) and their three hint rungs. The lab
file's header names its level. Nothing here reads ``solutions/``.
"""
from __future__ import annotations

import json
from pathlib import Path

from workbook.grading.labs import LABS
from workbook.grading.markup import level_of

HINTS_FILE = "hints.json"


def lab_level(folder: Path, lab: str) -> str:
    """The level ``folder/lab.py`` was generated at (``standard`` for an older or edited header)."""
    path = folder / f"{lab}.py"
    return (level_of(path.read_text()) if path.is_file() else None) or "standard"


def lab_tasks(folder: Path, lab: str) -> list[dict]:
    """The task list of ``lab`` at its level: ``[{title, names, points, rungs}]``."""
    if lab not in LABS:
        raise ValueError(f"unknown lab {lab!r}; the labs are {', '.join(LABS)}")
    path = folder / HINTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {path}: the hints come with the labs (`workbook assign` "
                                f"writes them)")
    table = json.loads(path.read_text())
    levels = table.get(lab)
    if not levels:
        raise ValueError(f"{path} has no hints for {lab}; regenerate the labs with "
                         f"`workbook assign`")
    # a student release keeps its own level's tasks only (``workbook release``)
    return levels.get(lab_level(folder, lab)) or levels.get("standard") or \
        next(iter(levels.values()))


def find_task(tasks: list[dict], lab: str, task: str) -> int:
    """The index of TASK (a number from 1, or a name in the task list); ValueError naming the
    valid ones otherwise."""
    if task.isdigit() and 1 <= int(task) <= len(tasks):
        return int(task) - 1
    for k, t in enumerate(tasks):
        if task == t["title"] or task in t["names"] or task.split(".")[0] in t["names"]:
            return k
    valid = "; ".join(f"{k} {t['title']}" for k, t in enumerate(tasks, 1))
    raise ValueError(f"{lab} has no task {task!r}: give a number from 1 to {len(tasks)} or a "
                     f"name ({valid})")
