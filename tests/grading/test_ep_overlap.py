"""Autograder for lab 13, ``ep_overlap``: the schedule, the numbers, the traffic, the overlap, the
prediction. (``tests/package/test_ep_overlap_grader.py`` grades the reference and the wrong labs
of ``tests/grading/wrong/ep_overlap_*`` with it.)

The schedule (instant, no ranks): ``two_batch_schedule`` for the forward, the backward and the
backward with deferred weight gradients goes through the given ``check_schedule`` (every action
once, dependencies first, no transfer waited on while a compute that did not need it was ready);
then its order is compared with the one the list-scheduling rule of lesson 13, section 7 gives
(``hiding_order``: start a transfer as soon as it can go, compute whatever is ready, wait for the
transfer that started first only when nothing is left to compute; each micro-batch's weight
gradients just before the wait for its own dispatch-backward), derived here from the given
``layer_actions``, so the answer is not written out in the grader.

Numerics (fp64, 2 and 4 ranks, ``local_moe`` per rank, against ``workbook.model.moe.MoE`` on one
device with one capacity group per rank, per micro-batch for two micro-batches): E = 4 and 8,
k = 1 and 2, with and without capacity drops, GPT and Llama experts, with and without a shared
expert, and a case whose inputs are pulled away from the last rank's experts so that it receives
no token at all. ``ep_moe``, ``ep_moe_shared_overlap``, ``ep_moe_deferred_wgrad`` and
``TwoBatchMoE`` (with and without deferred weight gradients, run in ``hiding_order``, so the
executor is graded on its own) must give the output, the input's gradient, each local expert's
gradient and, summed over the ranks, the router's and the shared expert's; ``aux_loss`` too.

Traffic (2 and 4 ranks, from the trace's link spans, whose ``args`` carry the all-to-all's
``split_bytes [sender][receiver]``): per MoE layer, the forward pass exchanges the counts (E
int64) and the tokens there and back, the backward the tokens there and back again; each token
exchange carries routed tokens x hidden x element size bytes between each pair of ranks, the
dropped assignments none. Two micro-batches: the same per micro-batch.

Overlap (fp32, 2 ranks, simulated ``dgx-h100`` link), through the shared timing policy
(``workbook.grading.timing``, docs/timing-checks.md): structure first, by program order (the link
notes how many GEMMs ran between an all-to-all's start and its first wait): the shared expert's
GEMMs between the dispatch's start and its wait (and their backward inside the dispatch's
backward); the deferred weight gradients inside the dispatch's backward; with two micro-batches,
every token exchange but the last of the forward and the first of the backward waited on only
after the other micro-batch computed. Then a floor on the share of the pass's all-to-all link time
hidden, read from the trace, kept low: the structure carries these tests. Numbers first, as in
every lab: traffic and overlap earn nothing while the variant's numerics fail.

Prediction (instant, no ranks): ``predict_dispatch_exposed_ms`` for four uneven dispatches (one
where a rank receives nothing, one where a rank that receives nothing is the busiest sender, one
the shared expert hides entirely) on two link presets, against the model
(``workbook.expert_parallel.ep_overlap_report.dispatch_exposed_model``: the link's own cost of
the uneven all-to-all, less the shared expert's time); a value that equals a known wrong
derivation gets a message naming that term, and one read from the link's cost is refused.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

from workbook.grading.checks import numbers_first
from workbook.grading.engine import graded_size, on_ranks, simulated_link, world_sizes
from workbook.grading.model_checks import raise_if_failed, rank_error, to_cpu
from workbook.grading.overlap_run import profile_lab_step
from workbook.grading.trace_checks import OverlapCheck, trace_root_fixture

LAB = "ep_overlap"
TIMEOUT_S = 90.0
LINK = "dgx-h100"
ATOL = 1e-10                      # fp64; the reference agrees to ~1e-15
H, PER_RANK = 16, 6               # numerics: hidden size, tokens per rank
# (style, E, k, capacity factor, shared expert, skewed: the last rank's experts get no token)
CASES = {
    2: [("gpt", 4, 1, None, False, False), ("llama", 4, 2, None, True, False),
        ("gpt", 8, 2, 0.75, True, False), ("llama", 8, 1, 1.0, True, True),
        ("gpt", 4, 2, None, True, True)],
    4: [("llama", 4, 1, None, False, False), ("gpt", 8, 2, 0.75, True, False),
        ("llama", 8, 2, 0.5, True, True)],
}
VARIANTS = ("ep_moe", "shared_overlap", "deferred_wgrad", "two_batch", "two_batch_deferred")
CALL = {"ep_moe": "ep_moe", "shared_overlap": "ep_moe_shared_overlap",
        "deferred_wgrad": "ep_moe_deferred_wgrad", "two_batch": "TwoBatchMoE",
        "two_batch_deferred": "TwoBatchMoE(deferred_wgrad=True)"}
SECTION = {"ep_moe": "sections 2 and 4", "shared_overlap": "section 5",
           "deferred_wgrad": "section 6", "two_batch": "section 7",
           "two_batch_deferred": "section 7"}
TRAFFIC_CASE = ("gpt", 8, 2, 0.75, True, False)          # drops: a dropped row never travels
#: the share of each pass's all-to-all link time (counts and tokens, summed over the 2 ranks)
#: hidden behind compute: floors under the structure checks, which carry these tests. Over six
#: runs on a busy 2-core machine the reference measured (job figure, lowest to highest):
#: shared expert 26-34 % forward, 43-50 % backward; deferred wgrad 27-48 % backward; two
#: micro-batches 19-39 % forward, 65-83 % backward. A forward can hide at most its dispatch(es):
#: the counts and the last transfer have nothing to hide behind (lesson 13, section 7)
LIMITS = {"shared_overlap": {"forward": 12.0, "backward": 20.0},
          "deferred_wgrad": {"backward": 10.0},
          "two_batch": {"forward": 10.0, "backward": 30.0}}


# --------------------------------------------------------------------------- the schedule
def hiding_order(phase: str, deferred_wgrad: bool = False) -> list[tuple]:
    """The two-micro-batch order lesson 13 (section 7) builds, derived from the given
    ``layer_actions`` by list scheduling: a ready start first (a transfer goes as soon as it
    can), then a ready compute (A before B), and only when nothing is left to compute, the wait
    for the transfer that started first. With ``deferred_wgrad`` each micro-batch's weight
    gradients, which nobody waits for, go last: just before the wait for its own
    dispatch-backward, the transfer they hide."""
    from workbook.expert_parallel import layer_actions
    deps = layer_actions(phase, False)
    order, in_flight = [], []
    while len(order) < len(deps):
        ready = [a for a in deps if a not in order and all(d in order for d in deps[a])]
        pick = next((a for a in ready if a[0] == "start"), None) or \
            next((a for a in ready if a[0] == "compute"), None) or \
            next(a for a in ready if a[0] == "wait" and a[1:] == in_flight[0])
        if pick[0] == "start":
            in_flight.append(pick[1:])
        elif pick[0] == "wait":
            in_flight.remove(pick[1:])
        order.append(pick)
    out = []
    for a in order:                  # the filler goes last: just before the wait it hides
        if deferred_wgrad and a[0] == "wait" and a[2] == "dispatch":
            out.append(("compute", a[1], "wgrad"))
        out.append(a)
    return out


def schedule_problem(lab, phase: str, deferred: bool, exact: bool) -> str | None:
    """Why ``two_batch_schedule(phase, deferred)`` is wrong, or None: the given check first,
    then (``exact``) the order of ``hiding_order``."""
    from workbook.expert_parallel import ScheduleError, check_schedule
    call = f"two_batch_schedule({phase!r}" + (", deferred_wgrad=True)" if deferred else ")")
    got = lab.two_batch_schedule(phase, deferred)
    try:
        check_schedule(got, phase, deferred)
    except ScheduleError as exc:
        return f"{call}: {exc} (lesson 13, section 7)"
    if not exact:
        return None
    got, want = [tuple(a) for a in got], hiding_order(phase, deferred)
    i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if i is None:
        return None
    return (f"{call}: step {i} is {got[i][0]} {got[i][1]}.{got[i][2]}, the order of "
            f"lesson 13, section 7 has {want[i][0]} {want[i][1]}.{want[i][2]} there: start a "
            f"transfer as soon as it can go, compute whatever is ready (A before B), and wait for "
            f"the transfer that started first only when nothing is left to compute"
            + ("; a micro-batch's weight gradients, which nobody waits for, go just before the "
               "wait for its own dispatch-backward, the transfer they hide" if deferred else ""))


PHASES = [("forward", False), ("backward", False), ("backward", True)]


@pytest.mark.points(4)
@pytest.mark.tasks("two_batch_schedule")
def test_two_batch_schedule_hides():
    """Forward, backward, backward with deferred weight gradients: every action once, in
    dependency order, and no transfer waited on while the other micro-batch could compute."""
    from workbook.grading.labs import load_lab
    lab = load_lab(LAB)
    problems = [p for p in (schedule_problem(lab, ph, d, False) for ph, d in PHASES) if p]
    if problems:
        raise AssertionError(problems[0])


@pytest.mark.points(1)
@pytest.mark.tasks("two_batch_schedule")
def test_two_batch_schedule_order():
    """The same three schedules in the order lesson 13 builds (list scheduling)."""
    from workbook.grading.labs import load_lab
    lab = load_lab(LAB)
    problems = [p for p in (schedule_problem(lab, ph, d, True) for ph, d in PHASES) if p]
    if problems:
        raise AssertionError(problems[0])


# --------------------------------------------------------------------------- prediction
#: (link preset, sent_rows [src][dst], hidden, itemsize, shared expert ms): 2 ranks both ways;
#: 4 ranks where rank 3 receives nothing and, sending 210 rows, is the busiest; 3 ranks where
#: the bandwidth term dominates; 4 ranks where rank 2 receives nothing and the shared expert
#: outlasts the exchange (nothing exposed)
PREDICTION_CASES = [
    ("dgx-h100", [[150, 120], [260, 90]], 512, 4, 8.0),
    ("dgx-h100", [[40, 30, 50, 0], [10, 60, 20, 0], [30, 25, 35, 0], [70, 60, 80, 60]], 1024, 2,
     5.0),
    ("dgx-h100", [[100, 300, 200], [400, 50, 0], [350, 0, 60]], 2048, 4, 60.0),
    ("pcie-h100", [[0, 12, 0, 5], [8, 0, 0, 3], [9, 4, 0, 0], [0, 0, 0, 7]], 256, 4, 150.0),
]
PREDICTION_FLOPS = 40e9         # the local matmul rate the links are calibrated to
MODEL_NAMES = ("dispatch_exposed_model", "ep_overlap_report", "all_to_all_time",
               "busiest_rank_bytes")


@pytest.mark.points(2)
@pytest.mark.tasks("predict_dispatch_exposed_ms")
def test_predict_dispatch_exposed_ms():
    """The dispatch's exposed ms behind the shared expert, predicted from the link's alpha-beta
    figures, for four uneven exchanges (a rank receiving nothing among them) on two links:
    equal to the model's."""
    from workbook.expert_parallel.ep_overlap_report import dispatch_exposed_model
    from workbook.grading.labs import load_lab
    from workbook.grading.predictions import judge_prediction, reads_the_model
    from workbook.link.cost_model import make_link
    lab = load_lab(LAB)
    copied = reads_the_model(lab.predict_dispatch_exposed_ms, MODEL_NAMES)
    if copied:
        raise AssertionError(copied)
    for preset, rows, hidden, itemsize, t_shared in PREDICTION_CASES:
        link = make_link(preset, PREDICTION_FLOPS)
        model, mistakes = dispatch_exposed_model(link, rows, hidden, itemsize, t_shared)
        got = lab.predict_dispatch_exposed_ms(link, [list(r) for r in rows], hidden, itemsize,
                                              t_shared)
        problem = judge_prediction(
            got, model, mistakes, what="the dispatch's exposed all-to-all",
            terms="the busiest rank's bytes (the most any rank sends to the others or receives "
                  "from them, rows x hidden x itemsize); the exchange = the link's latency + "
                  "those bytes / its bandwidth, in ms; minus the shared expert's time, not below "
                  "zero (lesson 13, sections 3 and 8)")
        if problem:
            raise AssertionError(
                f"predict_dispatch_exposed_ms(link={preset} ({1e3 * link.latency_s:.3g} ms "
                f"latency, {link.bandwidth_Bps / 1e6:.3g} MB/s), sent_rows={rows}, "
                f"hidden={hidden}, itemsize={itemsize}, t_shared_ms={t_shared}): {problem}")


# --------------------------------------------------------------------------- the cases
def setup(case, ep: int, per_rank: int = PER_RANK, hidden: int = H, dtype=torch.float64,
          widths: tuple = (12, None)):
    """The config, the whole batch ``x [ep * per_rank, H]`` and the output's gradient (``widths``:
    the shared expert's and the experts' inner widths, None: the same); a skewed
    case adds to every token the input that raises the logits of every expert but the last
    rank's (and expert 0's, while k experts are still favoured), so that rank gets no token."""
    from workbook.model import ModelConfig, MoEConfig
    from workbook.model.init import full_weight
    style, E, k, cf, shared, skewed = case
    cfg = ModelConfig(style=style, dtype=str(dtype).split(".")[-1], hidden=hidden, heads=2,
                      ffn_hidden=widths[0])                      # the shared expert's width
    moe = MoEConfig(num_experts=E, top_k=k, capacity_factor=cf, shared_expert=shared,
                    expert_hidden=widths[1])
    gen = torch.Generator().manual_seed(E * 100 + k * 10 + ep)
    x = torch.randn(ep * per_rank, hidden, generator=gen, dtype=dtype)
    if skewed:
        router = full_weight(cfg, "blocks.0.moe.router.weight", (E, hidden)).to(dtype)
        target = torch.ones(E, dtype=dtype)
        target[E - E // ep:] = 0.0
        if target.sum() - 1 >= k:
            target[0] = 0.0
        x = x + torch.linalg.lstsq(router, target.unsqueeze(-1)).solution.squeeze(-1)
    g = torch.randn(ep * per_rank, hidden, generator=gen, dtype=dtype)
    return cfg, moe, x, g


def describe(case) -> str:
    style, E, k, cf, shared, skewed = case
    return (f"{style}, E={E}, k={k}, " + (f"capacity factor {cf}" if cf else "no drops")
            + (", shared expert" if shared else "")
            + (", the last rank receives no token" if skewed else ""))


def layer_fn(lab, variant: str, layer):
    """The variant's layer as a function of this rank's tokens (two micro-batches run in
    ``hiding_order``, whatever ``two_batch_schedule`` returns)."""
    if variant == "ep_moe":
        return lambda x: lab.ep_moe(layer, x)
    if variant == "shared_overlap":
        return lambda x: lab.ep_moe_shared_overlap(layer, x)
    if variant == "deferred_wgrad":
        return lambda x: lab.ep_moe_deferred_wgrad(layer, x)
    deferred = variant == "two_batch_deferred"
    return lab.TwoBatchMoE(layer, None, deferred, forward=hiding_order("forward"),
                           backward=hiding_order("backward", deferred))


def _applies(variant: str, case) -> bool:
    return case[4] or variant != "shared_overlap"          # it needs a shared expert


# --------------------------------------------------------------------------- numerics
class AgreedSplits:
    """While the numbers run, each ``dist.all_to_all_single`` first checks, with every rank of
    its group (one small all-gather), that every rank's splits add up to its tensors and that each
    rank receives from each rank the rows that rank sends it. Split sizes in the wrong order then
    raise the same error on every rank, instead of a local error on some ranks while the others
    wait inside the exchange (a hang)."""

    def __enter__(self):
        import torch.distributed as dist
        self.real = real = dist.all_to_all_single

        def checked(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                    async_op=False):
            n = dist.get_world_size(group)
            send = list(input_split_sizes) if input_split_sizes else [input.shape[0] // n] * n
            recv = list(output_split_sizes) if output_split_sizes else [output.shape[0] // n] * n
            mine = torch.tensor([*send, *recv, input.shape[0], output.shape[0]],
                                device=input.device)
            every = [torch.empty_like(mine) for _ in range(n)]
            dist.all_gather(every, mine, group=group)
            table = torch.stack(every).tolist()                    # [n, 2n + 2]
            for r, row in enumerate(table):
                for what, splits, rows in (("sends", row[:n], row[2 * n]),
                                           ("receives", row[n:2 * n], row[2 * n + 1])):
                    if sum(splits) != rows:
                        raise RuntimeError(
                            f"all_to_all_single's split sizes do not match its tensors: rank {r} "
                            f"{what} splits {splits} (adding up to {sum(splits)} rows) with a "
                            f"tensor of {rows} rows")
                for s in range(n):
                    if row[n + s] != table[s][r]:
                        raise RuntimeError(
                            f"all_to_all_single's split sizes do not match: rank {r} expects "
                            f"{row[n + s]} rows from rank {s}, which sends it {table[s][r]} "
                            f"(rows {row[2 * n]} sent and {row[2 * n + 1]} received on rank {r})")
            return real(output, input, output_split_sizes, input_split_sizes, group=group,
                        async_op=async_op)
        dist.all_to_all_single = checked
        return self

    def __exit__(self, *exc):
        import torch.distributed as dist
        dist.all_to_all_single = self.real


def _run_numbers() -> dict:
    """On every rank: every variant on every case of this world size; what each gave."""
    import torch.distributed as dist

    from workbook.expert_parallel import local_moe, rank_rows
    from workbook.grading.labs import load_lab
    from workbook.runtime.launch import device
    rank, ep, dev = dist.get_rank(), dist.get_world_size(), device()
    lab, out = load_lab(LAB), {}
    for variant in VARIANTS:
        for c, case in enumerate(CASES[ep]):
            if not _applies(variant, case):
                continue
            try:
                cfg, moe, x, g = setup(case, ep)
                rows = rank_rows(x.shape[0], rank, ep)
                layer = local_moe(cfg, moe, rank, ep).to(dev)
                xr = x[rows].to(dev).requires_grad_()
                with AgreedSplits():
                    y = layer_fn(lab, variant, layer)(xr)
                    y.backward(g[rows].to(dev))
                aux = layer.aux_loss
                out[variant, c] = {
                    "y": y.detach(), "gx": xr.grad,
                    "grads": {n: p.grad for n, p in layer.named_parameters()},
                    "aux": None if aux is None else float(aux.detach())}
            except Exception as exc:                  # noqa: BLE001 - judged by the test
                out[variant, c] = rank_error(exc)
    return to_cpu(out)


_REFERENCE: dict = {}


def reference(case, ep: int, groups: int):
    """The single-device layer on the whole batch: output, input gradient, parameter
    gradients, and each rank's load-balancing loss on its own tokens."""
    key = (case, ep, groups)
    if key not in _REFERENCE:
        from workbook.model import MoE
        from workbook.model.moe import load_balancing_loss, route
        cfg, moe, x, g = setup(case, ep)
        layer = MoE(cfg, moe)
        xr = x.clone().requires_grad_()
        y = layer(xr, groups=groups)
        y.backward(g)
        with torch.no_grad():
            routed = [route(x[r * PER_RANK:(r + 1) * PER_RANK], layer.router.weight, moe.top_k)
                      for r in range(ep)]
            aux = [float(load_balancing_loss(rt.probs, rt.experts)) for rt in routed]
        _REFERENCE[key] = (y.detach(), xr.grad, {n: p.grad for n, p in layer.named_parameters()},
                           aux)
    return _REFERENCE[key]


def _err(got, want) -> float:
    if got is None:
        return float("inf")
    if got.shape != want.shape:
        return float("inf")
    return (got - want).abs().max().item() if got.numel() else 0.0


SPLIT_HINT = ("all_to_all_single(output, input, output_split_sizes, input_split_sizes) takes the "
              "splits of what this rank receives first and of what it sends second; swapped, they "
              "describe neither tensor (lesson 13, section 2)")


def _raise_if_failed(entry, rank: int, n: int, what: str) -> None:
    if isinstance(entry, dict) and "error" in entry and "split" in entry["error"].lower():
        raise AssertionError(f"rank {rank}: {what} on {n} ranks raised {entry['error']}: "
                             f"{SPLIT_HINT}\n{entry['traceback']}")
    raise_if_failed(entry, rank, n, what)


def check_numbers(variant: str, n: int) -> None:
    """Judge ``variant`` on ``n`` ranks (the run is shared by every numbers test of that size)."""
    n = graded_size(n, 2, 4)
    per_rank = on_ranks(n, _run_numbers, timeout=TIMEOUT_S, key=("numbers", n))
    two = variant.startswith("two_batch")
    for c, case in enumerate(CASES[n]):
        if not _applies(variant, case):
            continue
        y, gx, want, aux = reference(case, n, 2 * n if two else n)
        what = f"{CALL[variant]} ({describe(case)})"
        entries = [per_rank[r][variant, c] for r in range(n)]
        for r, entry in enumerate(entries):
            _raise_if_failed(entry, r, n, what)
        rows = [slice(r * PER_RANK, (r + 1) * PER_RANK) for r in range(n)]
        ref = "the single-device MoE with " + ("two capacity groups per rank (one per "
                                               "micro-batch)" if two else
                                               "one capacity group per rank")
        for r, entry in enumerate(entries):
            e = _err(entry["y"], y[rows[r]])
            if e > ATOL:
                bad = int(((entry["y"] - y[rows[r]]).abs().amax(-1) > ATOL).nonzero()[0]) \
                    if entry["y"].shape == y[rows[r]].shape else 0
                raise AssertionError(
                    f"rank {r} of {n}: {what}: the output of this rank's token {bad} is off by up "
                    f"to {e:.3g} from {ref}. Each token's output is the router-weighted sum of its "
                    f"own experts' outputs: the rows arrive source by source, and the local "
                    f"experts "
                    f"want them expert by expert (regroup them with the plan's order before "
                    f"run_experts, undo it before they go home); the combine adds each returned "
                    f"row "
                    f"into its own token's row (lesson 13, {SECTION[variant]})")
        summed: dict = {}
        for entry in entries:
            for name, g in entry["grads"].items():
                if not name.startswith("experts.") and g is not None:
                    summed[name] = summed.get(name, 0) + g
        router = "router.weight"
        for name in want:                          # no gradient at all: a zero one (k = 1)
            if not name.startswith("experts."):
                summed.setdefault(name, torch.zeros_like(want[name]))
        if _err(summed[router], want[router]) > ATOL:
            got = summed[router]
            zero = not got.abs().max().item()
            raise AssertionError(
                f"{what} on {n} ranks: the router's gradient, summed over the ranks, "
                + ("is zero" if zero else f"is off by up to {_err(got, want[router]):.3g}")
                + " where the single-device layer's is not. The outputs are right, so the "
                  "gradient is lost on its way back: the combine's product with the router "
                  "weights must stay in the autograd graph (never detach them): with k = 2 "
                  "they carry the router's gradient (lesson 13, section 4)")
        for r, entry in enumerate(entries):
            e = _err(entry["gx"], gx[rows[r]])
            if e > ATOL:
                raise AssertionError(
                    f"rank {r} of {n}: {what}: the input's gradient is off by up to {e:.3g} "
                    f"(right outputs): each row's gradient must travel back the way the row came, "
                    f"the same all-to-all with the send and receive splits swapped (AllToAll's "
                    f"backward; lesson 13, section 4)")
            for name, g in entry["grads"].items():
                if name.startswith("experts.") and _err(g, want[name]) > ATOL:
                    raise AssertionError(
                        f"rank {r} of {n}: {what}: the gradient of local expert parameter {name} "
                        + ("is missing after backward" if g is None else
                           f"is off by up to {_err(g, want[name]):.3g}")
                        + ": every local expert runs on exactly its own rows (zero rows too), "
                          "and deferred weight gradients must all be flushed before backward "
                          f"returns (lesson 13, {SECTION[variant]})")
        for name, g in summed.items():
            if name != router and _err(g, want[name]) > ATOL:
                raise AssertionError(
                    f"{what} on {n} ranks: the shared expert's gradient {name}, summed over the "
                    f"ranks, is off by up to {_err(g, want[name]):.3g}: every rank runs the shared "
                    f"expert once on its own tokens, in the graph (lesson 13, {SECTION[variant]})")
        if not two:
            for r, entry in enumerate(entries):
                if entry["aux"] is None or abs(entry["aux"] - aux[r]) > 1e-9:
                    raise AssertionError(
                        f"rank {r} of {n}: {what}: moe.aux_loss is {entry['aux']}, this rank's "
                        f"load-balancing loss over its own tokens is {aux[r]:.12g}: set "
                        f"moe.aux_loss = load_balancing_loss(probs, experts) (lesson 13, "
                        f"section 1)")


def _numbers_test(variant: str, tasks: tuple, points: float, doc: str):
    @pytest.mark.points(points)
    @pytest.mark.tasks(*tasks)
    @pytest.mark.parametrize("n", [2, 4])
    def test(n):
        check_numbers(variant, n)
    test.__doc__ = doc
    return test


test_ep_moe_numbers = _numbers_test(
    "ep_moe", ("exchange_counts", "AllToAll", "dispatch", "combine", "ep_moe"), 4,
    "ep_moe: the output and every gradient of the single-device layer (fp64).")
test_shared_overlap_numbers = _numbers_test(
    "shared_overlap", ("prepare_dispatch", "StartAllToAll", "WaitAllToAll",
                       "ep_moe_shared_overlap"), 2,
    "ep_moe_shared_overlap: the same numbers, the shared expert inside the dispatch.")
test_deferred_wgrad_numbers = _numbers_test(
    "deferred_wgrad", ("AllToAllThenWgrad", "ep_moe_deferred_wgrad"), 2,
    "ep_moe_deferred_wgrad: the same numbers, the weight gradients deferred.")
test_two_batch_numbers = _numbers_test(
    "two_batch", ("TwoBatchMoE",), 2,
    "TwoBatchMoE: the same numbers with one capacity group per micro-batch.")
test_two_batch_deferred_numbers = _numbers_test(
    "two_batch_deferred", ("TwoBatchMoE",), 1,
    "TwoBatchMoE(deferred_wgrad=True): the same numbers, the weight gradients from the store.")
NUMBERS_TEST = {v: f"{v}_numbers" for v in VARIANTS}


def _numbers_first(variant: str) -> None:
    def numbers():
        for n in (2, 4):
            check_numbers(variant, n)
    numbers_first(numbers, NUMBERS_TEST[variant], once=(LAB, variant))


# --------------------------------------------------------------------------- traffic
def _run_traffic(trace_dir: str, variant: str) -> dict:
    """On every rank: one traced step of ``variant`` on the traffic case, the forward and the
    backward in ranges of their own; the all-to-alls on the trace's link track, per pass."""
    import torch.distributed as dist

    from workbook.expert_parallel import local_moe, rank_rows
    from workbook.grading.labs import load_lab
    from workbook import link
    from workbook.runtime.launch import device
    from workbook.trace.capture import rank_trace
    rank, ep, dev = dist.get_rank(), dist.get_world_size(), device()
    try:
        lab = load_lab(LAB)
        cfg, moe, x, g = setup(TRAFFIC_CASE, ep)
        rows = rank_rows(x.shape[0], rank, ep)
        layer = local_moe(cfg, moe, rank, ep).to(dev)
        xr = x[rows].to(dev).requires_grad_()
        fn = layer_fn(lab, variant, layer)
        dist.barrier()
        with rank_trace(trace_dir, lab=LAB):
            with torch.profiler.record_function("forward"):
                y = fn(xr)
            with torch.profiler.record_function("backward"):
                y.backward(g[rows].to(dev))
    except Exception as exc:                          # noqa: BLE001 - graded by its test
        return rank_error(exc)
    return {"passes": link_all_to_alls(os.path.join(trace_dir, f"rank{rank}.trace.json")),
            "modelled": link.current_link() is not None}


def link_all_to_alls(path: str) -> dict:
    """``{"forward": [split_bytes, ...], "backward": [...]}``: the all-to-all spans of the
    trace's link track, in issue order, by the pass (range) they were issued in."""
    events = json.load(open(path))
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    ranges = {p: [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                  if e.get("name") == p and e.get("ph") == "X" and e.get("cat") != "link"]
              for p in ("forward", "backward")}
    spans = sorted((e for e in events if e.get("cat") == "link" and e.get("name") == "all_to_all"),
                   key=lambda e: e["args"].get("issued_ts", e["ts"]))
    out = {"forward": [], "backward": [], "outside": []}
    for e in spans:
        t = e["args"].get("issued_ts", e["ts"])
        phase = next((p for p, rs in ranges.items() if any(a <= t <= b for a, b in rs)), "outside")
        split = e["args"].get("split_bytes")
        out[phase].append(None if split is None else [list(r) for r in split])
    return out


def expected_traffic(variant: str, ep: int) -> dict:
    """The split_bytes of each pass, in a canonical order (sorted), from the single-device
    routing: per capacity group (a rank, or a micro-batch) the rows each rank sends to each."""
    from workbook.model import MoE
    from workbook.model.moe import capacity_keep, route
    cfg, moe, x, _ = setup(TRAFFIC_CASE, ep)
    E, k, row = moe.num_experts, moe.top_k, cfg.hidden * 8
    groups = 2 if variant.startswith("two_batch") else 1
    router = MoE(cfg, moe).router.weight.detach()
    per_group = []
    for part in range(groups):
        sent = []
        for r in range(ep):
            xs = x[r * PER_RANK:(r + 1) * PER_RANK]
            xs = xs[part * PER_RANK // groups:(part + 1) * PER_RANK // groups]
            rt = route(xs, router, k)
            keep = capacity_keep(rt.experts, E, moe.capacity_factor)
            per_expert = torch.bincount(rt.experts[keep], minlength=E)
            sent.append([int(c) * row for c in per_expert.view(ep, -1).sum(1)])
        per_group.append(sent)
    counts = [[E // ep * 8] * ep for _ in range(ep)]
    there = [m for m in per_group]
    back = [[list(col) for col in zip(*m)] for m in per_group]
    return {"forward": sorted([counts] * groups + there + back),
            "backward": sorted(there + back), "counts": counts, "row": row,
            "tokens": {"forward": there + back, "backward": there + back}}


def _fmt_rows(matrices, row: int) -> str:
    return "; ".join("rows " + str([[b // row for b in r] for r in m]) for m in matrices)


def check_traffic(variant: str, trace_root) -> None:
    _numbers_first(variant)
    for n in world_sizes(2, 4):
        per_rank = on_ranks(n, _run_traffic, str(trace_root / f"traffic-{variant}-{n}"), variant,
                            link=simulated_link(n, LINK), timeout=TIMEOUT_S,
                            key=("traffic", variant, n, str(trace_root)))
        want = expected_traffic(variant, n)
        for rank, res in enumerate(per_rank):
            raise_if_failed(res, rank, n, f"one traced step of {CALL[variant]}")
            if not res["modelled"]:                # NCCL: no simulated link, no split_bytes
                continue
            for phase in ("forward", "backward"):
                got = res["passes"][phase]
                if sorted(got) != want[phase]:
                    tokens = [m for m in got if m != want["counts"]]
                    raise AssertionError(
                        f"rank {rank} of {n}: {CALL[variant]} ({describe(TRAFFIC_CASE)}, H = "
                        f"{H}, fp64), the {phase} pass (from the trace's link spans): "
                        f"{len(got)} all-to-alls ({len(got) - len(tokens)} of the counts), "
                        f"expected {len(want[phase])} "
                        f"({len(want[phase]) - len(want['tokens'][phase])} of "
                        f"the counts); the token "
                        f"exchanges moved {_fmt_rows(tokens, want['row'])} "
                        f"[sender][receiver], expected "
                        f"{_fmt_rows(want['tokens'][phase], want['row'])}. Per MoE layer the "
                        f"forward "
                        f"exchanges the counts (E int64) and the tokens there (dispatch) and back "
                        f"(combine), the backward the tokens there and back again; each carries "
                        f"routed tokens x hidden x element size bytes between each pair of ranks, "
                        f"and a dropped assignment never travels (lesson 13, section 2)")


trace_root = trace_root_fixture("ep_overlap_traces")


@pytest.mark.points(2)
@pytest.mark.tasks("exchange_counts", "dispatch", "combine", "ep_moe")
def test_traffic_ep_moe(trace_root):
    """ep_moe on 2 and 4 ranks: the counts and two token all-to-alls forward, two backward,
    each pair's bytes the routed rows (trace)."""
    check_traffic("ep_moe", trace_root)


@pytest.mark.points(2)
@pytest.mark.tasks("TwoBatchMoE")
def test_traffic_two_batch(trace_root):
    """TwoBatchMoE: the same per micro-batch, nothing more (trace)."""
    check_traffic("two_batch", trace_root)


# --------------------------------------------------------------------------- overlap
OVERLAP_CASE = ("gpt", 4, 1, None, True, False)
OVERLAP_TOKENS, OVERLAP_HIDDEN = 256, 256          # per rank
OVERLAP_WIDTHS = (16 * OVERLAP_HIDDEN, 8 * OVERLAP_HIDDEN)      # shared expert, each expert


def _overlap(trace_dir: str, variant: str) -> dict:
    """One profiled step of ``variant`` (after a warm-up step) on a layer whose compute can
    cover its transfers: which token all-to-alls were waited on before a GEMM ran since their
    start (program order), and the share of each pass's link time hidden (trace)."""
    import torch.distributed as dist

    from workbook.expert_parallel import local_moe, rank_rows
    from workbook.link.program_order import waited_at_once
    rank, ep = dist.get_rank(), dist.get_world_size()
    cfg, moe, x, g = setup(OVERLAP_CASE, ep, OVERLAP_TOKENS, OVERLAP_HIDDEN, torch.float32,
                           OVERLAP_WIDTHS)
    rows = rank_rows(x.shape[0], rank, ep)
    counts_bytes = moe.num_experts * 8

    def step(lab, layer):
        xr = x[rows].clone().requires_grad_()
        fn = layer_fn(lab, variant, layer)
        with torch.profiler.record_function("forward"):
            y = fn(xr)
        with torch.profiler.record_function("backward"):
            y.backward(g[rows])

    def prepare(lab):
        layer = local_moe(cfg, moe, rank, ep)
        step(lab, layer)                                    # warm-up
        return layer
    run = profile_lab_step(LAB, LINK, trace_dir, prepare, step)
    if isinstance(run, dict):
        return run
    tokens = [r for r in run.link_ops if r.op == "all_to_all"
              and not (r.size_bytes == counts_bytes and r.recv_bytes == counts_bytes)]
    return {**run.head(), "at_once": [waited_at_once(r) for r in tokens],
            "never_waited": sum(1 for r in tokens if not r.first_wait_ns),
            **{p: run.figures(p) for p in ("forward", "backward")}}


#: per variant: the token exchanges, in issue order, that must not be waited on before a GEMM
#: ran since their start, with what each one is
HIDDEN = {
    "shared_overlap": {0: ("forward", "the dispatch's all-to-all",
                           "compute the shared expert between StartAllToAll and WaitAllToAll"),
                       3: ("backward", "the dispatch's backward (the rows' gradients going home)",
                           "WaitAllToAll's backward only starts it and StartAllToAll's backward "
                           "waits, so autograd runs the shared expert's backward in between")},
    "deferred_wgrad": {3: ("backward", "the dispatch's backward (the rows' gradients going home)",
                           "start it asynchronously, flush the store of deferred weight "
                           "gradients, and only then wait (AllToAllThenWgrad's backward)")},
    "two_batch": {**{i: ("forward", f"{w}'s all-to-all", "start it, then let the other "
                         "micro-batch compute before waiting (the executor's wait action only)")
                     for i, w in enumerate(("A.dispatch", "B.dispatch", "A.combine"))},
                  **{i + 5: ("backward", f"{w}'s backward all-to-all", "wait for it only in its "
                             "wait action, after the other micro-batch computed")
                     for i, w in enumerate(("B.combine", "A.dispatch", "B.dispatch"))}},
}
WHERE = {v: f"{CALL[v]} (2 ranks, {{link}}, {describe(OVERLAP_CASE)})" for v in LIMITS}


def _structure(variant: str):
    def structure(r: dict, phases=()) -> str | None:
        where = WHERE[variant].format(link=r["link"])
        if r["never_waited"]:
            return (f"rank {r['rank']}: {where}: {r['never_waited']} token all-to-alls were never "
                    f"waited on: until work.wait() returns, the buffer is not filled (lesson 13, "
                    f"section 5)")
        for i, (phase, what, fix) in HIDDEN[variant].items():
            if phases and phase not in phases:
                continue
            if i >= len(r["at_once"]):
                return (f"rank {r['rank']}: {where}: {len(r['at_once'])} token all-to-alls on the "
                        f"link, expected {max(HIDDEN[variant]) + 1} or more")
            if r["at_once"][i]:
                return (f"rank {r['rank']}: {where}: {what} was waited on right after it "
                        f"started, with no matrix product in between, so nothing hid it: {fix} "
                        f"(lesson 13, {SECTION[variant]})")
        return None
    return structure


def _overlap_check(variant: str) -> OverlapCheck:
    return OverlapCheck(
        _overlap, LIMITS[variant], _structure(variant), where=WHERE[variant],
        what="the all-to-all link time issued in the {phase} pass",
        advice={p: f"the exchanges {SECTION[variant]} of lesson 13 hides must travel while the "
                   f"rank computes" for p in LIMITS[variant]},
        link=LINK, timeout=TIMEOUT_S, failed=f"the overlap run of {CALL[variant]}",
        args=(variant,))


@pytest.mark.points(4)
@pytest.mark.tasks("StartAllToAll", "WaitAllToAll", "ep_moe_shared_overlap")
def test_shared_expert_hides_dispatch(trace_root):
    """The shared expert's GEMMs run while the dispatch travels, forward and backward; a floor
    on the hidden share. Graded once its numbers are right."""
    _numbers_first("shared_overlap")
    _overlap_check("shared_overlap").check(trace_root)


@pytest.mark.points(4)
@pytest.mark.tasks("AllToAllThenWgrad", "ep_moe_deferred_wgrad")
def test_deferred_wgrad_hides_backward(trace_root):
    """The experts' weight gradients run while the dispatch's backward travels; a floor on the
    backward's hidden share. Graded once its numbers are right."""
    _numbers_first("deferred_wgrad")
    _overlap_check("deferred_wgrad").check(trace_root)


@pytest.mark.points(5)
@pytest.mark.tasks("TwoBatchMoE")
def test_two_batch_hides(trace_root):
    """Two micro-batches: all but one transfer per pass waited on only after the other
    micro-batch computed; a floor on each pass's hidden share. Graded once its numbers are
    right."""
    _numbers_first("two_batch")
    _overlap_check("two_batch").check(trace_root)
