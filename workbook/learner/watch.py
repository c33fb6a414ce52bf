"""``workbook watch LAB``: the self-check again each time the lab file is saved.

The loop (rustlings' ``watch``, on the course's own self-check): check once, then wait for the
file to change (``watchfiles``, which uses the operating system's file events, not polling);
on each save clear the screen and check again. A file that does not compile shows its error
(line and message) and the loop goes on waiting; it never starts ranks on it. Each self-check
runs in its own process group, so Ctrl-C, or a check that hangs, leaves no rank behind: the
group is interrupted, then killed. Ctrl-C reaches the loop even where the shell started it with
SIGINT ignored (``cmd &`` in a script, or CI): Python keeps an inherited "ignore", so the loop
puts the default handler back before it waits.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from workbook.grading.labs import LABS, impl_dir, repo_root
from workbook.runtime.child_process import course_env, stop_group

CLEAR = "\x1b[2J\x1b[H"
GRACE_S = 5.0                  # how long an interrupted self-check may take to stop its ranks


def compile_error(path: Path) -> str | None:
    """The one-line syntax error of ``path`` (None when it compiles)."""
    try:
        compile(path.read_text(), str(path), "exec")
    except SyntaxError as exc:
        return f"{path.name}:{exc.lineno}: {exc.msg} (fix it and save: the check runs again)"
    except (OSError, ValueError) as exc:
        return f"{path.name}: cannot read it ({exc})"
    return None


def check_once(lab: str, impl: str, extra: list[str], write) -> int:
    """One self-check in its own process group, its output passed through; its exit status."""
    cmd = [sys.executable, "-m", "workbook.cli", "run", lab, "--impl", impl, *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", env=course_env(repo_root(), PYTHONUNBUFFERED="1"),
                            start_new_session=True)
    try:
        for line in proc.stdout:
            write(line.rstrip("\n"))
        return proc.wait()
    finally:
        stop_group(proc, signal.SIGINT, GRACE_S)   # interrupt first: the self-check ends its ranks


def watch(lab: str, *, impl: str = "labs", extra: list[str] | None = None, write=print,
          clear: bool | None = None, stop_after: int | None = None) -> int:
    """Self-check ``lab`` now and after every save, until Ctrl-C (or ``stop_after`` checks)."""
    import watchfiles
    if lab not in LABS:
        raise ValueError(f"unknown lab {lab!r}; the labs are {', '.join(LABS)}")
    folder = impl_dir(impl)
    path = folder / f"{lab}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no lab file {path} (make the labs with `workbook assign`)")
    clear = sys.stdout.isatty() if clear is None else clear
    impl_arg = impl if impl in ("labs", "solutions") else str(folder)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:     # inherited: Ctrl-C must still leave
        signal.signal(signal.SIGINT, signal.default_int_handler)
    checks = 0
    try:
        while True:
            if clear:
                write(CLEAR)
            stamp = time.strftime("%H:%M:%S")
            write(f"[{stamp}] workbook watch {lab}: checking {path.name}")
            error = compile_error(path)
            if error:
                write(f"  not checked: {error}")
                write(f"watch: {lab} does not compile; waiting for a save")
            else:
                code = check_once(lab, impl_arg, extra or [], write)
                write(f"watch: {lab} checked, exit {code}; waiting for a save (Ctrl-C leaves)")
            checks += 1
            if stop_after is not None and checks >= stop_after:
                return 0
            saved = lambda _change, changed: Path(changed).name == path.name   # noqa: E731
            for _ in watchfiles.watch(folder, watch_filter=saved, debounce=400, step=100,
                                      recursive=False, raise_interrupt=True):
                if path.is_file():          # an editor that replaces the file: wait for it
                    break
    except KeyboardInterrupt:
        write(f"watch: left {lab}, no rank left running")
        return 0
