"""Hints on request: ``workbook hint LAB [TASK]``, one rung at a time.

Each task has three rungs, written in ``solutions/`` beside its block and extracted by
``workbook assign`` into ``labs/hints.json``: (1) the idea and the lesson section that explains
it, (2) the steps in words, (3) near-code. A call shows the next rung the learner has not opened
for that task (after the third, the third again); ``--all`` shows every rung. What has been
opened is remembered beside the labs (``workbook.learner.progress``) and shown by
``workbook progress``. Nothing here reads ``solutions/``: hints work wherever the labs are.

TASK is the task's number in the lab file's task list (at the level the lab was made) or its
name (``BucketedDP``); without it, the next task the last self-check found unfinished.
"""
from __future__ import annotations

from workbook.grading.labs import impl_dir
from workbook.learner.progress import Progress
from workbook.learner.task_list import find_task, lab_tasks

RUNG_NAMES = ("the idea", "the steps", "near-code")


def hint(lab: str, task: str | int | None = None, *, show_all: bool = False,
         impl: str | None = None) -> str:
    """The next hint rung of ``task`` (every rung with ``show_all``), as text to print; the
    rung is marked opened in the progress file."""
    folder = impl_dir(impl)
    tasks = lab_tasks(folder, lab)
    progress = Progress(folder)
    if task is None:
        title = progress.next_task(lab)
        k = next((i for i, t in enumerate(tasks) if t["title"] == title), 0)
    else:
        k = find_task(tasks, lab, str(task))
    entry = tasks[k]
    rungs = entry["rungs"]
    opened = progress.hints_opened(lab, entry["title"])
    show = range(3) if show_all else [min(opened, 2)]
    lines = [f"{lab}, task {k + 1}: {entry['title']}"]
    for r in show:
        text = rungs[r] if r < len(rungs) else []
        lines.append(f"  hint {r + 1} of 3, {RUNG_NAMES[r]}:")
        lines += [f"    {line}" for line in text] or ["    (no hint at this rung)"]
    progress.open_hint(lab, entry["title"], max(show) + 1)
    last = max(show) + 1
    if last < 3:
        lines.append(f"  (again for hint {last + 1}: workbook hint {lab} {k + 1})")
    else:
        lines.append("  (that was the last hint: the lesson section in hint 1 has the rest)")
    return "\n".join(lines)
