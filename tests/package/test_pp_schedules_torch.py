"""Lab ``pp_schedules``: the reference schedules' action order equals the order
``torch.distributed.pipelining`` runs for the same (p, v, m), wherever torch has the schedule.

How torch's order is read (torch's own runtime loop, on stand-in stages that record each
action): ``workbook.pipeline_parallel.torch_orders``, which the grader uses too.

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
from pp_schedules_reference import SOL, ranks

from workbook.pipeline_parallel import B, F, INTERLEAVED, V_SHAPE, rank_and_chunk
from workbook.pipeline_parallel.torch_orders import (as_chunk_actions, first_difference,
                                                     torch_runtime_order)

P, M = (2, 3, 4), tuple(range(1, 13))
CHUNKS = {"interleaved_1f1b": (1, 2, 3), "zb_h1": (1, 2, 3), "zbv": (2,)}
TORCH_CLASS = {"interleaved_1f1b": "ScheduleInterleaved1F1B",
               "zb_h1": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble"}
PLACEMENT = {"interleaved_1f1b": INTERLEAVED, "zb_h1": INTERLEAVED, "zbv": V_SHAPE}


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
    """Torch's order for ``key`` as our (kind, micro_batch, chunk) triples, or "refused: ..."."""
    return as_chunk_actions(torch_orders[key], p, placement)


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
