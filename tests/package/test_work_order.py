"""The order in which the test command hands units of work to its two workers (conftest.py)."""
import importlib.util
from pathlib import Path

# by its path: ``import conftest`` finds whichever test folder's conftest came first
_spec = importlib.util.spec_from_file_location("package_conftest", Path(__file__).with_name("conftest.py"))
_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)
unit_of, work_order = _conftest.unit_of, _conftest.work_order


def test_timed_modules_form_one_unit_and_split_modules_one_unit_a_test():
    assert unit_of("tests/package/test_domino_wrong_caught.py::test_x[a]") == "timed"
    assert unit_of("tests/package/test_bench_domino.py::test_y") == "timed"
    assert unit_of("tests/package/test_model.py::test_z[1]") == "tests/package/test_model.py"
    nb = "tests/package/test_notebooks.py::test_notebook_runs[06_domino]"
    assert unit_of(nb) == nb


def test_timed_first_then_longest_first_and_the_browser_held_back():
    units = {"timed": 40, "tests/package/test_browser.py": 7, "tests/package/test_a.py": 3,
             "tests/package/test_b.py": 2, "tests/package/test_c.py": 9,
             "tests/package/test_notebooks.py::run[06]": 1,
             "tests/package/test_notebooks.py::run[07]": 1}
    seconds = {"modules": {"test_browser": 90.0, "test_a": 200.0, "test_b": 150.0, "test_c": 9.0,
                           "test_notebooks": 80.0},
               "tests": {"tests/package/test_notebooks.py::run[06]": 60.0}}
    order = work_order(units, seconds)
    assert order[0] == "timed"
    # longest first; a recorded test keeps its own seconds (60), its unrecorded sibling the
    # module's rest (20); the browser (90 s) goes where what is left after it takes as long
    # (60 + 20 + 9 s)
    assert order[1:] == ["tests/package/test_a.py", "tests/package/test_b.py",
                         "tests/package/test_browser.py",
                         "tests/package/test_notebooks.py::run[06]",
                         "tests/package/test_notebooks.py::run[07]", "tests/package/test_c.py"]
    assert sorted(order) == sorted(units)


def test_nothing_recorded_orders_by_the_number_of_tests():
    units = {"tests/package/test_a.py": 1, "tests/package/test_b.py": 5}
    assert work_order(units, {}) == ["tests/package/test_b.py", "tests/package/test_a.py"]


def test_the_autograder_goes_last_and_every_other_test_keeps_its_place():
    from types import SimpleNamespace
    ids = ["tests/package/test_autograder.py::test_hang", "tests/package/test_bench_x.py::t",
           "tests/package/test_autograder.py::test_full", "tests/package/test_zz.py::t"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    _conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == [ids[1], ids[3], ids[0], ids[2]]


def test_the_site_waits_for_the_grading_stages_time_of_work():
    units = {"timed": 40, "tests/package/test_a.py": 3, "tests/package/test_b.py": 2,
             "tests/package/test_site.py": 2, "tests/package/test_c.py": 9,
             "tests/package/test_browser.py": 7}
    seconds = {"modules": {"test_a": 300.0, "test_b": 150.0, "test_site": 100.0, "test_c": 9.0,
                           "test_browser": 5.0}}
    # the site's 100 s would go third; it waits until a and b (450 s >= GRADING_S) are out
    # (the browser, held back to the end, does not count: in run 23 it did, and the site went
    # second, beside the grading stages)
    assert work_order(units, seconds) == ["timed", "tests/package/test_a.py",
                                          "tests/package/test_b.py", "tests/package/test_site.py",
                                          "tests/package/test_c.py", "tests/package/test_browser.py"]
