"""Assignment generation: stubs from solutions at three levels, and CI's drift check."""
import textwrap

import pytest

from workbook.instructor import assign

SOLUTION = textwrap.dedent('''\
    def broadcast(tensor, src):
        """Send ``tensor`` from ``src`` to every rank."""
        ### BEGIN SOLUTION
        ### hint 1: a root and its peers (lesson 1)
        ### hint 2: send to each rank
        ###     but the root
        ### hint 3: send to every rank but the root
        for peer in range(4):
            pass
        ### END SOLUTION
        return tensor


    class Ring:
        def step(self):
            ### BEGIN SOLUTION
            ### hint 1: one
            ### hint 2: two
            ### hint 3: three
            return 1
            ### END SOLUTION
''')

CHALLENGE = textwrap.dedent('''\
    ### BEGIN CHALLENGE: Ring, the whole class
    class Ring:
        """A ring of ranks."""
        size = 4

        def __init__(self, n):
            """Remember ``n``."""
            self.n = n
            self.a = 1
            self.b = 2
            self.c = 3

        def step(self, x):
            # the given part is the learner's too at the challenge level
            y = x + 1
            y = y + 1
            y = y + 1
            y = y + 1
            y = y + 1
            y = y + 1
            y = y + 1
            ### BEGIN SOLUTION
            ### hint 1: one
            ### hint 2: two
            ### hint 3: three
            y = y * 2
            y = y * 2
            y = y * 2
            y = y * 2
            y = y * 2
            y = y * 2
            y = y * 2
            y = y * 2
            y = y * 2
            return y
            ### END SOLUTION
    ### END CHALLENGE


    def helper(v):
        """Twice ``v``."""
        ### BEGIN SOLUTION
        ### hint 1: one
        ### hint 2: two
        ### hint 3: three
        return 2 * v
        ### END SOLUTION
''')


def _run(stub: str) -> dict:
    compile(stub, "stub", "exec")
    namespace: dict = {}
    exec(stub, namespace)
    return namespace


def test_standard_blocks_become_a_raise_and_nothing_else():
    stub = assign.strip_solutions(SOLUTION, "collectives", "collectives.py")
    assert assign.level_of(stub) == "standard"
    assert "for peer in range" not in stub and "TODO" not in stub and "root" not in stub
    assert '\n    raise NotImplementedError("not implemented yet: collectives.broadcast")' in stub
    assert '\n        raise NotImplementedError("not implemented yet: collectives.Ring.step")' in stub
    assert '"""Send ``tensor`` from ``src`` to every rank."""' in stub
    assert stub.startswith("# Generated from solutions/collectives.py")
    with pytest.raises(NotImplementedError, match="not implemented yet: collectives.broadcast"):
        _run(stub)["broadcast"](None, 0)


def test_guided_blocks_show_the_idea_and_a_todo():
    stub = assign.strip_solutions(SOLUTION, "collectives", "collectives.py", level="guided")
    assert "\n    # Idea: a root and its peers (lesson 1)\n" in stub
    assert "\n    # TODO: send to every rank but the root\n" in stub
    assert "send to each rank but the root" not in stub            # hint 2 only on request
    assert assign.level_of(stub) == "guided"
    _run(stub)


def test_hint_rungs_are_read_with_their_continuation_lines():
    lab = assign.make_lab(SOLUTION, "collectives", "collectives.py")
    assert lab.tasks[0].rungs() == [["a root and its peers (lesson 1)"],
                                    ["send to each rank but the root"],
                                    ["send to every rank but the root"]]


def test_challenge_hands_over_every_body_in_the_region():
    stub = assign.strip_solutions(CHALLENGE, "lab", "lab.py", level="challenge")
    assert "# Challenge: Ring, the whole class." in stub
    assert "self.n = n" not in stub and "y = x + 1" not in stub and "given part" not in stub
    assert "###" not in stub
    assert '"""Remember ``n``."""' in stub and "    size = 4" in stub
    assert 'raise NotImplementedError("not implemented yet: lab.Ring.__init__")' in stub
    assert 'raise NotImplementedError("not implemented yet: lab.Ring.step")' in stub
    assert "return 2 * v" not in stub                              # outside: as standard
    ns = _run(stub)
    with pytest.raises(NotImplementedError, match="lab.Ring.__init__"):
        ns["Ring"](2)
    lab = assign.make_lab(CHALLENGE, "lab", "lab.py", level="challenge")
    assert [t.title() for t in lab.tasks] == ["Ring, the whole class", "helper"]
    assert lab.tasks[0].learner_lines == 21
    standard = assign.strip_solutions(CHALLENGE, "lab", "lab.py")
    assert "y = x + 1" in standard and "CHALLENGE" not in standard and "Challenge" not in standard


def test_a_challenge_too_small_is_refused():
    small = CHALLENGE.replace("        y = y * 2\n" * 9, "")
    with pytest.raises(assign.AssignError, match="leaves 12 lines to the learner"):
        assign.strip_solutions(small, "lab", "lab.py", level="challenge")


@pytest.mark.parametrize("text, message", [
    ("    ### BEGIN SOLUTION\n    x = 1\n", "never closed"),
    ("### END SOLUTION\n", "without a BEGIN"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "do not nest"),
    ("### BEGIN SOLUTION\n### hint 4: x\n### END SOLUTION\n", "hints 1 to 3"),
    ("### BEGIN SOLUTION\n### hint 1: x\n### hint 1: y\n### END SOLUTION\n", "each once"),
    ("### hint 1: x\n", "outside the top of a block"),
    ("### BEGIN CHALLENGE: a\nx = 1\n", "never closed"),
    ("### END CHALLENGE\n", "without a BEGIN"),
])
def test_malformed_markers_name_the_line(text, message):
    with pytest.raises(assign.AssignError, match=message):
        assign.strip_solutions(text, "lab", "lab.py")


def test_unknown_level():
    with pytest.raises(assign.AssignError, match="unknown level 'hard'"):
        assign.strip_solutions(SOLUTION, "lab", "lab.py", level="hard")


def test_check_finds_drift(tmp_path):
    solutions, labs = tmp_path / "solutions", tmp_path / "labs"
    solutions.mkdir()
    (solutions / "collectives.py").write_text(SOLUTION)
    assert assign.check(solutions, labs) == ["collectives.py", "hints.json"]
    assert assign.generate(solutions, labs) == ["collectives.py", "hints.json"]
    assert assign.check(solutions, labs) == []
    (labs / "collectives.py").write_text((labs / "collectives.py").read_text() + "# edited\n")
    (labs / "extra.py").write_text("x = 1\n")
    assert assign.check(solutions, labs) == ["collectives.py", "extra.py (not in solutions/)"]


def test_switching_level_never_overwrites_an_edited_lab(tmp_path):
    solutions, labs = tmp_path / "solutions", tmp_path / "labs"
    solutions.mkdir()
    (solutions / "collectives.py").write_text(SOLUTION)
    assign.generate(solutions, labs)
    assert assign.generate(solutions, labs, "guided") == ["collectives.py"]   # unedited: switches
    assert assign.check(solutions, labs) == []                                # at its own level
    edited = (labs / "collectives.py").read_text() + "# my work\n"
    (labs / "collectives.py").write_text(edited)
    with pytest.raises(assign.AssignError, match=r"overwrite your edits in .*collectives.py"):
        assign.generate(solutions, labs, "standard")
    assert (labs / "collectives.py").read_text() == edited                     # nothing written
    assert assign.generate(solutions, labs, "standard", force=True) == ["collectives.py"]
    assert assign.level_of((labs / "collectives.py").read_text()) == "standard"


def test_the_repository_labs_match_the_solutions():
    from workbook.grading.labs import repo_root
    root = repo_root()
    assert assign.check(root / "solutions", root / "labs") == []


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
    assert "#   2. Ring.step (5 pts): one\n" in head        # no docstring: its first hint
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
    stub = assign.strip_solutions(text, "lab", "lab.py", level="guided")
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


@pytest.mark.parametrize("argv, message", [
    (["assign", "--level", "hard"], "invalid choice: 'hard'"),
    (["assign", "-o", "."], "is the course itself"),
])
def test_assign_bad_input_is_one_line(argv, message, capsys, monkeypatch):
    from workbook import cli
    from workbook.grading.labs import repo_root
    monkeypatch.chdir(repo_root())
    try:
        code = cli.main(argv)
    except SystemExit as exc:                   # argparse's own usage error
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
