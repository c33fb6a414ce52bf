"""Lab ``pp_schedules``: the reference schedules' action order equals the order
``torch.distributed.pipelining`` runs for the same (p, v, m), wherever torch has the schedule.

How torch's order is read: torch's own runtime loop runs, and records. For each rank, the test
builds the real schedule class (``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``,
``ScheduleZBVZeroBubble``, ``Schedule1F1B``) on stand-in stages (``RecordingStage``: the stage
index, the group size and rank, and empty lists of sends and receives), then calls the
schedule's ``_step_microbatches``, the loop ``step()`` runs. The multi-stage schedules walk
``pipeline_order_with_comms[rank]`` (the order lowered with its sends and receives) and hand
each compute action to the function registered for its kind with ``register_custom_function``
(torch's hook for custom actions): ours writes the action down. ``Schedule1F1B`` runs its own
hand-written loop, which calls the stage's ``forward_one_chunk`` / ``backward_one_chunk``: the
stand-in writes those down. Only the stages' set-up (``_initialize_stage(s)``: the
point-to-point handshake and shape inference, which need a process group and have no bearing on
the order) is skipped. No process group, no subprocess. (Torch 2.13's ``Schedule1F1B
.pipeline_order``, a list kept for display, is off by one on the last rank -- it starts at
F(1) and ends at F(m) -- which is why the runtime loop is what we compare with.)

Torch names the input-gradient backward ``I`` and the full backward ``B``; we write ``B`` for
both (a schedule with W's splits every backward, one without fuses them: the ``virtual_stages``
docstring), so both map to our B.

The documented differences, and only these, are accepted:

1. ``ScheduleInterleaved1F1B`` with one stage per rank keeps Megatron's interleaved warm-up
   ``2 (p - 1 - r)``; our v = 1 is lab 10's 1F1B (warm-up ``p - 1 - r``), as Megatron-LM runs
   its plain 1F1B when there are no virtual stages. Torch's ``Schedule1F1B`` equals ours.
2. Which (p, v, m) are accepted: torch relaxes Megatron's rule to "m a multiple of
   max(1, m // p)" (micro-batches taken in rounds of m // rounds), for its interleaved
   schedules, so it also runs e.g. p = 2, v = 2, m = 3, which we refuse with Megatron's rule; and
   it applies that rule to ``ScheduleInterleavedZeroBubble`` with one stage per rank too, so it
   refuses e.g. ZB-H1 at p = 3, m = 7, which needs no rounds and which we run.
"""
from __future__ import annotations

import pytest
import torch
from pp_schedules_reference import SOL, ranks

from workbook.pipeline_parallel import B, F, INTERLEAVED, V_SHAPE, W, rank_and_chunk, stage_index

P, M = (2, 3, 4), tuple(range(1, 13))
CHUNKS = {"interleaved_1f1b": (1, 2, 3), "zb_h1": (1, 2, 3), "zbv": (2,)}
TORCH_CLASS = {"interleaved_1f1b": "ScheduleInterleaved1F1B",
               "zb_h1": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble"}
PLACEMENT = {"interleaved_1f1b": INTERLEAVED, "zb_h1": INTERLEAVED, "zbv": V_SHAPE}
KIND = {"F": F, "I": B, "B": B, "W": W}


class RecordingStage:
    """Stands in for rank ``rank``'s ``PipelineStage`` of stage ``stage``: no layers, no
    transfers (every list of send or receive ops is empty); ``log`` gets each forward and
    backward ``Schedule1F1B``'s loop asks of it."""

    def __init__(self, stage: int, num_stages: int, rank: int, p: int, log: list):
        self.stage_index, self.num_stages = stage, num_stages
        self.group_rank, self.group_size = rank, p
        self.is_first, self.is_last = stage == 0, stage == num_stages - 1
        self.submod, self.log = None, log

    def get_fwd_recv_ops(self, i):
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def forward_one_chunk(self, i, *args, **kwargs):
        self.log.append((self.stage_index, "F", i))
        return torch.zeros(())

    def backward_one_chunk(self, i, **kwargs):
        self.log.append((self.stage_index, "B", i))

    def perform_reduce_grad(self, *args):
        pass


def torch_runtime_order(cls_name: str, p: int, v: int, m: int, placement: str):
    """Per rank, the ``(stage, kind, micro_batch)`` compute actions torch's runtime runs, in
    order; or "refused: ..." (the first line of the error) if torch refuses the shape."""
    from torch.distributed.pipelining import schedules as S
    orders = []
    for r in range(p):
        log: list = []
        try:
            if cls_name == "Schedule1F1B":
                sched = S.Schedule1F1B(RecordingStage(r, p, r, p, log), m, loss_fn=lambda y, t: y)
                sched._initialize_stage = lambda *args, **kwargs: None
                sched._step_microbatches(target_mbs=[None] * m)
            else:
                stages = [RecordingStage(stage_index(r, c, p, placement), p * v, r, p, log)
                          for c in range(v)]
                sched = getattr(S, cls_name)(stages, m, loss_fn=lambda y, t: y)
                sched._initialize_stages = lambda *args, **kwargs: None
                for kind in (S.F, S.I, S.B, S.W):
                    sched.register_custom_function(kind, lambda a, ctx: log.append(
                        (a.stage_index, a.computation_type.value, a.microbatch_index)))
                for kind in (S.UNSHARD, S.RESHARD, S.REDUCE_GRAD):        # FSDP's, DP's: none
                    sched.register_custom_function(kind, lambda a, ctx: None)
                sched._step_microbatches()
        except ValueError as exc:
            return "refused: " + str(exc).splitlines()[0]
        orders.append(log)
    return orders


@pytest.fixture(scope="module")
def torch_orders() -> dict:
    from torch.distributed.pipelining import schedules
    missing = [c for c in TORCH_CLASS.values() if not hasattr(schedules, c)]
    if missing:
        pytest.skip(f"this torch has no {', '.join(missing)} (torch >= 2.5 has them)")
    out = {f"{name} {p} {v} {m}": torch_runtime_order(TORCH_CLASS[name], p, v, m, PLACEMENT[name])
           for name, vs in CHUNKS.items() for v in vs for p in P for m in M}
    out |= {f"1f1b {p} 1 {m}": torch_runtime_order("Schedule1F1B", p, 1, m, INTERLEAVED)
            for p in P for m in M if m >= p}
    return out


def ours(name: str, p: int, v: int, m: int):
    """Our order as torch writes it, or "refused: ..." for a shape we reject."""
    schedule, placement = SOL.SCHEDULES[name]
    try:
        return ranks(schedule, p, v, m)
    except ValueError as exc:
        return f"refused: {exc}"


def theirs(torch_orders: dict, key: str, p: int, placement: str):
    """Torch's order for ``key`` as our (kind, micro_batch, chunk) triples, each action checked
    to sit on the rank our placement gives its stage; or "refused: ..."."""
    got = torch_orders[key]
    if isinstance(got, str):
        return got
    out = []
    for r, acts in enumerate(got):
        out.append([])
        for s, kind, i in acts:
            owner, chunk = rank_and_chunk(s, p, placement)
            assert owner == r, f"{key}: torch runs stage {s} on rank {r}, our placement on {owner}"
            out[-1].append((KIND[kind], i, chunk))
    return out


def first_difference(a, b) -> str | None:
    """Where two sets of per-rank orders part: rank, position, ours, torch's."""
    for r, (x, y) in enumerate(zip(a, b)):
        for k in range(max(len(x), len(y))):
            mine, tor = (x[k] if k < len(x) else None), (y[k] if k < len(y) else None)
            if mine != tor:
                return f"rank {r}, action {k}: ours {mine}, torch's {tor}"
    return None


def test_torch_places_stages_as_we_do():
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping
    for p in (1, 2, 3, 4):
        for v in (1, 2, 3, 4):
            assert generate_stage_to_rank_mapping(p, p * v, "loop") == {
                s: rank_and_chunk(s, p, INTERLEAVED)[0] for s in range(p * v)}
            if v % 2 == 0:
                assert generate_stage_to_rank_mapping(p, p * v, "v") == {
                    s: rank_and_chunk(s, p, V_SHAPE)[0] for s in range(p * v)}


@pytest.mark.parametrize("name", sorted(CHUNKS))
def test_our_order_is_torchs_runtime_order(torch_orders, name):
    """Every (p, v, m) of the grid both accept: the same actions in the same order on every
    rank, except interleaved 1F1B with v = 1 (documented difference 1, next test)."""
    compared = 0
    for p in P:
        for v in CHUNKS[name]:
            for m in M:
                mine = ours(name, p, v, m)
                tor = theirs(torch_orders, f"{name} {p} {v} {m}", p, PLACEMENT[name])
                refused = isinstance(mine, str) or isinstance(tor, str)
                if refused or (name, v) == ("interleaved_1f1b", 1):
                    continue
                assert mine == tor, f"{name} p={p} v={v} m={m}: {first_difference(mine, tor)}"
                compared += 1
    assert compared >= {"interleaved_1f1b": 26, "zb_h1": 50, "zbv": 36}[name], compared
    # the cases are among them
    for p, m in ((2, 4), (2, 8), (4, 4), (4, 8)):
        v = 2
        assert ours(name, p, v, m) == theirs(torch_orders, f"{name} {p} {v} {m}", p,
                                             PLACEMENT[name])


def megatron_interleaved_warmup_with_one_chunk(p: int, m: int, rank: int) -> list[tuple]:
    """1F1B with Megatron's interleaved warm-up 2(p - 1 - rank) kept at v = 1 (torch's order)."""
    warm = min(m, 2 * (p - 1 - rank))
    acts = [(F, i, 0) for i in range(warm)]
    for j in range(m - warm):
        acts += [(F, warm + j, 0), (B, j, 0)]
    return acts + [(B, j, 0) for j in range(m - warm, m)]


def test_one_chunk_interleaved_is_torchs_1f1b_not_its_one_stage_interleaved(torch_orders):
    """Documented difference 1: our v = 1 equals torch's Schedule1F1B; torch's
    ScheduleInterleaved1F1B with one stage per rank differs from it only by Megatron's
    interleaved warm-up count, 2(p - 1 - r) forwards instead of p - 1 - r."""
    parted = 0
    for p in P:
        for m in M:
            mine = ours("interleaved_1f1b", p, 1, m)
            if m >= p:
                tor = theirs(torch_orders, f"1f1b {p} 1 {m}", p, INTERLEAVED)
                assert mine == tor, f"1F1B p={p} m={m}: {first_difference(mine, tor)}"
            tor = theirs(torch_orders, f"interleaved_1f1b {p} 1 {m}", p, INTERLEAVED)
            if isinstance(tor, str):
                continue
            assert tor == [megatron_interleaved_warmup_with_one_chunk(p, m, r) for r in range(p)]
            parted += mine != tor
    assert parted > 0          # the difference is real: keep documenting it


def test_the_shapes_we_and_torch_accept_differ_only_by_the_documented_rules(torch_orders):
    """Documented difference 2, both ways, for every (schedule, p, v, m) of the grid."""
    for name, vs in CHUNKS.items():
        for p in P:
            for v in vs:
                for m in M:
                    mine = ours(name, p, v, m)
                    tor = torch_orders[f"{name} {p} {v} {m}"]
                    we_run, torch_runs = not isinstance(mine, str), not isinstance(tor, str)
                    case = f"{name} p={p} v={v} m={m}: ours {str(mine)[:90]}, torch {str(tor)[:90]}"
                    torch_rule = m % max(1, m // p) == 0
                    if name == "zbv":
                        assert we_run and torch_runs, case
                    elif v > 1:
                        assert we_run == (m % p == 0), case
                        assert torch_runs == torch_rule, case
                        if not we_run:
                            assert "Megatron" in mine, case
                    else:
                        assert we_run, case
                        assert torch_runs == torch_rule, case
