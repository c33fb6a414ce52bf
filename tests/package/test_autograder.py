"""The Gradescope autograder zip, run the way Gradescope runs it, on four kinds of submission.

The zip is built once (two small labs, plus a hidden instructor test), unpacked into a temporary
``/autograder`` (``$AUTOGRADER_ROOT``) and its ``run_autograder`` run with this venv's Python
(``$WORKBOOK_AUTOGRADER_PYTHON``: no ``setup.sh``). Every ``results.json`` is checked against
Gradescope's format.

The submissions whose grading judges no measured time (the stubs, the missing file, the spent
budget) are graded at the same time, by one fixture; the two that grade a finished
``overlap_math`` (whose last test reads a measured trace) are graded one at a time, alone.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from workbook.instructor.autograder import RESERVE_S
from workbook.instructor.autograder.bundle import ENV_ROOT
from workbook.grading.labs import repo_root

from processes import gone_within

LABS = ("ring_allreduce", "overlap_math")
HIDDEN_TEST = textwrap.dedent('''
    import pytest
    from workbook.grading import load_lab

    @pytest.mark.points(2, visibility="hidden")
    def test_linear_flops_of_a_square_matmul():
        assert load_lab("overlap_math").linear_flops(5, 6, 6) == 360
''')
HANG = textwrap.dedent('''

    def ring_all_reduce(tensor, op=SUM):
        """Waits for a message its left neighbour never sends."""
        left, _ = neighbours()
        if dist.get_world_size() > 1:
            dist.recv(torch.empty(1, dtype=tensor.dtype), src=left)
        return tensor
''')

# Gradescope's results.json (gradescope-autograders.readthedocs.io, "Autograder Specifications")
TOP_KEYS = {"score", "execution_time", "output", "output_format", "test_output_format",
            "test_name_format", "visibility", "stdout_visibility", "extra_data", "tests",
            "leaderboard"}
TEST_KEYS = {"score", "max_score", "status", "name", "name_format", "number", "output",
             "output_format", "tags", "visibility", "extra_data"}
VISIBILITIES = {"visible", "hidden", "after_due_date", "after_published"}


def assert_gradescope_format(res: dict) -> None:
    assert isinstance(res, dict) and set(res) <= TOP_KEYS, set(res) - TOP_KEYS
    assert {"score", "execution_time", "output", "tests"} <= set(res)
    assert isinstance(res["score"], (int, float)) and not isinstance(res["score"], bool)
    assert isinstance(res["execution_time"], int) and res["execution_time"] >= 0
    assert isinstance(res["output"], str) and isinstance(res["tests"], list)
    for t in res["tests"]:
        assert set(t) <= TEST_KEYS, set(t) - TEST_KEYS
        assert {"name", "score", "max_score", "status", "output", "visibility"} <= set(t), t
        assert isinstance(t["name"], str) and isinstance(t["output"], str)
        assert all(isinstance(t[k], (int, float)) for k in ("score", "max_score"))
        assert 0 <= t["score"] <= t["max_score"], t
        assert t["status"] in ("passed", "failed") and t["visibility"] in VISIBILITIES, t
        assert "Traceback" not in t["output"], t["output"]
    assert res["score"] == pytest.approx(sum(t["score"] for t in res["tests"]))
    assert "Traceback" not in res["output"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("bundle")
    (tmp / "extra").mkdir()
    (tmp / "extra" / "test_overlap_math_hidden.py").write_text(HIDDEN_TEST)
    zip_path = tmp / "autograder.zip"
    out = subprocess.run([sys.executable, "-m", "workbook.cli", "autograder", "build",
                          *(a for lab in LABS for a in ("--lab", lab)),
                          "--extra-tests", str(tmp / "extra"), "-o", str(zip_path)],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    return zip_path


def run_autograder(bundle: Path, root: Path, submission: dict, python=sys.executable,
                   **config) -> dict:
    """Unpack ``bundle`` as Gradescope does, submit ``{name: text}``, run, read results.json."""
    with zipfile.ZipFile(bundle) as zf:
        zf.extractall(root / "source")
        for info in zf.infolist():                       # unzip keeps the mode; zipfile does not
            os.chmod(root / "source" / info.filename, (info.external_attr >> 16) & 0o777)
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")
    cfg_path = root / "source" / "autograder.json"
    cfg_path.write_text(json.dumps(dict(json.loads(cfg_path.read_text()), **config)))
    for name, text in submission.items():
        (root / "submission" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "submission" / name).write_text(text)
    (root / "submission").mkdir(exist_ok=True)
    # no setup.sh here, so no wheel installed: the grader imports the checkout under test, put
    # first (a venv's editable install, or a student release beside it, is another copy)
    path = os.pathsep.join([str(repo_root()), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {k: v for k, v in os.environ.items() if k not in ("WORKBOOK_ROOT", "WORKBOOK_IMPL")}
    env.update(AUTOGRADER_ROOT=str(root), WORKBOOK_AUTOGRADER_PYTHON=str(python), PYTHONPATH=path)
    out = subprocess.run([str(root / "run_autograder")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    res = json.loads((root / "results" / "results.json").read_text())
    assert_gradescope_format(res)
    return res


def by_name(res: dict) -> dict:
    return {t["name"]: t for t in res["tests"]}


def source(folder: str, lab: str) -> str:
    return (repo_root() / folder / f"{lab}.py").read_text()


#: the submissions graded at the same time (``side_runs``): none runs a lab's finished code, so
#: none reads a measured time; each is still one whole ``run_autograder``, as on Gradescope
SIDE_RUNS = {
    # at most 2 ranks, as on Gradescope's default machine (768 MB; test_release_autograder
    # too): the same verdicts (engine.world_sizes), 3 rank processes to start instead of 10
    "stubs": lambda: ({f"{lab}.py": source("labs", lab) for lab in LABS}, {"max_ranks": 2}),
    "missing": lambda: ({"overlap-math.py": source("solutions", "overlap_math"),
                         "notes.txt": "my notes"}, {}),
    "over_budget": lambda: ({f"{lab}.py": source("solutions", lab) for lab in LABS},
                            {"time_budget_s": RESERVE_S}),
}


@pytest.fixture(scope="module")
def side_runs(bundle, tmp_path_factory) -> dict:
    """``{kind: results.json}`` of the ``SIDE_RUNS``, graded at once (three processes: each
    spends most of its time starting Python, torch and ranks)."""
    def grade(kind):
        submission, config = SIDE_RUNS[kind]()
        return run_autograder(bundle, tmp_path_factory.mktemp(kind), submission, **config)
    with ThreadPoolExecutor(len(SIDE_RUNS)) as pool:
        futures = {kind: pool.submit(grade, kind) for kind in SIDE_RUNS}
        return {kind: future.result() for kind, future in futures.items()}


def test_the_zip_holds_what_gradescope_needs(bundle):
    with zipfile.ZipFile(bundle) as zf:
        names = zf.namelist()
        modes = {i.filename: i.external_attr >> 16 for i in zf.infolist()}
        setup = zf.read("setup.sh").decode()
        config = json.loads(zf.read("autograder.json"))
    wheel = next(n for n in names if n.startswith("dist/") and n.endswith(".whl"))
    from importlib import metadata
    torch_version = metadata.version("torch").split("+")[0]
    assert f'"torch=={torch_version}"' in setup and f'"./{wheel}"' in setup
    assert "--index-url https://download.pytorch.org/whl/cpu" in setup
    assert "--extra-index-url https://pypi.org/simple" in setup
    assert wheel.split("-")[1] == config["workbook_version"]
    assert config["labs"] == list(LABS) and config["torch_version"] == torch_version
    assert config["max_ranks"] == "auto" and config["level"] == "standard"
    assert modes["setup.sh"] & stat.S_IXUSR and modes["run_autograder"] & stat.S_IXUSR
    assert {"tests/grading/test_ring_allreduce.py", "tests/grading/test_overlap_math.py",
            "tests/extra/test_overlap_math_hidden.py"} <= set(names)
    assert not any("wrong" in n or n.startswith(("solutions", "labs/", "tests/package"))
                   or "test_tp" in n for n in names)
    with zipfile.ZipFile(bundle) as zf, zipfile.ZipFile(zf.open(wheel)) as whl:
        inside = whl.namelist()
    assert "workbook/instructor/autograder/run.py" in inside and "workbook/grading/limits.py" in inside
    for script in ("setup.sh", "run_autograder"):
        with zipfile.ZipFile(bundle) as zf:
            text = zf.read(script).decode()
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_solutions_score_full_marks(bundle, tmp_path):
    res = run_autograder(bundle, tmp_path, {f"{lab}.py": source("solutions", lab) for lab in LABS})
    tests = by_name(res)
    lost = [(t["name"], t["output"][:600]) for t in res["tests"] if t["score"] < t["max_score"]]
    assert not lost, lost
    assert res["score"] == sum(t["max_score"] for t in res["tests"]) > 0
    assert all(t["status"] == "passed" for t in res["tests"])
    hidden = tests["overlap_math_hidden::linear_flops_of_a_square_matmul"]
    assert hidden["visibility"] == "hidden" and hidden["score"] == 2
    assert {t["visibility"] for t in res["tests"]} == {"visible", "hidden"}
    assert "graded: ring_allreduce.py, overlap_math.py" in res["output"]


def test_stubs_score_zero_with_not_implemented_yet(side_runs):
    res = side_runs["stubs"]
    assert res["score"] == 0 and len(res["tests"]) == 12
    for t in res["tests"]:
        assert "not implemented yet" in t["output"], t


def test_a_missing_or_misnamed_file_is_a_clear_message(side_runs):
    res = side_runs["missing"]
    assert res["score"] == 0
    for t in res["tests"]:
        if t["name"].startswith("ring_allreduce::"):
            assert t["output"] == "file ring_allreduce.py was not submitted"
        else:
            assert t["output"].startswith("file overlap_math.py was not submitted; found "
                                          "overlap-math.py: name it overlap_math.py"), t
    assert "missing: file ring_allreduce.py was not submitted" in res["output"]
    assert "ignored" in res["output"] and "notes.txt" in res["output"]


def test_a_hang_scores_zero_with_its_report_and_the_rest_is_graded(bundle, tmp_path):
    hanging = source("solutions", "ring_allreduce") + HANG
    res = run_autograder(bundle, tmp_path, {"labs/ring_allreduce.py": hanging,
                                            "overlap_math.py": source("solutions", "overlap_math")},
                         test_timeout_s=15, max_ranks=2)     # the hang is on 2 ranks
    tests = by_name(res)
    hung = tests["ring_allreduce::ring_all_reduce_matches_builtin"]
    assert hung["score"] == 0
    assert "no rank made progress for" in hung["output"]                 # the hang report
    for rank in (0, 1):
        assert f"rank {rank}: in your recv" in hung["output"]
    assert tests["ring_allreduce::ring_all_reduce_pattern"]["score"] == 0     # reads that run
    others = [t for name, t in tests.items() if "ring_all_reduce_" not in name]
    lost = [(t["name"], t["output"][:600]) for t in others if t["score"] < t["max_score"]]
    assert len(others) == 10 and not lost, lost
    assert "graded: labs/ring_allreduce.py, overlap_math.py" in res["output"]
    # the hung ranks were killed with their pool, and the rest ended with the run: no process
    # holds this grading's $AUTOGRADER_ROOT (its ranks inherit it, not its command line)
    left = gone_within(30, f"{ENV_ROOT}={tmp_path}\0", where="environ")
    assert not left, left


def test_tests_past_the_time_budget_score_zero_not_run(side_runs):
    res = side_runs["over_budget"]
    assert res["score"] == 0 and len(res["tests"]) == 12
    assert all(t["output"] == "not run: the time budget was spent" for t in res["tests"])
    assert "12 test(s) were not run: the time budget was spent." in res["output"]


def test_results_are_written_even_when_the_grader_cannot_run(bundle, tmp_path):
    res = run_autograder(bundle, tmp_path / "a", {}, python="/bin/false")
    assert res["score"] == 0 and "Your instructor can see why" in res["output"]
    res = run_autograder(bundle, tmp_path / "b", {"x.py": ""}, labs=None)     # a broken config
    assert res["score"] == 0 and "Your instructor can see why" in res["output"]


def test_build_refuses_what_would_break_on_gradescope(tmp_path, capsys):
    """Each refusal a one-line error, exit status 2, no zip (``workbook.cli.main`` in this
    process: the same parser and messages as the command, without a Python started for each;
    the command's own process refuses a build in ``test_release_autograder.py``)."""
    from workbook import cli
    bad = tmp_path / "extra"
    bad.mkdir()
    (bad / "test_mine.py").write_text("import pytest\n\n@pytest.mark.points(1, visibility='hiden')"
                                      "\ndef test_x():\n    pass\n")
    build = ["autograder", "build", "-o", str(tmp_path / "z.zip")]
    for args, says in ((["--lab", "overlap_math", "--extra-tests", str(bad)],
                        "test_mine.py:3: visibility must be one of"),
                       (["--lab", "telepathy"], "unknown lab 'telepathy'")):
        code = cli.main(build + args)
        err = capsys.readouterr().err
        assert code == 2 and says in err, (args, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "z.zip").exists()
    # the plugin refuses it too, with the test's name, when such a file is run directly
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                          "-p", "no:nbmake", str(bad)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 4
    assert "test_mine.py::test_x: @pytest.mark.points(..., visibility='hiden')" in out.stderr


def test_rank_cap_follows_the_machine():
    """``max_ranks: auto`` grades with fewer ranks on a small machine (Gradescope's default has
    768 MB); a number in autograder.json is used as it is."""
    from workbook.instructor.autograder.run import rank_cap
    assert rank_cap("auto", memory_bytes=768 * 2**20) == 1
    assert rank_cap("auto", memory_bytes=3 * 2**30) == 2
    assert rank_cap("auto", memory_bytes=16 * 2**30) is None
    assert rank_cap(3) == 3
