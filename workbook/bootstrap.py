"""One-command set-up: ``python3 -m workbook.bootstrap demo`` and ``python3 -m workbook.bootstrap test``.

Standard library only, because it runs before anything is installed. Each command is idempotent:

1. creates ``.venv`` beside the package (or reuses it);
2. installs torch if the venv lacks it: a CPU build where no NVIDIA GPU is present (never the
   multi-GB CUDA build on a CPU machine), the default CUDA build where one is;
3. installs this package with its extras (``pip install -e ".[dev,notebooks]"``) when
   ``pyproject.toml`` changed since the last install;
4. ``test`` only: installs Debian's Chromium and its driver for the browser tests when it is missing and this
   user may use apt-get (the tests that need it skip where it cannot be had);
5. runs the demo, or the whole test sequence (what ``.ci/run`` runs).
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


def has_nvidia_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.call([smi, "-L"], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL) == 0


def ensure_venv() -> None:
    if not PY.exists():
        say(f"creating {VENV}")
        sh(sys.executable, "-m", "venv", VENV)
        sh(PY, "-m", "pip", "install", "-q", "--upgrade", "pip", check=False)


def ensure_torch() -> None:
    if sh(PY, "-c", "import torch", check=False, quiet=True, stderr=subprocess.DEVNULL) == 0:
        return
    pip = [PY, "-m", "pip", "install", "-q"]
    if has_nvidia_gpu():
        say("installing torch (CUDA build: an NVIDIA GPU is present)")
        sh(*pip, "torch>=2.4")
        return
    say("installing torch (CPU build: no NVIDIA GPU here)")
    if sh(*pip, CPU_TORCH, check=False) != 0:
        sh(*pip, "torch", "--index-url", CPU_INDEX)


def ensure_package() -> None:
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == digest:
        return
    say("installing the workbook and its extras")
    sh(PY, "-m", "pip", "install", "-q", "-e", f"{ROOT}[dev,notebooks]")
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


def run_tests() -> int:
    """The whole check: generated labs in sync, package tests, full marks, stubs score zero."""
    wb = [PY, "-m", "workbook.cli"]
    steps = [
        ("labs/ generated from solutions/", [*wb, "assign", "--check"]),
        ("package tests", [PY, "-m", "pytest", "-q", "tests/package", "-p", "no:cacheprovider",
                           "--durations=8"]),
        ("grading solutions/ (must be full marks)", [*wb, "grade", "--impl", "solutions", "--strict"]),
        ("grading the generated stubs (must score 0, no hang)",
         [PY, "-m", "workbook.selftest", "stubs"]),
    ]
    failed = []
    for title, cmd in steps:
        say(f"--- {title}")
        t0 = time.time()
        code = sh(*cmd, check=False, cwd=ROOT)
        say(f"--- {title}: {'ok' if code == 0 else f'FAILED ({code})'} in {time.time() - t0:.0f} s")
        if code:
            failed.append(title)
    for title in failed:
        say(f"failed: {title}")
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
