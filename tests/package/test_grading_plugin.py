"""The grader: points, --impl, the score table, Gradescope output, one-line TODO failures."""
import json
import subprocess
import sys
import textwrap

GRADER_TESTS = textwrap.dedent('''
    import pytest
    from workbook.grading import load_lab

    @pytest.mark.points(2)
    def test_adds():
        assert load_lab("toy").add(2, 3) == 5

    @pytest.mark.points(3)
    def test_multiplies():
        assert load_lab("toy").mul(2, 3) == 6

    @pytest.fixture
    def broken():
        raise RuntimeError("setup went wrong")

    @pytest.mark.points(1)
    def test_with_broken_setup(broken):
        pass

    def test_ungraded():
        pass
''')


def run_grader(tmp_path, lab_source):
    impl = tmp_path / "impl"
    impl.mkdir(exist_ok=True)
    (impl / "toy.py").write_text(lab_source)
    (tmp_path / "test_toy.py").write_text(GRADER_TESTS)
    results = tmp_path / "results.json"
    # -p no:nbmake: the dev extra's notebook plugin is 2-3 s of CPU to import, for nothing here
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:nbmake",
                          "-p", "no:cacheprovider", str(tmp_path / "test_toy.py"),
                          "--impl", str(impl), "--gradescope", str(results)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    return out.stdout, json.loads(results.read_text())


def test_points_table_and_gradescope(tmp_path):
    source = textwrap.dedent('''
        def add(a, b):
            return a + b

        def mul(a, b):
            raise NotImplementedError("not implemented yet: toy.mul")
    ''')
    stdout, res = run_grader(tmp_path, source)
    assert res["score"] == 2 and res["max_score"] == 6
    by_name = {t["name"].split("::")[1]: t for t in res["tests"]}
    assert by_name["adds"] == {"name": "toy::adds", "score": 2.0,
                               "max_score": 2.0, "status": "passed", "output": ""}
    assert by_name["multiplies"]["output"] == "not implemented yet: toy.mul"
    assert by_name["with_broken_setup"]["score"] == 0
    assert "setup went wrong" in by_name["with_broken_setup"]["output"]
    assert "ungraded" not in by_name
    assert "TOTAL" in stdout and "2 / 6" in stdout
    assert "not implemented yet: toy.mul" in stdout
    assert "Traceback" not in stdout
    assert stdout.count("not implemented yet: toy.mul") == 1          # each failure listed once


def test_solutions_cannot_be_imported_while_grading_labs(tmp_path):
    source = textwrap.dedent('''
        from solutions.toy import add          # a shortcut the grader must refuse

        def mul(a, b):
            return a * b
    ''')
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "toy.py").write_text("def add(a, b):\n    return a + b\n")
    stdout, res = run_grader(tmp_path, source)
    assert res["score"] == 0
    assert any("solutions/ is not importable" in t["output"] for t in res["tests"])


def test_a_missing_impl_folder_is_one_clear_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "workbook.cli", "grade", "--impl",
                          str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "--impl must be labs, solutions or a folder of lab files" in out.stderr
    assert "Traceback" not in out.stderr


def test_unknown_lab_and_preset_in_the_cli():
    out = subprocess.run([sys.executable, "-m", "workbook.cli", "run", "telepathy"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown lab 'telepathy'" in out.stderr
    out = subprocess.run([sys.executable, "-m", "workbook.cli", "run", "collectives", "--nproc", "0",
                          "--impl", "solutions"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--nproc must be a whole number, at least 1" in out.stderr
