"""A course command run as a child process: its environment, and stopping it with every rank.

``workbook grade``, a class's grading and ``workbook watch`` each run a ``workbook`` command in a
child process. The child must import this checkout (``course_env``), and when it is stopped --
Ctrl-C, a time limit, the next save -- nothing it started may stay behind: it runs in its own
session (``start_new_session=True``), so one signal to its process group reaches the ranks too
(``stop_group``).
"""
from __future__ import annotations

import os
import signal
import subprocess


def course_env(root, **extra: str) -> dict[str, str]:
    """This process's environment with the course folder ``root`` first on ``PYTHONPATH``."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), *paths]), **extra)


def stop_group(proc: subprocess.Popen, first: int = signal.SIGTERM, grace_s: float = 5.0) -> None:
    """Signal ``proc``'s process group with ``first``, then SIGKILL what is left after
    ``grace_s``. The group is signalled even when the child itself has ended: ranks it started
    may still be running in it."""
    for sig in (first, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
