"""Lab ``ep_overlap``'s three overlap variants (the reference) equal the single-device layer,
and hide what they claim to hide.

* ``ep_moe_shared_overlap``: the shared expert runs while the dispatch travels, forward and
  backward; ``ep_moe_deferred_wgrad``: the experts' weight gradients run while the dispatch's
  backward travels; ``TwoBatchMoE``: two micro-batches against each other (with and without the
  deferred weight gradients), in ``two_batch_schedule``'s order.
* Numerics, in fp64 on 2 and 4 warm ranks, to 1e-12: output, input gradient, each expert's
  gradient, and the router's and shared expert's summed over the ranks, against
  ``workbook.model.moe.MoE`` with one capacity group per rank (per micro-batch for two
  micro-batches). The skewed cases leave the last rank without a single token.
* Structure, by program order (``workbook.link.program_order``): on the simulated link, the
  transfers each variant hides are not waited on before a matrix product ran.
* The schedule: the reference passes the given check, and a schedule that waits for A's dispatch
  before B computes is refused with a message that says what to move.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from test_ep_dispatch import FAST, SOL, close, setup

from workbook import link
from workbook.expert_parallel import (ScheduleError, check_schedule, exposed_transfers,
                                      local_moe, rank_rows)
from workbook.link.program_order import CountGemms, waited_at_once
from workbook.model import MoE

# (style, E, k, capacity factor, shared expert, skewed: the last rank's experts get no token)
CASES = {
    2: [("llama", 4, 2, None, True, False), ("gpt", 8, 2, 0.75, True, False),
        ("gpt", 4, 2, None, True, True)],
    4: [("gpt", 8, 2, 0.75, True, False), ("llama", 8, 1, 0.5, True, True)],
}
VARIANTS = ("shared_overlap", "deferred_wgrad", "two_batch", "two_batch_deferred")


def _layer_fn(variant, layer):
    if variant == "shared_overlap":
        return lambda x: SOL.ep_moe_shared_overlap(layer, x)
    if variant == "deferred_wgrad":
        return lambda x: SOL.ep_moe_deferred_wgrad(layer, x)
    return SOL.TwoBatchMoE(layer, deferred_wgrad=variant == "two_batch_deferred")


def distributed_variants(ep_cases):
    """Every (variant, case) on this rank: output, input gradient, parameter gradients, and per
    token all-to-all of the link's log (not the counts'), whether it was waited at once, and the
    bytes this rank's forward dispatch received (both micro-batches')."""
    rank, ep = dist.get_rank(), dist.get_world_size()
    link.set_link(FAST)
    results = {}
    try:
        for variant in VARIANTS:
            for c, case in enumerate(ep_cases):
                cfg, moe, x, g = setup(case, ep)
                rows = rank_rows(x.shape[0], rank, ep)
                layer = local_moe(cfg, moe, rank, ep)
                xr = x[rows].clone().requires_grad_()
                before = len(link.op_log())
                with CountGemms():
                    y = _layer_fn(variant, layer)(xr)
                    y.backward(g[rows])
                moved = [r for r in link.op_log()[before:]
                         if r.op == "all_to_all" and r.size_bytes != moe.num_experts * 8]
                tokens = [waited_at_once(r) for r in moved]
                received = moved[0].recv_bytes + (moved[1].recv_bytes if "two" in variant else 0)
                grads = {n: p.grad.clone() for n, p in layer.named_parameters()}
                results[variant, c] = (y.detach(), xr.grad, grads, tokens, received)
    finally:
        link.set_link(None)
    return results


def reference(case, ep, groups):
    cfg, moe, x, g = setup(case, ep)
    layer = MoE(cfg, moe)
    xr = x.clone().requires_grad_()
    y = layer(xr, groups=groups)
    y.backward(g)
    return layer, y.detach(), xr.grad


# which token transfers, in issue order (the forward's, then the backward's), are waited at once
AT_ONCE = {
    "shared_overlap": [False, True, True, False],     # dispatch hidden by the shared expert
    "deferred_wgrad": [True, True, True, False],      # the dispatch's backward, by the wgrad
    # A.dispatch, B.dispatch, A.combine, B.combine | A.comb', B.comb', A.disp', B.disp'
    "two_batch": [False, False, False, True, True, False, False, False],
}
AT_ONCE["two_batch_deferred"] = AT_ONCE["two_batch"]


@pytest.mark.parametrize("ep", sorted(CASES))
def test_variants_equal_the_reference_and_hide(ep):
    from workbook.runtime import launch
    per_rank = launch.run(distributed_variants, ep, CASES[ep], backend="gloo", pool=True)
    for c, case in enumerate(CASES[ep]):
        for variant in VARIANTS:
            groups = 2 * ep if variant.startswith("two_batch") else ep
            layer, y, gx = reference(case, ep, groups)
            want = {n: p.grad for n, p in layer.named_parameters()}
            summed = {}
            for rank in range(ep):
                got_y, got_gx, grads, tokens, received = per_rank[rank][variant, c]
                if case[5] and rank == ep - 1:
                    assert received == 0, f"{variant}, case {case}: the last rank got tokens"
                rows = rank_rows(y.shape[0], rank, ep)
                where = f"{variant}, case {case}, rank {rank}"
                close(got_y, y[rows], f"{where}: output")
                close(got_gx, gx[rows], f"{where}: input gradient")
                for name, grad in grads.items():
                    if name.startswith("experts."):
                        close(grad, want[name], f"{where}: {name}")
                    else:
                        summed[name] = summed.get(name, 0) + grad
                assert tokens == AT_ONCE[variant], \
                    f"{where}: token all-to-alls waited at once {tokens}, want {AT_ONCE[variant]}"
            for name, grad in summed.items():
                close(grad, want[name], f"{variant}, case {case}: {name} summed over the ranks")


def test_the_reference_schedules_pass_the_check_and_hide_all_but_one_transfer():
    for phase, deferred in (("forward", False), ("backward", False), ("backward", True)):
        schedule = SOL.two_batch_schedule(phase, deferred)
        check_schedule(schedule, phase, deferred)
        assert exposed_transfers(schedule) == (["B.combine"] if phase == "forward"
                                               else ["A.combine"]), (phase, deferred)


def test_the_check_refuses_waiting_for_A_before_B_computes():
    bad = [("compute", "A", "router"), ("start", "A", "dispatch"), ("wait", "A", "dispatch"),
           ("compute", "B", "router"), ("start", "B", "dispatch"), ("compute", "A", "experts"),
           ("start", "A", "combine"), ("wait", "B", "dispatch"), ("compute", "B", "experts"),
           ("start", "B", "combine"), ("wait", "A", "combine"), ("wait", "B", "combine")]
    with pytest.raises(ScheduleError) as err:
        check_schedule(bad, "forward")
    message = str(err.value)
    assert "\n" not in message
    assert "wait A.dispatch" in message and "compute B.router" in message
    assert "travel while B computes" in message


@pytest.mark.parametrize("schedule, says", [
    ([("start", "A", "dispatch")], "before compute A.router"),
    ([("compute", "A", "router")] * 2, "appears twice"),
    ([("compute", "A", "router")], "never runs start A.dispatch"),
    ([("compute", "C", "router")], "not an action of the forward pass"),
    (["compute A.router"], r"not a \(kind, micro_batch, step\) tuple"),
    (None, "must be a list of"),
])
def test_the_check_names_what_does_not_run(schedule, says):
    with pytest.raises(ScheduleError, match=says):
        check_schedule(schedule, "forward")


def test_a_missing_shared_expert_is_a_one_line_error():
    cfg, moe, _, _ = setup(("gpt", 4, 2, None, False, False), 1)
    with pytest.raises(ValueError, match="needs a shared expert"):
        SOL.ep_moe_shared_overlap(local_moe(cfg, moe, 0, 1), torch.zeros(2, 16))


def test_the_check_refuses_a_backward_that_waits_for_a_combine_before_the_other_computes():
    bad = [("start", "A", "combine"), ("start", "B", "combine"), ("wait", "A", "combine"),
           ("compute", "A", "experts"), ("start", "A", "dispatch"), ("wait", "A", "dispatch"),
           ("wait", "B", "combine"), ("compute", "B", "experts"), ("start", "B", "dispatch"),
           ("compute", "A", "router"), ("wait", "B", "dispatch"), ("compute", "B", "router")]
    with pytest.raises(ScheduleError) as err:
        check_schedule(bad, "backward")
    assert "A.combine, A.dispatch" in str(err.value)
    assert "wait for A.dispatch only after the other micro-batch has computed" in str(err.value)


def test_the_schedule_check_needs_no_torch():
    import subprocess
    import sys
    code = ("import sys; from workbook.expert_parallel import check_schedule; "
            "assert 'torch' not in sys.modules, 'the schedule check imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("style", ["gpt", "llama"])
def test_deferred_expert_weight_gradients_equal_autograds(style):
    from workbook.expert_parallel import ExpertGradStore, run_experts, run_experts_deferred
    cfg, moe, _, _ = setup((style, 4, 2, None, False, False), 1)
    plain, deferred = MoE(cfg, moe), MoE(cfg, moe)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(9, 16, generator=gen, dtype=torch.float64)
    g = torch.randn(9, 16, generator=gen, dtype=torch.float64)
    counts = [4, 0, 3, 2]                       # expert 1 gets no row
    run_experts(plain.expert_list(), x, counts).backward(g)
    store = ExpertGradStore()
    xd = x.clone().requires_grad_()
    with store.deferring("A"):
        run_experts_deferred(deferred.expert_list(), xd, counts, store).backward(g)
    assert all(p.grad is None for n, p in deferred.named_parameters() if ".experts." in n
               or n.startswith("experts.")), "a weight gradient was computed before the flush"
    assert store.pending() == ["A"]
    linears = 2 if style == "gpt" else 3
    assert store.flush("A") == 4 * linears and store.pending() == []
    want = dict(plain.named_parameters())
    for name, p in deferred.named_parameters():
        if name.startswith("experts."):
            close(p.grad, want[name].grad, f"{style}: {name}")
