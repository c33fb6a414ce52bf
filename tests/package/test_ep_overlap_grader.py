"""Lab ``ep_overlap``'s grader (``tests/grading/test_ep_overlap.py``) passes the reference and
catches each wrong lab of ``tests/grading/wrong/ep_overlap_*`` with words that teach.

(That the reference passes every check, on 2 and 4 ranks, is the test command's "grading
solutions/" stage, as for every lab: it is not graded a second time here.)

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
  overlap test only, on structure;
* prediction_total_bytes (the whole exchange's bytes over one link) and
  prediction_nothing_hidden (the shared expert left out) -> the prediction test, the wrong term
  named; prediction_reads_the_model (the link's own cost of the exchange) -> refused.

Each wrong lab runs through the self-check engine in this process, on the warm rank pools,
under a cap of 2 ranks, only the checks its mistake can reach (plus one it must pass).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from wrong_labs import assert_fails_exactly

ROOT = Path(__file__).resolve().parents[2]
LAB = "ep_overlap"
WRONG = ROOT / "tests" / "grading" / "wrong"
NOT_GRADED = "not graded until the numbers are right"
REFERENCE = ROOT / "solutions" / f"{LAB}.py"
GRADER = ROOT / "tests" / "grading" / f"test_{LAB}.py"


NUMBERS = ("ep_moe_numbers", "shared_overlap_numbers", "deferred_wgrad_numbers")
CASES = {
    "ep_overlap_dispatch_not_unpermuted": (
        ("ep_moe_numbers", "traffic_ep_moe", "two_batch_numbers"), {
            "ep_moe_numbers": ["ep_moe (", "expert by expert", "plan's order",
                               "lesson 13, sections 2 and 4"],
            "traffic_ep_moe": [NOT_GRADED, "fix ep_moe_numbers first"]}),
    "ep_overlap_splits_swapped": (
        (*NUMBERS, "two_batch_numbers", "traffic_ep_moe", "deferred_wgrad_hides_backward"), {
            **{n: ["raised", "output_split_sizes, input_split_sizes",
                   "what this rank receives first", "lesson 13, section 2"] for n in NUMBERS},
            "traffic_ep_moe": [NOT_GRADED],
            "deferred_wgrad_hides_backward": [NOT_GRADED, "fix deferred_wgrad_numbers first"]}),
    "ep_overlap_router_weights_detached": (
        (*NUMBERS, "two_batch_numbers", "shared_expert_hides_dispatch"), {
            **{n: ["router's gradient", "never detach them", "lesson 13, section 4"]
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
    "ep_overlap_prediction_total_bytes": (
        ("predict_dispatch_exposed_ms", "two_batch_schedule_hides"), {
            "predict_dispatch_exposed_ms": ["sent_rows=[[150, 120], [260, 90]]",
                                            "the bytes of the whole exchange",
                                            "the busiest rank's bytes set the time"]}),
    "ep_overlap_prediction_nothing_hidden": (
        ("predict_dispatch_exposed_ms", "two_batch_schedule_hides"), {
            "predict_dispatch_exposed_ms": ["t_shared_ms=8.0", "leave the shared expert out",
                                            "nothing overlapped"]}),
    "ep_overlap_prediction_reads_the_model": (
        ("predict_dispatch_exposed_ms", "two_batch_schedule_hides"), {
            "predict_dispatch_exposed_ms": ["calls the package's model (all_to_all_time)",
                                            "derive the figure"]}),
}


@pytest.mark.parametrize("folder", sorted(CASES))
def test_a_wrong_lab_fails_exactly_its_checks(folder):
    only, expected = CASES[folder]
    assert_fails_exactly(folder, LAB, only, expected)


def test_the_wrong_labs_are_all_listed():
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
