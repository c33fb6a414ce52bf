"""Lab ``ep_overlap``'s grader (staged as ``tests/grading/test_ep_overlap.py.draft`` until the lab
is registered) passes the reference and catches each wrong lab with words that teach.

The lab has no ``LABS`` entry, no ``solutions/ep_overlap.py`` and no registered grader yet, so
this test stages them in a temporary folder: the grader is copied there as
``test_ep_overlap.py`` (the self-check engine's ``checks_path`` pointed at it), the reference
(``solutions/ep_overlap.py.draft``) as ``ref/ep_overlap.py`` and each wrong lab of
``tests/grading/wrong/ep_overlap_*`` as ``<folder>/ep_overlap.py``, its
``run_reference_in(globals(), "ep_overlap")`` line executing the draft instead (the same code).
``WORKBOOK_IMPL`` names the folder, so every rank imports it through ``load_lab``, which needs no
``LABS`` entry. Once the lab is registered, the staged paths resolve to the real files.

* the reference: every check passes, on 2 and 4 ranks, overlap included;
* dispatch_not_unpermuted (rows left source-major) -> ``ep_moe``'s numbers, and, numbers
  first, its traffic;
* splits_swapped (``all_to_all_single``'s splits in the wrong order) -> every variant built on
  ``AllToAll`` (ep_moe, shared expert, deferred wgrad) raises on the ranks, told which split
  goes first; their traffic and overlap not graded;
* router_weights_detached -> the same three variants' numbers, on the router's gradient;
* two_batch_waits_for_a -> the two schedule tests only (the order test runs the given check
  first; the executor runs the grader's order, so its numbers pass);
* shared_after_wait -> the shared-expert overlap test only, on structure (program order);
* wgrad_after_wait (the deferred weight gradients flushed after the wait) -> the deferred-wgrad
  overlap test only, on structure.

Each wrong lab runs under a cap of 2 ranks and only the checks its mistake can reach (plus one
it must pass), on the warm rank pools, in this process.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAB = "ep_overlap"
WRONG = ROOT / "tests" / "grading" / "wrong"
NOT_GRADED = "not graded until the numbers are right"
REFERENCE_LINE = f'run_reference_in(globals(), "{LAB}")'


def _first(*candidates: str) -> Path:
    return next(ROOT / c for c in candidates if (ROOT / c).exists())


REFERENCE = _first(f"solutions/{LAB}.py", f"solutions/{LAB}.py.draft")
GRADER = _first(f"tests/grading/test_{LAB}.py", f"tests/grading/test_{LAB}.py.draft")


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """The grader as a checks file, and a function that stages a lab folder for grading."""
    root = tmp_path_factory.mktemp("ep_overlap_staged")
    checks = root / f"test_{LAB}.py"
    shutil.copy(GRADER, checks)

    def lab_folder(name: str) -> Path:
        folder = root / name
        folder.mkdir(exist_ok=True)
        if name == "ref":
            text = REFERENCE.read_text()
        else:
            text = (WRONG / name / f"{LAB}.py").read_text()
            assert REFERENCE_LINE in text, f"{name}: a wrong lab starts from the reference"
            if not (ROOT / "solutions" / f"{LAB}.py").exists():     # staged: run the draft
                run_draft = (f"exec(compile(open({str(REFERENCE)!r}).read(), {str(REFERENCE)!r}, "
                             f"'exec'), globals())")
                text = text.replace(REFERENCE_LINE, run_draft)
        (folder / f"{LAB}.py").write_text(text)
        return folder
    return checks, lab_folder


def verdicts(staged, monkeypatch, name: str, only=None, max_ranks=None) -> list:
    """The self-check engine's verdicts on the staged lab folder ``name``, timed."""
    from workbook.grading import engine
    from workbook.grading.labs import ENV_IMPL
    checks, lab_folder = staged
    monkeypatch.setattr(engine, "checks_path", lambda lab: checks)
    monkeypatch.setenv(ENV_IMPL, str(lab_folder(name)))
    if max_ranks:
        monkeypatch.setenv(engine.ENV_MAX_RANKS, str(max_ranks))
    else:
        monkeypatch.delenv(engine.ENV_MAX_RANKS, raising=False)
    times, last = {}, [time.monotonic()]

    def timed(v):
        times[v.name] = time.monotonic() - last[0]
        last[0] = time.monotonic()
    out = engine.run_checks(LAB, only=only, on_verdict=timed)
    print(f"\n{name}: " + ", ".join(f"{n} {t:.1f}s" for n, t in times.items()))
    return out


def test_the_reference_passes_every_check(staged, monkeypatch):
    from workbook.grading import engine
    found = verdicts(staged, monkeypatch, "ref")
    failed = [f"{v.name}: {v.status}: {v.message[:600]}" for v in found
              if v.status != engine.PASSED]
    assert not failed, failed
    names = {v.name.split("[")[0] for v in found}
    assert {"two_batch_schedule_hides", "ep_moe_numbers", "traffic_ep_moe",
            "two_batch_hides"} <= names and len(found) == 17, sorted(names)
    assert sum(v.points for v in found) > 0


NUMBERS = ("ep_moe_numbers", "shared_overlap_numbers", "deferred_wgrad_numbers")
CASES = {
    "ep_overlap_dispatch_not_unpermuted": (
        ("ep_moe_numbers", "traffic_ep_moe", "two_batch_numbers"), {
            "ep_moe_numbers": ["ep_moe (", "expert by expert", "plan's order",
                               "lesson 13, sections 2 to 4"],
            "traffic_ep_moe": [NOT_GRADED, "fix ep_moe_numbers first"]}),
    "ep_overlap_splits_swapped": (
        (*NUMBERS, "two_batch_numbers", "traffic_ep_moe", "deferred_wgrad_hides_backward"), {
            **{n: ["raised", "output_split_sizes, input_split_sizes",
                   "what this rank receives first", "lesson 13, section 3"] for n in NUMBERS},
            "traffic_ep_moe": [NOT_GRADED],
            "deferred_wgrad_hides_backward": [NOT_GRADED, "fix deferred_wgrad_numbers first"]}),
    "ep_overlap_router_weights_detached": (
        (*NUMBERS, "two_batch_numbers", "shared_expert_hides_dispatch"), {
            **{n: ["router's gradient", "never detach them", "lesson 13, section 3"]
               for n in NUMBERS},
            "shared_expert_hides_dispatch": [NOT_GRADED]}),
    "ep_overlap_two_batch_waits_for_a": (
        ("two_batch_schedule_hides", "two_batch_schedule_order", "two_batch_numbers"), {
            "two_batch_schedule_hides": ["two_batch_schedule('forward')", "wait A.dispatch",
                                         "compute B.router", "lesson 13, section 7"],
            "two_batch_schedule_order": ["two_batch_schedule('forward')", "wait A.dispatch"]}),
    "ep_overlap_wgrad_after_wait": (
        ("deferred_wgrad_numbers", "deferred_wgrad_hides_backward"), {
            "deferred_wgrad_hides_backward": ["the dispatch's backward", "waited on right after it "
                                              "started", "flush the store", "lesson 13, section 6"]}),
    "ep_overlap_shared_after_wait": (
        ("shared_overlap_numbers", "shared_expert_hides_dispatch"), {
            "shared_expert_hides_dispatch": ["the dispatch's all-to-all was waited on right "
                                             "after it started", "between StartAllToAll and "
                                             "WaitAllToAll", "lesson 13, section 5"]}),
}


@pytest.mark.parametrize("folder", sorted(CASES))
def test_a_wrong_lab_fails_exactly_its_checks(staged, monkeypatch, folder):
    from workbook.grading import engine
    only, expected = CASES[folder]
    found = verdicts(staged, monkeypatch, folder, only, max_ranks=2)
    assert found, "no check ran"
    failed = {v.name.split("[")[0] for v in found if v.status != engine.PASSED}
    assert failed == set(expected), (
        f"{folder}: expected exactly {sorted(expected)} to fail, got "
        + "; ".join(f"{v.name}: {v.status}: {v.message[:300]}" for v in found
                    if v.status != engine.PASSED))
    for v in found:
        if v.status == engine.PASSED:
            continue
        assert v.status == engine.FAILED, f"{folder}: {v.name} is {v.status}: {v.message[:800]}"
        for word in expected[v.name.split("[")[0]]:
            assert word in v.message, \
                f"{folder}: {v.name}'s message lacks {word!r}:\n{v.message[:1500]}"


def test_the_staged_wrong_labs_are_all_listed():
    on_disk = {p.name for p in WRONG.glob(f"{LAB}_*") if p.is_dir()}
    assert on_disk == set(CASES), sorted(on_disk ^ set(CASES))


# --------------------------------------------------------------------------- the order, on paper
def _module(name: str, path: Path):
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    loader.exec_module(module)
    return module


def test_the_order_derived_from_the_given_actions_is_the_references():
    grader, sol = _module("ep_overlap_grader", GRADER), _module("ep_overlap_ref", REFERENCE)
    for phase, deferred in grader.PHASES:
        assert grader.hiding_order(phase, deferred) == sol.two_batch_schedule(phase, deferred)


def test_a_schedule_that_hides_in_another_order_is_told_the_rule():
    """Each weight gradient right after its dispatch-backward starts passes the given check,
    but is not the lesson's order: the order test names the step and the rule."""
    import types
    grader, sol = _module("ep_overlap_grader", GRADER), _module("ep_overlap_ref", REFERENCE)
    early = []
    for a in sol.two_batch_schedule("backward", False):
        early.append(a)
        if a[0] == "start" and a[2] == "dispatch":
            early.append(("compute", a[1], "wgrad"))

    def schedule(phase, deferred_wgrad=False):
        return early if (phase, deferred_wgrad) == ("backward", True) else \
            sol.two_batch_schedule(phase, deferred_wgrad)
    lab = types.SimpleNamespace(two_batch_schedule=schedule)
    assert grader.schedule_problem(lab, "backward", True, exact=False) is None
    message = grader.schedule_problem(lab, "backward", True, exact=True)
    assert "step 5 is compute A.wgrad" in message and "wait B.combine there" in message, message
    assert "just before the wait for its own dispatch-backward" in message, message


def test_the_graded_cases_cover_the_issue():
    """E = 4 and 8, k = 1 and 2, drops and none, both styles, on 2 and 4 ranks; and each skewed
    case really leaves the last rank without a token (per rank and per micro-batch)."""
    import torch

    from workbook.model import MoE
    from workbook.model.moe import capacity_keep, route
    grader = _module("ep_overlap_grader", GRADER)
    for n, cases in grader.CASES.items():
        assert {c[1] for c in cases} == {4, 8} and {c[2] for c in cases} == {1, 2}, n
        assert {c[0] for c in cases} == {"gpt", "llama"}, n
        assert {c[3] is None for c in cases} == {True, False}, n
        assert any(c[5] for c in cases), n
        for case in (c for c in cases if c[5]):
            cfg, moe, x, _ = grader.setup(case, n)
            router = MoE(cfg, moe).router.weight.detach()
            for groups in (n, 2 * n):
                r = route(x, router, moe.top_k)
                keep = capacity_keep(r.experts, moe.num_experts, moe.capacity_factor, groups)
                kept = torch.bincount(r.experts[keep], minlength=moe.num_experts)     # [E]
                assert int(kept.view(n, -1)[-1].sum()) == 0, (case, n, groups, kept.tolist())
