"""Which processes are still running: the tests' check that a run left nothing behind."""
from __future__ import annotations

import os
import time
from pathlib import Path


def left_running(marker: str, where: str = "cmdline") -> list[str]:
    """The command lines of the processes (this one aside) whose command line holds ``marker``,
    or, with ``where="environ"``, whose environment does (a rank of a fork server inherits its
    run's environment, not its command line)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if marker.encode() in (proc / where).read_bytes():
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace").strip()[:200])
        except OSError:                                     # gone, or not ours to read
            pass
    return found


def gone_within(seconds: float, marker: str, where: str = "cmdline") -> list[str]:
    """``left_running`` once it is empty or ``seconds`` have passed (a process may take a moment
    to be reaped after its parent exits: a bound, not a pause)."""
    deadline = time.monotonic() + seconds
    while (left := left_running(marker, where)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left
