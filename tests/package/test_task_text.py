"""Labs that teach: the task text is a spec, the hints come on request, every lab has a challenge.

The figure is ``workbook.instructor.task_text``'s: the share of each answer's identifiers that the
task's text in the generated lab writes as code. At ``standard`` (what a learner gets by default)
the text is a spec: at most 5 % on average and 15 % for any task. ``guided`` inlines near-code
hints, so it names far more: that is its point, and the test checks it still does.
"""
import pytest

from workbook.grading.labs import LABS, repo_root
from workbook.grading.markup import parse
from workbook.instructor import assign, task_text

SOLUTIONS = repo_root() / "solutions"


@pytest.fixture(scope="module")
def standard():
    return task_text.lab_shares(SOLUTIONS, "standard")


def test_the_standard_text_is_a_spec_not_the_answer(standard):
    mean = sum(s.share for s in standard) / len(standard)
    worst = sorted(standard, key=lambda s: -s.share)[:5]
    assert mean <= 0.05, f"{mean:.1%} of the answers' identifiers named on average; most: " + \
        "; ".join(f"{s.lab} {s.task} {s.share:.0%} ({', '.join(sorted(s.named))})" for s in worst)
    over = [f"{s.lab} {s.task}: {s.share:.0%} ({', '.join(sorted(s.named))})"
            for s in standard if s.share > 0.15]
    assert not over, "tasks whose text names more than 15 % of their answer: " + "; ".join(over)


def test_guided_still_gives_the_near_code_hints(standard):
    guided = task_text.lab_shares(SOLUTIONS, "guided")
    assert len(guided) == len(standard)
    assert sum(s.share for s in guided) / len(guided) >= 0.15


def test_every_block_has_three_hint_rungs():
    missing = []
    for lab in LABS:
        blocks, _ = parse((SOLUTIONS / f"{lab}.py").read_text(), f"{lab}.py")
        missing += [f"{lab}.{b.where} (line {b.begin + 1}): hint {k + 1}"
                    for b in blocks for k in range(3) if not b.rungs[k].strip()]
    assert not missing, "blocks without all three hint rungs: " + "; ".join(missing)


def test_every_lab_has_a_challenge_of_at_least_20_lines():
    labs = assign.make_labs(SOLUTIONS, level="challenge")
    for lab in LABS:
        regions = [t for t in labs[f"{lab}.py"].tasks if t.region]
        assert regions, f"solutions/{lab}.py has no ### BEGIN CHALLENGE region"
        for t in regions:
            assert t.learner_lines >= assign.MIN_CHALLENGE_LINES, (lab, t.title(), t.learner_lines)


@pytest.mark.parametrize("level", assign.LEVELS)
def test_every_lab_generates_and_compiles_at_every_level(level):
    for rel, lab in assign.make_labs(SOLUTIONS, level=level).items():
        text = lab.text if isinstance(lab, assign.Lab) else lab
        compile(text, rel, "exec")
        if isinstance(lab, assign.Lab):
            assert assign.level_of(text) == level
            assert not any(m in text for m in ("### BEGIN", "### END", "### hint")), rel


def test_the_metric_sees_code_not_prose():
    assert task_text.named_as_code("every parameter's gradient, the model's parameters") == set()
    assert task_text.named_as_code("``p.grad`` then all_reduce(x) and `self.n`, buf[i]") >= \
        {"p", "grad", "all_reduce", "n", "buf"}
    assert task_text.identifiers("dist.all_reduce(p.grad, async_op=True)") == \
        {"dist", "all_reduce", "p", "grad", "async_op"}
