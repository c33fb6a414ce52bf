"""Building the autograder zip: ``setup.sh``, ``run_autograder``, ``autograder.json``, this
package as a wheel, and the grading tests (the course's and the instructor's extra ones)."""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from importlib import metadata
from pathlib import Path

from workbook.grading.labs import LABS, is_release, repo_root

DEFAULT_TEST_TIMEOUT_S = 120.0   # one test; a run on ranks inside it also keeps its own timeout
DEFAULT_TIME_BUDGET_S = 540.0    # the whole run: 9 minutes, inside Gradescope's default 10
RESERVE_S = 30.0                 # of the budget, kept for starting up and writing results.json
KILL_GRACE_S = 20.0              # after its budget, the grading process is killed
LIST_GRACE_S = 20.0              # ... unless it has not listed its tests yet: this much more for that
VENV = "/opt/workbook-venv"
ENV_ROOT = "AUTOGRADER_ROOT"
ENV_PYTHON = "WORKBOOK_AUTOGRADER_PYTHON"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYPI_INDEX = "https://pypi.org/simple"
SKIP_PARTS = ("__pycache__", "__MACOSX")
NOT_IN_A_RELEASE = ("this course is a student release, which has neither the reference solutions "
                    "nor the hidden tests: build the Gradescope zip in the course repository")
GRADER_FAILED = ("The autograder stopped before it could grade this submission (this is not about "
                 "your code). Your instructor can see why: please tell them.")

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image: a Python venv with
# the CPU build of torch {torch} (the version that built this zip) and overlap-workbook {version}
# from the wheel in dist/. Package registries are the only network sources.
set -euo pipefail
cd "$(dirname "$0")"
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends python3 python3-venv python3-pip
python3 -m venv {venv}
{venv}/bin/python -m pip install --upgrade pip
{venv}/bin/python -m pip install --index-url {cpu_index} --extra-index-url {pypi} \\
    "torch=={torch}" "./{wheel}"
{venv}/bin/python -c "import torch, workbook.grading.limits; print('torch', torch.__version__, \\
'(CUDA build: larger than needed)' if torch.version.cuda else '(CPU build)')"
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this per submission: grade /autograder/submission, write
# /autograder/results/results.json. ${env_root} moves /autograder; ${env_python}
# picks the Python (default: the venv setup.sh made).
ROOT="${{{env_root}:-/autograder}}"
PY="${{{env_python}:-{venv}/bin/python}}"
mkdir -p "$ROOT/results"
rm -f "$ROOT/results/results.json"
cd "$ROOT"
"$PY" -m workbook.cli autograder run --root "$ROOT"
status=$?
if [ ! -s "$ROOT/results/results.json" ]; then
    echo "the grader stopped (exit status $status) without writing results.json"
    printf '{{"score": 0, "execution_time": %d, "tests": [], "output": %s}}\n' "$SECONDS" \
        '{fallback}' > "$ROOT/results/results.json"
fi
exit 0
"""


# --------------------------------------------------------------------------- build
def build(labs, output, *, extra_tests=None, test_timeout: float = DEFAULT_TEST_TIMEOUT_S,
          time_budget: float = DEFAULT_TIME_BUDGET_S, max_ranks="auto",
          level: str = "standard") -> Path:
    """Write the autograder zip for ``labs`` to ``output``; return its path. ``max_ranks``: a
    rank cap (a whole number) or ``"auto"`` (chosen on the grading machine, ``run.rank_cap``).
    ``level``: the level the class's labs were handed out at (``workbook assign --level``); the
    same tests grade every level, so it only labels the results. Refused in a student release
    (``workbook release``): the zip is the instructor's, built where the hidden tests are."""
    if is_release():
        raise ValueError(NOT_IN_A_RELEASE)
    if level not in ("guided", "standard", "challenge"):
        raise ValueError(f"--level must be guided, standard or challenge, not {level!r}")
    if str(max_ranks) != "auto" and not (str(max_ranks).isdigit() and int(max_ranks) >= 1):
        raise ValueError(f"--max-ranks must be a whole number of ranks (1 or more) or auto, "
                         f"not {max_ranks!r}")
    labs = list(dict.fromkeys(labs))
    unknown = [lab for lab in labs if lab not in LABS]
    if unknown:
        raise ValueError(f"unknown lab {unknown[0]!r}; the labs are {', '.join(LABS)}")
    if test_timeout <= 0 or time_budget <= 0:
        raise ValueError("--test-timeout and --time-budget must be positive numbers of seconds")
    if time_budget > 600:
        print(f"note: a time budget of {time_budget:g} s is above Gradescope's default limit of "
              "600 s: raise the assignment's limit to match")
    grading = repo_root() / "tests" / "grading"
    files = {}
    for lab in labs:
        path = grading / f"test_{lab}.py"
        if not path.is_file():
            raise FileNotFoundError(f"no grading tests for lab {lab!r}: {path} is missing")
        files[f"tests/grading/{path.name}"] = path
    for path in sorted(grading.glob("*.py")):            # conftest.py and helpers, if any
        if not path.name.startswith("test_"):
            files[f"tests/grading/{path.name}"] = path
    files.update(_extra_test_files(extra_tests, labs, files) if extra_tests else {})

    output = Path(output).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="autograder-build-") as tmp:
        wheel = _build_wheel(Path(tmp))
        version = wheel.name.split("-")[1]
        torch_version = metadata.version("torch").split("+")[0]
        config = {
            "labs": labs, "level": level, "test_timeout_s": test_timeout, "time_budget_s": time_budget,
            "max_ranks": "auto" if str(max_ranks) == "auto" else int(max_ranks),
            "workbook_version": version, "torch_version": torch_version,
            "built_with_python": ".".join(map(str, sys.version_info[:3])),
            "extra_tests": sorted(a for a in files if a.startswith("tests/extra/")),
        }
        script_vars = dict(torch=torch_version, version=version, venv=VENV,
                           wheel=f"dist/{wheel.name}", cpu_index=TORCH_CPU_INDEX, pypi=PYPI_INDEX,
                           env_root=ENV_ROOT, env_python=ENV_PYTHON,
                           fallback=json.dumps(GRADER_FAILED))
        partial = output.with_name(output.name + ".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zf:
            _add(zf, "setup.sh", SETUP_SH.format(**script_vars), executable=True)
            _add(zf, "run_autograder", RUN_AUTOGRADER.format(**script_vars), executable=True)
            _add(zf, "autograder.json", json.dumps(config, indent=2) + "\n")
            _add(zf, f"dist/{wheel.name}", wheel.read_bytes())
            for arcname, path in sorted(files.items()):
                _add(zf, arcname, path.read_bytes())
        partial.replace(output)
    return output


def _add(zf: zipfile.ZipFile, arcname: str, data, executable: bool = False) -> None:
    info = zipfile.ZipInfo(arcname, date_time=time.localtime()[:6])
    info.external_attr = (0o100755 if executable else 0o100644) << 16     # kept by unzip
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)


def _build_wheel(tmp: Path) -> Path:
    """This package as a wheel, built from a copy of the checkout (the checkout is not touched)."""
    root, src = repo_root(), tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (root / name).is_file():
            shutil.copy2(root / name, src / name)
    shutil.copytree(root / "workbook", src / "workbook",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"),
           str(src)]
    # offline with this environment's setuptools; failing that (none, or too old), pip fetches
    # the build requirements from PyPI
    for extra in (["--no-build-isolation", "--no-index"], []):
        out = subprocess.run(cmd + extra, capture_output=True, text=True)
        wheels = sorted((tmp / "dist").glob("overlap_workbook-*.whl"))
        if out.returncode == 0 and wheels:
            return wheels[0]
    raise ValueError(f"building this package's wheel failed ({' '.join(cmd[2:5])}):\n"
                     + (out.stderr or out.stdout).strip()[-2000:])


def _extra_test_files(folder, labs: list[str], course: dict) -> dict:
    """``{arcname: path}`` for every file under ``folder``, after checking what would break the
    run on Gradescope (where no one sees the error until a student submits)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"--extra-tests {folder}: no such folder")
    out, tests = {}, []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if not path.is_file() or path.suffix == ".pyc" or any(
                part.startswith(".") or part in SKIP_PARTS for part in rel.parts):
            continue
        out[f"tests/extra/{rel.as_posix()}"] = path
        if path.suffix == ".py" and path.name.startswith("test_"):
            tests.append(path)
    if not tests:
        raise ValueError(f"--extra-tests {folder}: no test_*.py files in it")
    seen = {Path(a).name for a in course if Path(a).name.startswith("test_")}
    for path in tests:
        if path.name in seen:
            raise ValueError(f"--extra-tests: {path} has the same name as another test file in "
                             f"the zip; rename it (e.g. {path.stem}_hidden.py)")
        seen.add(path.name)
        lab = _lab_of(path)
        if lab is not None and lab not in labs:
            raise ValueError(f"--extra-tests: {path.name} is named after lab {lab!r}, which this "
                             f"autograder does not grade: add --lab {lab}")
        if not _check_marks(path):
            print(f"note: {path} has no @pytest.mark.points test: nothing in it is graded")
    return out


def _lab_of(path: Path) -> str | None:
    from workbook.grading.limits import lab_of     # the grader's own rule (it imports pytest)
    return lab_of(path)


def _check_marks(path: Path) -> bool:
    """True when ``path`` has a ``points`` mark; a visibility Gradescope does not know, or a
    syntax error, is an error naming the line."""
    from workbook.grading.plugin import VISIBILITIES   # pytest, only when a zip is built
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as exc:
        raise ValueError(f"--extra-tests: {path}:{exc.lineno}: {exc.msg}") from None
    found = False
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "points"):
            continue
        found = True
        for kw in node.keywords:
            if kw.arg == "visibility" and not (isinstance(kw.value, ast.Constant)
                                               and kw.value.value in VISIBILITIES):
                raise ValueError(f"--extra-tests: {path}:{node.lineno}: visibility must be one of "
                                 f"{', '.join(repr(v) for v in VISIBILITIES)} (a literal), got "
                                 f"{ast.unparse(kw.value)}")
    return found
