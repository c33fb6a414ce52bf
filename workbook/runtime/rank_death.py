"""Why a rank died: the signal, the learner's line, and the likely cause, in one paragraph.

A rank process that dies (rather than raising) takes its Python traceback with it: the pipe to
the launcher closes and all that is left is an exit code such as -11. Two things keep the
evidence:

* every rank enables ``faulthandler`` into a file of its own (``fault_file``): on SIGSEGV,
  SIGABRT, SIGBUS, SIGFPE or SIGILL, Python writes the stack of every thread there before the
  process goes;
* every rank's standard error goes to a file of its own (``stderr_file``), relayed to the
  launcher's after each run, so a C++ ``terminate called after throwing ...`` from gloo is read
  here instead of landing in the middle of the report.

``explain_death`` turns those files, the exit code and the flight recorder's last entries into
the verdict's message. It knows the two causes learners meet most:

* **a freed buffer used** (SIGSEGV, SIGBUS): ZeRO-3 frees a layer's flat parameter buffer
  (``untyped_storage().resize_(0)``) after use; a view of it used before the buffer is gathered
  again reads freed memory;
* **a collective mismatch** (SIGABRT with gloo's message): one rank called a collective its
  peers did not (or with another size); gloo aborts the process. The flight recorder's entries
  give the same "the ranks disagree" report a hang gives.
"""
from __future__ import annotations

import re
import signal
from pathlib import Path

from workbook.runtime.flight import in_code_under_test

_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')
MISMATCH_WORDS = ("mismatch", "op.preamble", "EnforceNotMet", "Received op with")
FREED_BUFFER = ("Likely cause: a tensor whose memory was freed was used. In ZeRO-3, a layer's "
                "flat parameter buffer is freed after use (its storage resized to 0); using the "
                "layer's parameters before the buffer is gathered again reads freed memory. Mark "
                "a freed layer stale and gather it before its next use.")
MISMATCH = ("Likely cause: the ranks called different collectives (or the same one with other "
            "sizes), and gloo aborted the process.")


def fault_file(folder: Path, rank: int) -> Path:
    return Path(folder) / f"rank{rank}.faults.txt"


def stderr_file(folder: Path, rank: int) -> Path:
    return Path(folder) / f"rank{rank}.stderr.txt"


def signal_name(exit_code: int | None) -> str | None:
    """``SIGSEGV`` for exit code -11 (a process killed by a signal), else None."""
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def learner_frame(fault_text: str) -> str | None:
    """``labs/dp_overlap.py:212, in forward``: the innermost frame of the crashing thread in
    the code under test (faulthandler lists the most recent call first): a file that is
    neither Python's nor an installed package's, nor this package's, nor the grader's."""
    for thread in _threads(fault_text):
        for path, line, fn in _FRAME.findall(thread):
            if in_code_under_test(path):
                p = Path(path)
                return f"{p.parent.name}/{p.name}:{line}, in {fn}"
    return None


def _threads(fault_text: str) -> list[str]:
    """The dumped threads' stacks, the crashing thread's first (gloo aborts in a thread of its
    own, with no Python frames: then the main thread's stack is what the rank was running)."""
    parts = re.split(r"\n(?=(?:Current thread|Thread) 0x)", fault_text)
    stacks = [p for p in parts if p.startswith(("Current thread", "Thread"))]
    return sorted(stacks, key=lambda p: not p.startswith("Current thread")) or [fault_text]


def explain_death(rank: int, exit_code: int | None, fault_text: str, stderr_text: str,
                  slots: list[dict] | None) -> str:
    """The message for a rank that died: what killed it, where in the learner's code, why."""
    sig = signal_name(exit_code)
    if sig:
        what = f"rank {rank} was killed by {sig}"
    elif exit_code is None:
        what = f"rank {rank} died (its process ended without reporting)"
    else:
        what = f"rank {rank} exited with status {exit_code} in the middle of the run"
    lines = [f"{what}."]
    frame = learner_frame(fault_text)
    stack = own_frames(fault_text)
    last = (slots[rank] if slots and rank < len(slots) else {}).get("at")
    if frame:
        lines.append(f"It was running your code at {frame}.")
    elif last:
        lines.append(f"It died outside your code (its stack is below); the last line of yours "
                     f"that communicated was {last}.")
    elif stack:
        lines.append("It died outside your code (its stack is below).")
    mismatch = any(w in stderr_text for w in MISMATCH_WORDS)
    if mismatch:
        lines.append(MISMATCH)
        if slots:
            from workbook.runtime.flight import hang_report
            lines.append(hang_report(slots, 0, headline="What each rank was doing when it happened."))
    elif sig in ("SIGSEGV", "SIGBUS"):
        lines.append(FREED_BUFFER)
    elif sig == "SIGKILL":
        lines.append("Likely cause: the machine ran out of memory (the kernel's OOM killer sends "
                     "SIGKILL), or something outside the course stopped it.")
    said = _last_lines(stderr_text, 4)
    if said:
        lines.append("Its last words on standard error:\n" + _indent(said) + "\n(end of its output).")
    if stack and not frame:
        lines.append("Its Python stack, most recent call first:\n" + _indent(stack))
    return "\n".join(lines)


def own_frames(fault_text: str) -> str:
    """The crashing thread's frames above the rank's own loop (``_rank_main``) and outside the
    standard library's ``multiprocessing``: the code the rank was running."""
    stacks = [t for t in _threads(fault_text) if _FRAME.search(t)]
    kept = []
    for line in (stacks[0] if stacks else "").splitlines():
        m = _FRAME.search(line)
        if not m:
            continue
        if m.group(3) in ("_rank_main", "_in_impl") or "multiprocessing" in m.group(1) \
                or "/workbook/grading/" in m.group(1):
            break
        kept.append(f"{_short(m.group(1))}:{m.group(2)}, in {m.group(3)}")
    return "\n".join(kept[:10])


def _short(path: str) -> str:
    """``torch/autograd/graph.py`` for an installed package's file, ``workbook/...`` for this
    package's, the check's code for a function sent to the rank by value."""
    path = path.replace("\\", "/")
    if path == "<dynamic-code>":
        return "(the check's code)"
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    if "/workbook/" in path:
        return "workbook/" + path.rsplit("/workbook/", 1)[1]
    return path


def _last_lines(text: str, n: int) -> str:
    kept = [ln.rstrip() for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(kept[-n:])


def _indent(text: str) -> str:
    return "\n".join("    " + ln for ln in text.splitlines())


def read_new(path: Path, offset: int) -> tuple[str, int]:
    """What ``path`` gained since ``offset``, and the new offset (missing file: nothing)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return "", offset
    return data.decode(errors="replace"), offset + len(data)
