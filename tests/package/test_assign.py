"""Assignment generation: stubs from solutions, and CI's drift check."""
import textwrap

import pytest

from workbook.instructor import assign

SOLUTION = textwrap.dedent('''\
    def broadcast(tensor, src):
        """Send ``tensor`` from ``src`` to every rank."""
        ### BEGIN SOLUTION hint: send to every rank but the root
        for peer in range(4):
            pass
        ### END SOLUTION
        return tensor


    class Ring:
        def step(self):
            ### BEGIN SOLUTION
            return 1
            ### END SOLUTION
''')


def test_blocks_become_todos_that_raise():
    stub = assign.strip_solutions(SOLUTION, "collectives", "collectives.py")
    assert "for peer in range" not in stub
    assert "\n    # TODO: send to every rank but the root\n" in stub
    assert '\n    raise NotImplementedError("not implemented yet: collectives.broadcast")' in stub
    assert '\n        raise NotImplementedError("not implemented yet: collectives.Ring.step")' in stub
    assert '"""Send ``tensor`` from ``src`` to every rank."""' in stub
    assert stub.startswith("# Generated from solutions/collectives.py")
    compile(stub, "stub", "exec")
    namespace = {}
    exec(stub, namespace)
    with pytest.raises(NotImplementedError, match="not implemented yet: collectives.broadcast"):
        namespace["broadcast"](None, 0)


@pytest.mark.parametrize("text, message", [
    ("    ### BEGIN SOLUTION\n    x = 1\n", "never closed"),
    ("### END SOLUTION\n", "without a BEGIN"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "nested"),
])
def test_malformed_markers_name_the_line(text, message):
    with pytest.raises(assign.AssignError, match=message):
        assign.strip_solutions(text, "lab", "lab.py")


def test_check_finds_drift(tmp_path):
    solutions, labs = tmp_path / "solutions", tmp_path / "labs"
    solutions.mkdir()
    (solutions / "collectives.py").write_text(SOLUTION)
    assert assign.check(solutions, labs) == ["collectives.py"]
    assert assign.generate(solutions, labs) == ["collectives.py"]
    assert assign.check(solutions, labs) == []
    (labs / "collectives.py").write_text((labs / "collectives.py").read_text() + "# edited\n")
    (labs / "extra.py").write_text("x = 1\n")
    assert assign.check(solutions, labs) == ["collectives.py", "extra.py (not in solutions/)"]


def test_the_repository_labs_match_the_solutions():
    from workbook.grading.labs import repo_root
    root = repo_root()
    assert assign.check(root / "solutions", root / "labs") == []


# --------------------------------------------------------------------------- hints
def test_every_block_in_the_solutions_has_a_hint():
    """A learner meets each block as ``# TODO: <hint>``: none may be bare."""
    from workbook.grading.labs import repo_root
    bare = []
    for path in sorted((repo_root() / "solutions").glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            m = assign.BEGIN.match(line)
            if m and not m["hint"].strip().removeprefix("hint:").strip():
                bare.append(f"solutions/{path.name}:{number}")
    assert not bare, "### BEGIN SOLUTION without a hint at " + ", ".join(bare)


# --------------------------------------------------------------------------- the task list
TESTS = textwrap.dedent('''\
    import pytest

    CASES = [2, 3]


    @pytest.mark.points(4)
    @pytest.mark.tasks("broadcast")
    def test_broadcast():
        pass


    @pytest.mark.points(1)
    @pytest.mark.tasks("broadcast", "Ring.step")
    @pytest.mark.parametrize("n", CASES)
    def test_both(n):
        pass


    def _pair(name, first, second=3):
        @pytest.mark.points(first)
        @pytest.mark.tasks(name)
        def one():
            pass

        @pytest.mark.points(second)
        @pytest.mark.tasks(name)
        def two():
            pass
        return one, two


    test_ring_one, test_ring_two = _pair("Ring", 1)


    def test_ungraded():
        pass
''')


def test_graded_tests_reads_decorators_parametrize_and_made_tests():
    assert assign.graded_tests(TESTS) == {
        "test_broadcast": assign.Graded(4.0, ("broadcast",)),
        "test_both": assign.Graded(2.0, ("broadcast", "Ring.step")),     # 1 point, 2 cases
        "test_ring_one": assign.Graded(1.0, ("Ring",)),
        "test_ring_two": assign.Graded(3.0, ("Ring",)),
    }


def test_the_task_list_gives_each_task_its_share_of_the_points():
    stub = assign.strip_solutions(SOLUTION, "collectives", "collectives.py",
                                  assign.graded_tests(TESTS))
    head = stub.split('"""', 1)[0]
    assert "# Your tasks (10 pts in all):\n" in head
    assert "#   1. broadcast (5 pts): Send `tensor` from `src` to every rank.\n" in head
    assert "#   2. Ring.step (5 pts)\n" in head                    # no docstring, no hint
    compile(stub, "stub", "exec")


def test_a_task_list_without_tasks_marks_has_no_points():
    stub = assign.strip_solutions(SOLUTION, "collectives", "collectives.py",
                                  {"test_x": assign.Graded(2.0, ())})
    assert "# Your tasks:\n#   1. broadcast: Send `tensor` from `src` to every rank.\n" in stub
    assert "pts" not in stub.split('"""', 1)[0]


@pytest.mark.parametrize("graded, message", [
    ({"test_a": assign.Graded(1.0, ("broadcast",)), "test_b": assign.Graded(2.0, ())},
     "test_b has points but no @pytest.mark.tasks"),
    ({"test_a": assign.Graded(1.0, ("combine",))}, "names task 'combine'"),
])
def test_tasks_marks_must_name_the_learners_work(graded, message):
    with pytest.raises(assign.AssignError, match=message):
        assign.strip_solutions(SOLUTION, "collectives", "collectives.py", graded)


def test_long_hints_are_wrapped():
    text = ("def f():\n    ### BEGIN SOLUTION hint: " + "word " * 30 + "`a b c` x + y\n"
            "    pass\n    ### END SOLUTION\n")
    stub = assign.strip_solutions(text, "lab", "lab.py")
    todo = [line for line in stub.splitlines() if line.startswith("    #")]
    assert len(todo) == 2 and all(len(line) <= assign.WIDTH for line in todo)
    assert todo[1].startswith("    #       ")
    assert "`a b c`" in stub and "x + y" in stub


def test_each_labs_task_points_add_up_to_its_grading_total():
    """For every lab whose tests name tasks: each test's points are shared out in full, so the
    task list's total is the lab's total."""
    from workbook.grading.labs import LABS, repo_root
    root = repo_root()
    for lab in LABS:
        graded = assign.graded_tests((root / "tests" / "grading" / f"test_{lab}.py").read_text())
        if not any(g.tasks for g in graded.values()):
            continue
        head = (root / "labs" / f"{lab}.py").read_text().split('"""', 1)[0]
        total = sum(g.points for g in graded.values())
        assert f"# Your tasks ({total:g} pts in all):" in head, (lab, head)
