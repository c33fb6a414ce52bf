"""The package's layout holds: families side by side, layers below, no cycles, one lab's modules
used by that lab alone, and old import paths that say where they went (docs/architecture.md).

The import rules are import-linter contracts in ``pyproject.toml``; these tests run them as the
test command does, and prove that they fail on a deliberate violation.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workbook.grading.labs import FAMILY, LABS

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")
LESSON_LAB = {"01_collectives": "collectives", "02_ring_allreduce": "ring_allreduce",
              "03_traces_and_async": "async_overlap", "04_tensor_parallel": "tp",
              "05_sequence_parallel": "sp", "06_domino": "domino", "07_overlap_math": "overlap_math",
              "08_tp_overlap": "tp_overlap", "09_dp_overlap": "dp_overlap",
              "10_pp_overlap": "pp_overlap", "11_cp_ring": "cp_ring",
              "12_pp_schedules": "pp_schedules", "13_ep_overlap": "ep_overlap",
              "14_capstone": "capstone"}

needs_linter = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed "
                                  "(pip install -e '.[dev]')")


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


@needs_linter
def test_the_contracts_hold():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


@needs_linter
@pytest.mark.parametrize("where, code, broken", [
    # a layer importing a family
    ("workbook/measure/_violation.py", "from workbook.tensor_parallel import mappings\n",
     "Entry points > families"),
    # a family importing another family
    ("workbook/data_parallel/_violation.py", "import workbook.pipeline_parallel.pp_overlap_bench\n",
     "Entry points > families"),
    # a lower layer importing a higher one
    ("workbook/link/_violation.py", "import workbook.trace.load\n", "Entry points > families"),
    # two modules of a folder importing each other
    ("workbook/runtime/_violation.py", "import workbook.runtime.flight\n", "No import cycles"),
])
def test_a_violation_breaks_a_contract(tmp_path, where, code, broken):
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "workbook", copy / "workbook",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    (copy / where).write_text(code)
    if "cycles" in broken:                     # close the cycle: flight imports the new module
        flight = copy / "workbook/runtime/flight.py"
        flight.write_text(flight.read_text() + "\nimport workbook.runtime._violation  # noqa\n")
    out = lint(copy)
    assert out.returncode != 0, out.stdout[-2000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith(broken[:20]))
    assert line.endswith("BROKEN"), out.stdout[-2000:]
    assert "_violation" in out.stdout


def _imports(path: Path) -> set[str]:
    text = path.read_text(errors="replace")
    found = set(re.findall(r"^\s*(?:from|import)\s+(workbook[\w.]*)", text, flags=re.M))
    found |= {f"{m}.{n.strip()}" for m, names in
              re.findall(r"^\s*from\s+(workbook[\w.]*)\s+import\s+([\w, ]+)", text, flags=re.M)
              for n in names.split(",") if n.strip()}
    return found


def _lab_of(path: Path) -> str | None:
    """The lab a file belongs to, or None for code every lab shares."""
    stem = path.stem
    if path.parent.name == "lessons":
        return LESSON_LAB.get(stem)
    if path.parent.name in ("solutions", "labs"):
        return stem if stem in LABS else None
    if path.parent.name == "grading" and stem.startswith("test_"):
        return stem[len("test_"):] if stem[len("test_"):] in LABS else None
    return _named_after(stem)


def _named_after(stem: str) -> str | None:
    return next((lab for lab in sorted(LABS, key=len, reverse=True)
                 if stem == lab or stem.startswith(lab + "_")), None)


def test_a_module_named_after_one_lab_serves_that_lab_alone():
    owned = {f"workbook.{fam}.{p.stem}": _named_after(p.stem)
             for fam in set(FAMILY.values()) for p in (ROOT / "workbook" / fam).glob("*.py")
             if _named_after(p.stem)}
    assert "workbook.data_parallel.dp_overlap_bench" in owned
    files = [*ROOT.glob("workbook/**/*.py"), *ROOT.glob("solutions/*.py"), *ROOT.glob("labs/*.py"),
             *ROOT.glob("lessons/*.py"), *ROOT.glob("tests/grading/test_*.py")]
    wrong = []
    for path in files:
        mine = _lab_of(path)
        for name in _imports(path):
            lab = owned.get(name) or owned.get(name.rsplit(".", 1)[0])
            if lab and mine and lab != mine:
                wrong.append(f"{path.relative_to(ROOT)} (lab {mine}) imports {name} (lab {lab})")
    assert not wrong, "\n".join(wrong)


def test_each_lab_has_a_family_and_its_files_are_found_by_its_name():
    from workbook.grading.labs import lab_module
    assert set(FAMILY) == set(LABS)
    for lab in ("domino", "tp_overlap", "dp_overlap", "pp_overlap", "cp_ring"):
        path = ROOT / Path(*lab_module(lab, "bench").split(".")).with_suffix(".py")
        assert path.exists(), path


@pytest.mark.parametrize("old, new", [
    ("from workbook.tp import conjugate_op", "workbook.tensor_parallel.mappings"),
    ("from workbook import launch", "workbook.runtime.launch"),
    ("import workbook.bench_domino", "workbook.tensor_parallel.domino_bench"),
    ("from workbook.domino_measure import recalibrate", "workbook.measure.calibration"),
])
def test_an_old_import_path_says_where_it_went(old, new):
    out = subprocess.run([sys.executable, "-c", old], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: workbook.") and "has moved: import" in last and new in last


def test_the_folder_graph_is_at_most_eight_layers_deep_and_acyclic():
    """The longest chain of imports between the folders (and entry modules) of ``workbook/``:
    how docs/architecture.md counts layers."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("workbook", cache_dir=None)
    edges: dict[str, set[str]] = {}
    for mod in graph.modules:
        top = ".".join(mod.split(".")[:2])
        for dep in graph.find_modules_directly_imported_by(mod):
            dtop = ".".join(dep.split(".")[:2])
            if dtop != top and dtop != "workbook" and top != "workbook":
                edges.setdefault(top, set()).add(dtop)
    depth: dict[str, int] = {}

    def longest(node, path=()):
        assert node not in path, f"cycle between folders: {' -> '.join(path + (node,))}"
        if node not in depth:
            depth[node] = 1 + max((longest(d, path + (node,)) for d in edges.get(node, ())),
                                  default=0)
        return depth[node]

    assert max(longest(n) for n in list(edges)) <= 8, depth


@pytest.mark.parametrize("family", sorted(set(FAMILY.values())))
def test_a_family_re_exports_only_names_its_modules_define(family):
    import importlib
    package = importlib.import_module(f"workbook.{family}")
    assert package._GIVEN, family
    for name, module in package._GIVEN.items():
        assert getattr(package, name) is getattr(
            importlib.import_module(f"workbook.{family}.{module}"), name), name
    with pytest.raises(AttributeError, match="has no attribute 'no_such_piece'"):
        package.no_such_piece


@pytest.mark.parametrize("argv", [["--help"], ["assign", "--check"], ["grade", "--help"],
                                  ["site", "--help"], ["autograder", "build", "--help"],
                                  ["progress"], ["hint", "--help"], ["watch", "--help"],
                                  ["release", "--help"]])
def test_a_light_command_imports_no_torch_and_no_pytest(argv):
    """Parsing the command line and the commands that read files pay for neither torch nor
    pytest (seconds on a laptop); `workbook trace` has its own test in test_trace_io.py."""
    code = ("import sys\nfrom workbook.cli import main\ntry:\n    main(%r)\nexcept SystemExit:\n"
            "    pass\nprint(sorted(m for m in ('torch', 'pytest') if m in sys.modules))" % argv)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-2000:] + out.stderr[-2000:]
