"""Assignment generation: stubs from solutions, and CI's drift check."""
import textwrap

import pytest

from workbook import assign

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
