"""One-command set-up: ``python3 -m workbook.bootstrap demo`` and ``python3 -m workbook.bootstrap test``.

Standard library only, because it runs before anything is installed. Each command is idempotent:

1. creates ``.venv`` beside the package (or reuses it);
2. installs torch if the venv lacks it: a CPU build where no NVIDIA GPU is present (never the
   multi-GB CUDA build on a CPU machine), the default CUDA build where one is;
3. installs this package with its extras (``pip install -e ".[dev,notebooks]"``) when
   ``pyproject.toml`` changed since the last install;
4. ``test`` only: installs Debian's Chromium and its driver for the browser tests when it is missing and this
   user may use apt-get (the tests that need it skip where it cannot be had);
5. runs the demo, or the whole test sequence (what ``.ci/run`` runs), which ends with one line:
   ``[workbook setup] all N stages passed`` or ``[workbook setup] FAILED: stage "..."``.

Set-up prints one ``[workbook setup]`` line per step it takes; pip's own output is captured and
shown only when pip fails.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STAMP = VENV / ".workbook-installed"
CPU_TORCH = "torch==2.13.0+cpu"                    # a CPU build; on this course's machines it is on disk
CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # where CPU builds live for everyone else


def say(msg: str) -> None:
    print(f"[workbook setup] {msg}", flush=True)


def sh(*cmd, check=True, quiet=False, **kw) -> int:
    out = subprocess.DEVNULL if quiet else None
    code = subprocess.call([str(c) for c in cmd], stdout=out, **kw)
    if check and code:
        raise SystemExit(f"[workbook setup] failed ({code}): {' '.join(map(str, cmd))}")
    return code


def pip(*args, check=True, show=True) -> tuple[int, str]:
    """``PY -m pip ARGS`` with its output captured: nothing reaches the console unless pip fails.

    pip is noisy even with ``-q`` (e.g. a "Location ... is ignored" warning per configured
    find-links folder), so a set-up step prints its one ``[workbook setup]`` line and pip's own
    output is shown only when it fails (``show``), then the set-up stops (``check``). Returns
    pip's exit code and its output.
    """
    cmd = [str(PY), "-m", "pip", *map(str, args)]
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", env=env)
    if proc.returncode and show:
        print(proc.stdout, end="" if proc.stdout.endswith("\n") else "\n", file=sys.stderr,
              flush=True)
    if proc.returncode and check:
        raise SystemExit(f"[workbook setup] failed ({proc.returncode}): {' '.join(cmd)}")
    return proc.returncode, proc.stdout


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def has_nvidia_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.call([smi, "-L"], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL) == 0


def ensure_venv() -> None:
    if not PY.exists():
        say(f"creating {VENV}")
        sh(sys.executable, "-m", "venv", VENV)
        code, out = pip("install", "-q", "--upgrade", "pip", check=False, show=False)
        if code:                                    # offline, say: the venv's own pip will do
            say(f"could not upgrade pip, going on with the venv's own ({_last_line(out)})")


def ensure_torch() -> None:
    if sh(PY, "-c", "import torch", check=False, quiet=True, stderr=subprocess.DEVNULL) == 0:
        return
    if has_nvidia_gpu():
        say("installing torch (CUDA build: an NVIDIA GPU is present; this takes a few minutes)")
        pip("install", "-q", "torch>=2.4")
        return
    say("installing torch (CPU build: no NVIDIA GPU here)")
    code, first = pip("install", "-q", CPU_TORCH, check=False, show=False)
    if code == 0:
        return
    code, second = pip("install", "-q", "torch", "--index-url", CPU_INDEX, check=False, show=False)
    if code:                                        # both failed: now pip's output matters
        print(first, second, sep="\n", file=sys.stderr, flush=True)
        raise SystemExit(f"[workbook setup] failed ({code}): could not install torch "
                         f"({CPU_TORCH}, nor torch from {CPU_INDEX})")


def ensure_package() -> None:
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == digest:
        return
    say("installing the workbook and its extras")
    pip("install", "-q", "-e", f"{ROOT}[dev,notebooks]")
    STAMP.write_text(digest)


def ensure_chromium() -> None:
    if (shutil.which("chromium") or shutil.which("chromium-browser")) and shutil.which("chromedriver"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        say("no Chromium: the browser tests will be skipped (install Debian's chromium to run them)")
        return
    say("installing Chromium for the browser tests (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if sh("apt-get", "update", "-qq", check=False, quiet=True, env=env) or \
            sh("apt-get", "install", "-y", "-qq", "chromium", "chromium-driver", check=False,
               quiet=True, env=env):
        say("could not install Chromium: the browser tests will be skipped")


STUB_TITLE = "grading the generated stubs"
STUB_NOTE = ("every test is expected to fail with 'not implemented yet'; this stage passes when "
             "they all do, score 0 and nothing hangs")


def stages() -> list[tuple[str, str, list]]:
    """The test command's stages: (title, what to expect, command), run from the repo root."""
    wb = [PY, "-m", "workbook.cli"]
    return [
        ("labs/ generated from solutions/", "", [*wb, "assign", "--check"]),
        # the layout: families side by side, layers below (pyproject.toml, tool.importlinter)
        ("import contracts", "", [VENV / "bin" / "lint-imports"]),
        # tests/gpu: the GPU suite; without CUDA every test skips (a second, no more)
        ("package tests", "", [PY, "-m", "pytest", "-q", "tests/package", "tests/gpu",
                               "-p", "no:cacheprovider", "--durations=8"]),
        ("grading solutions/", "must be full marks", [*wb, "grade", "--impl", "solutions", "--strict"]),
        (STUB_TITLE, STUB_NOTE, [PY, "-m", "workbook.instructor.selftest", "stubs",
                                 "--level", "standard", "--level", "challenge"]),
    ]


def summary(titles: list[str], failed: list[str]) -> str:
    """The one closing line: every stage passed, or which ones failed (first named first)."""
    if not failed:
        return f"all {len(titles)} stages passed"
    line = f'FAILED: stage "{failed[0]}"'
    if failed[1:]:
        line += " (and " + ", ".join(f'"{t}"' for t in failed[1:]) + ")"
    return line


def run_tests() -> int:
    """The whole check: generated labs in sync, package tests, full marks, stubs score zero.

    Every stage runs even when an earlier one failed; the last line says how it all went, and
    the exit code is 1 when any stage failed, 0 when all passed.
    """
    steps = stages()
    failed = []
    for title, note, cmd in steps:
        say(f"--- {title}: {note}" if note else f"--- {title}")
        t0 = time.time()
        code = sh(*cmd, check=False, cwd=ROOT)
        verdict = "ok" if code == 0 else f"FAILED ({code})"
        if title == STUB_TITLE and code == 0:
            verdict = "ok (every stub failed with 'not implemented yet', as expected)"
        say(f"--- {title}: {verdict} in {time.time() - t0:.0f} s")
        if code:
            failed.append(title)
    say(summary([t for t, _, _ in steps], failed))
    return 1 if failed else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("demo", "test", "install"):
        print("usage: python3 -m workbook.bootstrap demo|test|install", file=sys.stderr)
        return 2
    ensure_venv()
    ensure_torch()
    ensure_package()
    if argv[0] == "install":
        return 0
    if argv[0] == "demo":
        return sh(PY, "-m", "workbook.cli", "demo", *argv[1:], check=False, cwd=ROOT)
    ensure_chromium()
    return run_tests()


if __name__ == "__main__":
    sys.exit(main())
