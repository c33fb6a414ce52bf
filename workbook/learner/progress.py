"""Where a learner stands: ``workbook progress``, and the small file that remembers it.

Beside the labs, ``.workbook-progress.json`` keeps, per lab, the last self-check's score and the
checks it failed (written by every ``workbook run`` / ``workbook watch`` on that folder) and the
hint rungs opened per task (written by ``workbook hint``). ``workbook progress`` prints one line
per lab: its last score, the next task (the first in the task list that a failed check names,
through the tests' ``@pytest.mark.tasks``) and the hints opened. Losing the file loses nothing
but this memory; it is the learner's, so it is never committed (``.gitignore``).
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from workbook.grading.labs import LABS, impl_dir, repo_root
from workbook.grading.markup import AssignError
from workbook.grading.points import graded_tests
from workbook.learner.task_list import lab_tasks

PROGRESS_FILE = ".workbook-progress.json"


class Progress:
    """The progress file of one folder of labs (read at once, written on every change)."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / PROGRESS_FILE
        try:
            self.data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.data = {}
        self.data.setdefault("hints", {})
        self.data.setdefault("checks", {})

    def _save(self) -> None:
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}")
        try:
            tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, self.path)
        except OSError:
            pass                             # a read-only folder: progress is only a memory

    def hints_opened(self, lab: str, title: str) -> int:
        return int(self.data["hints"].get(lab, {}).get(title, 0))

    def open_hint(self, lab: str, title: str, rung: int) -> None:
        opened = self.data["hints"].setdefault(lab, {})
        opened[title] = max(opened.get(title, 0), rung)
        self._save()

    def next_task(self, lab: str) -> str | None:
        """The title of the first unfinished task the last self-check found (None: not known)."""
        return self.data["checks"].get(lab, {}).get("next_task")

    def record_check(self, lab: str, score: float, total: float, failed: list[str],
                     next_task: str | None) -> None:
        self.data["checks"][lab] = {"score": score, "total": total, "failed": failed,
                                    "next_task": next_task,
                                    "when": time.strftime("%Y-%m-%d %H:%M")}
        self._save()


def _failed_tasks(lab: str, failed: list[str]) -> set[str]:
    """The lab functions/classes the failed checks grade (from the tests' marks)."""
    path = repo_root() / "tests" / "grading" / f"test_{lab}.py"
    try:
        graded = graded_tests(path.read_text(), str(path))
    except (OSError, SyntaxError, AssignError):
        return set()
    names = set()
    for check in failed:
        g = graded.get("test_" + check.split("[", 1)[0])
        if g is not None:
            names |= {t.split(".")[0] for t in g.tasks}
    return names


def record_self_check(folder: Path, lab: str, verdicts) -> None:
    """Remember a self-check of ``folder/lab.py``: its score and its next unfinished task."""
    counted = [v for v in verdicts if v.status != "skipped"]
    failed = [v.name for v in counted if v.status != "passed"]
    next_task = None
    if failed:
        names = _failed_tasks(lab, failed) | {
            m[1] for v in counted if v.status != "passed"
            for m in [re.match(rf"not implemented yet: {lab}\.(\w+)", v.message or "")] if m}
        try:
            tasks = lab_tasks(folder, lab)
        except (OSError, ValueError):
            tasks = []
        next_task = next((t["title"] for t in tasks if names & set(t["names"])), None)
    Progress(folder).record_check(lab, sum(v.score for v in verdicts),
                                  sum(v.points for v in counted), failed, next_task)


def progress_lines(impl: str | None = None) -> list[str]:
    """``workbook progress``: one line per lab (score, next task, hints opened)."""
    folder = impl_dir(impl)
    progress = Progress(folder)
    lines = [f"progress of {folder}/ (self-check with `workbook run LAB`, hints with "
             f"`workbook hint LAB N`)"]
    width = max(len(lab) for lab in LABS)
    for lab in LABS:
        check = progress.data["checks"].get(lab)
        if check is None:
            state = "not checked yet"
        else:
            state = f"{check['score']:g} / {check['total']:g} points ({check['when']})"
        try:
            tasks = lab_tasks(folder, lab)
        except (OSError, ValueError):
            tasks = []
        titles = [t["title"] for t in tasks]
        nxt = check.get("next_task") if check else None
        if check and not check["failed"]:
            where = "every check passes"
        elif nxt in titles:
            where = f"next: task {titles.index(nxt) + 1}, {nxt}"
        elif tasks and not check:
            where = f"start with task 1, {titles[0]}"
        else:
            where = "next: see the self-check's failures"
        opened = progress.data["hints"].get(lab, {})
        hints = ("; hints opened: " + ", ".join(
            f"task {titles.index(t) + 1 if t in titles else '?'} ({n} of 3)"
            for t, n in sorted(opened.items(), key=lambda kv: titles.index(kv[0])
                               if kv[0] in titles else 99))) if opened else ""
        lines.append(f"  {lab:<{width}}  {state}; {where}{hints}")
    return lines
