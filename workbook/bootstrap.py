"""One-command set-up: ``python3 -m workbook.bootstrap demo`` and ``python3 -m workbook.bootstrap test``.

Standard library only, because it runs before anything is installed. Each command is idempotent:

1. creates ``.venv`` beside the package (or reuses it);
2. installs torch if the venv lacks it: a CPU build where no NVIDIA GPU is present (never the
   multi-GB CUDA build on a CPU machine; by uv where it can be had, pip otherwise), the
   default CUDA build where one is;
3. installs this package with its extras (``pip install -e ".[dev,notebooks]"``, done by uv
   where it can be had, pip otherwise) when ``pyproject.toml`` changed since the last install;
4. ``test`` only: installs Debian's Chromium and its driver for the browser tests when it is missing and this
   user may use apt-get (the tests that need it skip where it cannot be had);
5. runs the demo, or the whole test sequence (what ``.ci/run`` runs), which ends with one line:
   ``[workbook setup] all N stages passed`` or ``[workbook setup] FAILED: stage "..."``. In a
   student release (``workbook release``: no solutions, no package tests) the test sequence is
   one stage, the learner's labs graded by the course's public tests (``release_stages``). The
   package tests run on two pytest-xdist workers and the grading stages beside them
   (``docs/test-suite.md`` says why, and what each stage's time is); each test's time is kept
   in ``runs/test-times/``.

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

from workbook.grading.labs import RELEASE_MANIFEST      # standard library only, like this module

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STAMP = VENV / ".workbook-installed"
CPU_TORCH = "torch==2.13.0+cpu"                    # a CPU build; on this course's machines it is on disk
CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # where CPU builds live for everyone else


def say(msg: str) -> None:
    print(f"[workbook setup] {msg}", flush=True)


def sh(*cmd, check=True, quiet=False, **kw) -> int:
    if quiet:
        kw["stdout"] = subprocess.DEVNULL
    code = subprocess.call([str(c) for c in cmd], **kw)
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
        # a pip older than 21.3 cannot install a pyproject-only package in editable mode (PEP
        # 660); a newer one is left as it is (upgrading it took 5 s and a download every time)
        code, out = pip("--version", check=False, show=False)
        version = tuple(int(x) for x in out.split()[1].split(".")[:2]) if code == 0 else (0, 0)
        if version < (21, 3):
            code, out = pip("install", "-q", "--upgrade", "pip", check=False, show=False)
            if code:                                # offline, say: the venv's own pip will do
                say(f"could not upgrade pip, going on with the venv's own ({_last_line(out)})")


def ensure_torch() -> None:
    if sh(PY, "-c", "import torch", check=False, quiet=True, stderr=subprocess.DEVNULL) == 0:
        return
    if has_nvidia_gpu():
        say("installing torch (CUDA build: an NVIDIA GPU is present; this takes a few minutes)")
        pip("install", "-q", "torch>=2.4")
        return
    say("installing torch (CPU build: no NVIDIA GPU here)")
    if uv_install(CPU_TORCH) is None:
        return
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
    if not _install_with_uv():
        pip("install", "-q", "-e", f"{ROOT}[dev,notebooks]")
    STAMP.write_text(digest)


def _install_with_uv() -> bool:
    """``pip install -e ".[dev,notebooks]"`` done by uv (``uv_install``); where uv cannot be had
    or fails, one line says so and returns False, and pip does the install as before. torch is
    already in the venv (``ensure_torch``) and satisfies the package's ``torch>=2.4``, so uv
    leaves it as it is."""
    failure = uv_install("-e", f"{ROOT}[dev,notebooks]")
    if failure is None:
        return True
    say(f"uv could not install the extras ({_last_line(failure)}); pip will")
    return False


def uv_install(*requirements: str) -> str | None:
    """``pip install REQUIREMENTS`` done by uv, from the indexes and wheel folders pip would use.

    uv installs the same packages and versions in about a third of pip's time: it unpacks and
    byte-compiles on every core, where pip unpacks one file at a time (the extras, some hundred
    packages: 54 s against 20 s here; torch: 33 CPU s in one process against 25 CPU s on two).
    uv does not read pip's configuration, so ``pip config list`` (files and ``PIP_*``
    variables) is passed on as uv's flags (``uv_flags_from_pip_config``): on this course's
    machines the CPU build of torch lies in a wheel folder that only pip's configuration names.
    uv is installed into the venv by pip (a 3 s wheel). Returns None when it installed them,
    else the output of what failed (pip installing uv, or uv), for the caller's one-line message.
    """
    code, out = pip("install", "-q", "uv", check=False, show=False)
    if code == 0:
        proc = subprocess.run([str(PY), "-m", "uv", "pip", "install", "-q", "--python", str(PY),
                               "--compile-bytecode", *uv_flags_from_pip_config(), *requirements],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace")
        code, out = proc.returncode, proc.stdout
    return out if code else None


#: pip's option -> uv's flag; pip's precedence: environment over site over user over global
_PIP_TO_UV = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
              "find-links": "--find-links", "constraint": "--constraint"}
_SCOPES = (":env:", "site", "user", "global")


def uv_flags_from_pip_config() -> list[str]:
    """The index, extra indexes, wheel folders and constraints of ``pip config list`` as uv's
    flags, with ``--index-strategy unsafe-best-match`` (pip's rule: the best version from any
    index, where uv would otherwise stop at the first index that has the package)."""
    code, out = pip("config", "list", check=False, show=False)
    chosen: dict[str, tuple[int, list[str]]] = {}
    for line in out.splitlines() if code == 0 else ():
        key, sep, value = line.partition("=")
        scope, _, option = key.rpartition(".")
        if not sep or option not in _PIP_TO_UV or scope not in _SCOPES:
            continue
        rank = _SCOPES.index(scope)
        if option not in chosen or rank < chosen[option][0]:
            chosen[option] = (rank, value.strip().strip("'\"").split())
    flags = ["--index-strategy", "unsafe-best-match"]
    for option, (_, values) in chosen.items():
        for value in values[-1:] if option == "index-url" else values:
            flags += [_PIP_TO_UV[option], value]
    return flags


def compile_sources() -> None:
    """Byte-compile the course's own Python (``workbook/``, ``solutions/``, ``labs/``) into
    ``__pycache__``, where it is stale.

    pip compiles what it installs, but not an editable install's sources, and where
    ``PYTHONDONTWRITEBYTECODE`` is set (as on some CI machines) Python never writes what it
    compiled: every process the suite starts (every rank, about 600) would compile the modules
    it imports again. Measured here: grading two labs' solutions took 15 % less CPU time with
    the sources compiled first. A second, and nothing when nothing changed.
    """
    sh(PY, "-m", "compileall", "-q", "-j", "0", *(ROOT / d for d in ("workbook", "solutions", "labs")),
       check=False, quiet=True)


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
PACKAGE_TITLE = "package tests"
SOLUTIONS_TITLE = "grading solutions/"
# Stages that run beside the package tests, one after the other, their output kept and shown
# after the package tests' (docs/test-suite.md: a 2-core machine has cores to spare while tests
# wait for ranks, kernels and browsers; every check they make holds under that load).
BESIDE = (SOLUTIONS_TITLE, STUB_TITLE)
CLOCK_DIR = ROOT / "runs" / "test-times"


def test_workers() -> int:
    """pytest-xdist workers for the package tests: ``WORKBOOK_TEST_WORKERS``, default 2 (1: one
    process, no xdist)."""
    raw = os.environ.get("WORKBOOK_TEST_WORKERS", "2")
    try:
        return max(1, int(raw))
    except ValueError:
        raise SystemExit(f"[workbook setup] WORKBOOK_TEST_WORKERS={raw!r}: give a whole number of "
                         f"workers for the package tests (1 runs them in one process)") from None


RELEASE_TITLE = "your labs, graded by the course's tests"
RELEASE_NOTE = ("a test you have not done yet says 'not implemented yet'; this stage passes at "
                "full marks")


def is_release() -> bool:
    """Is this checkout a student release (``workbook release``)?"""
    return (ROOT / RELEASE_MANIFEST).is_file()


def release_stages() -> list[tuple[str, str, list]]:
    """A student release's test command: its labs graded with the public grading tests."""
    return [(RELEASE_TITLE, RELEASE_NOTE, [PY, "-m", "workbook.cli", "grade"])]


def stages() -> list[tuple[str, str, list]]:
    """The test command's stages: (title, what to expect, command), run from the repo root."""
    if is_release():
        return release_stages()
    wb = [PY, "-m", "workbook.cli"]
    # the package tests on pytest-xdist workers, each module on one worker, every module that
    # reads measured time in one group that runs alone (tests/package/conftest.py);
    # -p suite_clock records each test's time (tests/bench/suite_time.py reports it); no nbmake:
    # the lessons run through nbclient (test_notebooks.py), and its import costs every worker 2 s
    # of CPU (jsonschema's IRI parsers; tests/package/conftest.py defers them)
    n = test_workers()
    workers = ["-n", str(n)] if n > 1 else []
    return [
        ("labs/ generated from solutions/", "", [*wb, "assign", "--check"]),
        # the layout: families side by side, layers below (pyproject.toml, tool.importlinter)
        ("import contracts", "", [VENV / "bin" / "lint-imports"]),
        # tests/gpu: the GPU suite; without CUDA every test skips (a second, no more)
        (PACKAGE_TITLE, "", [PY, "-m", "pytest", "-q", "tests/package", "tests/gpu",
                             "-p", "no:cacheprovider", "-p", "no:nbmake", "-p", "suite_clock",
                             *workers,
                             "--durations=8"]),
        (SOLUTIONS_TITLE, "must be full marks", [*wb, "grade", "--impl", "solutions", "--strict"]),
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


def _clock_env(clock: Path, stage: str, as_option: bool) -> dict:
    """The environment of a stage whose pytest records each test's time into ``clock``
    (``tests/bench/suite_clock.py``); ``as_option``: load the plugin through PYTEST_ADDOPTS, for
    a stage that starts pytest itself (the grading stages), not on its command line."""
    bench = str(ROOT / "tests" / "bench")
    env = dict(os.environ, WORKBOOK_SUITE_CLOCK=str(clock), WORKBOOK_SUITE_CLOCK_STAGE=stage,
               PYTHONPATH=os.pathsep.join([bench, *filter(None, [os.environ.get("PYTHONPATH")])]))
    if as_option:
        env["PYTEST_ADDOPTS"] = " ".join(filter(None, [os.environ.get("PYTEST_ADDOPTS"),
                                                       "-p suite_clock"]))
    return env


def _verdict(title: str, code: int, seconds: float) -> str:
    verdict = "ok" if code == 0 else f"FAILED ({code})"
    if title == STUB_TITLE and code == 0:
        verdict = "ok (every stub failed with 'not implemented yet', as expected)"
    return f"--- {title}: {verdict} in {seconds:.0f} s"


def _header(title: str, note: str) -> str:
    return f"--- {title}: {note}" if note else f"--- {title}"


def run_tests() -> int:
    """The whole check: generated labs in sync, package tests, full marks, stubs score zero.

    Every stage runs even when an earlier one failed; the last line says how it all went, and
    the exit code is 1 when any stage failed, 0 when all passed. The stages of ``BESIDE`` run
    one after the other beside the package tests (started with them); their output is kept in
    a file and shown, in stage order, once the package tests are done.
    """
    import tempfile
    import threading
    steps = stages()
    CLOCK_DIR.mkdir(parents=True, exist_ok=True)
    clock = CLOCK_DIR / time.strftime("test-%Y%m%d-%H%M%S.jsonl")
    results: dict[str, tuple[int, float]] = {}
    logs: dict[str, Path] = {}
    beside = [(t, n, c) for t, n, c in steps if t in BESIDE]

    def run_beside(folder: str) -> None:
        for title, _, cmd in beside:
            stage = "solutions" if title == SOLUTIONS_TITLE else "stubs"
            logs[title] = Path(folder) / f"{len(logs)}.log"
            t0 = time.time()
            with open(logs[title], "w") as log:
                code = sh(*cmd, check=False, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                          env=_clock_env(clock, stage, as_option=True))
            results[title] = (code, time.time() - t0)

    with tempfile.TemporaryDirectory(prefix="workbook-stages-") as folder:
        side = threading.Thread(target=run_beside, args=(folder,), daemon=True)
        for title, note, cmd in steps:
            if title in BESIDE:
                continue
            if title == PACKAGE_TITLE and beside:
                say(f"--- the {len(beside)} grading stages run beside the package tests; their "
                    f"output follows theirs")
                side.start()
            say(_header(title, note))
            t0 = time.time()
            kw = {"env": _clock_env(clock, "package", as_option=False)} \
                if title == PACKAGE_TITLE else {}
            code = sh(*cmd, check=False, cwd=ROOT, **kw)
            results[title] = (code, time.time() - t0)
            say(_verdict(title, code, results[title][1]))
        if beside:
            if side.ident is None:                  # no package tests stage: run them now
                side.start()
            side.join()
            for title, note, _ in beside:
                say(_header(title, note))
                if title in logs and logs[title].exists():
                    print(logs[title].read_text(errors="replace"), end="", flush=True)
                say(_verdict(title, *results.get(title, (1, 0.0))))
    failed = [t for t, _, _ in steps if results.get(t, (1, 0))[0]]
    if clock.exists():
        say(f"each test's time: {clock.relative_to(ROOT)} "
            f"(.venv/bin/python tests/bench/suite_time.py --table {clock.relative_to(ROOT)})")
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
    compile_sources()
    if argv[0] == "demo":
        return sh(PY, "-m", "workbook.cli", "demo", *argv[1:], check=False, cwd=ROOT)
    if not is_release():                  # a release has no browser tests
        ensure_chromium()
    return run_tests()


if __name__ == "__main__":
    sys.exit(main())
