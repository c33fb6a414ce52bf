"""Lab ``pp_schedules`` on paper: the reference schedules (interleaved 1F1B, ZB-H1, ZBV) against
the given checker and simulator (``workbook.pipeline_parallel.virtual_stages``), and the checker
against deliberately wrong schedules. Pure Python: no rank starts.
"""
from __future__ import annotations

import pytest
from pp_schedules_reference import LAB10, SOL, ranks

from workbook.pipeline_parallel import (B, F, INTERLEAVED, V_SHAPE, W, ScheduleError,
                                        check_chunked_schedule, interleaved_bubble_fraction,
                                        rank_and_chunk, simulate, simulate_chunked, stage_index)


def one_line_error(call) -> str:
    with pytest.raises(ScheduleError) as exc:
        call()
    assert "\n" not in str(exc.value), str(exc.value)
    return str(exc.value)


# --------------------------------------------------------------------------- placements
def test_placements_put_chunks_where_the_papers_do():
    # interleaved: chunk c of rank r is stage c*p + r (Narayanan et al. 2021, section 2.2)
    assert [stage_index(1, c, 4) for c in range(3)] == [1, 5, 9]
    # V: chunk 0 of rank r is stage r, chunk 1 is stage 2p - 1 - r (Qi et al. 2023, section 6)
    assert [(stage_index(r, 0, 4, V_SHAPE), stage_index(r, 1, 4, V_SHAPE)) for r in range(4)] == \
        [(0, 7), (1, 6), (2, 5), (3, 4)]
    for placement in (INTERLEAVED, V_SHAPE):
        for p in (1, 2, 3, 4):
            for s in range(4 * p):
                r, c = rank_and_chunk(s, p, placement)
                assert 0 <= r < p and stage_index(r, c, p, placement) == s
    assert "not one of" in one_line_error(lambda: stage_index(0, 0, 2, "zigzag"))


# --------------------------------------------------------------------------- reference schedules
CASES = [(name, p, v, m) for name in SOL.SCHEDULES for p in (1, 2, 3, 4)
         for v in ((2,) if name == "zbv" else (1, 2, 3)) for m in range(1, 13)
         if name == "zbv" or v == 1 or m % p == 0]


@pytest.mark.parametrize("name", sorted(SOL.SCHEDULES))
def test_every_reference_schedule_passes_the_checker(name):
    """p in 1..4, v in 1..3 (2 for ZBV), m in 1..12 (multiples of p when interleaved with
    v > 1), the issue's p in {2, 4}, v = 2, m in {4, 8} among them; ZB-H1 and ZBV split."""
    schedule, placement = SOL.SCHEDULES[name]
    cases = [c for c in CASES if c[0] == name]
    assert {(2, 2, 4), (2, 2, 8), (4, 2, 4), (4, 2, 8)} <= {c[1:] for c in cases}
    for _, p, v, m in cases:
        acts = ranks(schedule, p, v, m)
        check_chunked_schedule(acts, p, v, m, placement)
        has_w = any(a[0] == W for rank_acts in acts for a in rank_acts)
        assert has_w == (name != "interleaved_1f1b"), (name, p, v, m)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
def test_interleaved_with_one_chunk_is_lab_10s_1f1b(p):
    for m in range(1, 11):
        assert ranks(SOL.interleaved_1f1b, p, 1, m) == [
            [(kind, i, 0) for kind, i in LAB10.one_f_one_b(p, m, r)] for r in range(p)], (p, m)


def test_interleaved_runs_megatrons_order():
    """p = 2, v = 2, m = 4, rank 0: warm-up (v-1)p + 2(p-1) = 4 forwards, chunk 0 on micro-
    batches 0, 1, chunk 1 on 0, 1, chunk 0 on 2, 3 ...; backwards from the last chunk down."""
    assert SOL.interleaved_1f1b(2, 2, 4, 0) == [
        (F, 0, 0), (F, 1, 0), (F, 0, 1), (F, 1, 1),
        (F, 2, 0), (B, 0, 1), (F, 3, 0), (B, 1, 1), (F, 2, 1), (B, 0, 0), (F, 3, 1), (B, 1, 0),
        (B, 2, 1), (B, 3, 1), (B, 2, 0), (B, 3, 0)]


def test_m_not_a_multiple_of_p_names_megatrons_rule():
    msg = one_line_error(lambda: SOL.interleaved_1f1b(2, 2, 5, 0))
    assert "Megatron" in msg and "m a multiple of p" in msg and "m=6" in msg, msg
    assert "Megatron" in one_line_error(
        lambda: check_chunked_schedule(ranks(SOL.interleaved_1f1b, 2, 1, 5), 2, 2, 5))
    check_chunked_schedule(ranks(SOL.interleaved_1f1b, 2, 1, 5), 2, 1, 5)      # v = 1: 1F1B
    check_chunked_schedule(ranks(SOL.zb_h1, 2, 1, 5), 2, 1, 5)
    with pytest.raises(ValueError, match="exactly 2 chunks"):
        SOL.zbv(2, 3, 4, 0)


# --------------------------------------------------------------------------- wrong schedules
def megatron_with_wrong_turns(p, v, m, rank):
    """Interleaved 1F1B that switches chunk after every micro-batch instead of every p."""
    warm = min(v * m, (v - 1) * p + 2 * (p - 1 - rank))
    taken = {F: [0] * v, B: [0] * v}

    def action(kind, k):
        c = k % v if kind == F else v - 1 - k % v
        taken[kind][c] += 1
        return (kind, taken[kind][c] - 1, c)

    acts = [action(F, k) for k in range(warm)]
    for j in range(v * m - warm):
        acts += [action(F, warm + j), action(B, j)]
    return acts + [action(B, j) for j in range(v * m - warm, v * m)]


def test_a_chunk_run_out_of_turn_is_named():
    acts = ranks(SOL.interleaved_1f1b, 2, 2, 4)
    a, b = acts[0].index((F, 0, 0)), acts[0].index((F, 0, 1))
    acts[0][a], acts[0][b] = acts[0][b], acts[0][a]         # chunk 1 before chunk 0, micro-batch 0
    msg = one_line_error(lambda: check_chunked_schedule(acts, 2, 2, 4))
    assert msg.startswith("deadlock: rank 0 waits at F(0, chunk 1) (stage 2) for F(0, chunk 0) "
                          "on rank 1 (stage 1's activation)"), msg
    wrong = [megatron_with_wrong_turns(4, 2, 8, r) for r in range(4)]
    msg = one_line_error(lambda: check_chunked_schedule(wrong, 4, 2, 8))
    assert "deadlock: rank 0 waits at F(3, chunk 1) (stage 4)" in msg, msg
    # on 2 ranks the same mistake still finishes on paper: only the textbook order catches it
    wrong = [megatron_with_wrong_turns(2, 2, 4, r) for r in range(2)]
    check_chunked_schedule(wrong, 2, 2, 4)
    assert wrong != ranks(SOL.interleaved_1f1b, 2, 2, 4)


def test_a_w_before_its_b_is_named():
    acts = ranks(SOL.zb_h1, 2, 1, 4)
    b, w = acts[1].index((B, 0, 0)), acts[1].index((W, 0, 0))
    acts[1][b], acts[1][w] = acts[1][w], acts[1][b]
    msg = one_line_error(lambda: check_chunked_schedule(acts, 2, 1, 4))
    assert msg.startswith("rank 1: W(0, chunk 0) comes before B(0, chunk 0)"), msg


def test_a_b_before_its_f_is_named():
    acts = ranks(SOL.interleaved_1f1b, 2, 2, 4)
    acts[1].remove((B, 0, 1))
    acts[1].insert(0, (B, 0, 1))
    msg = one_line_error(lambda: check_chunked_schedule(acts, 2, 2, 4))
    assert msg.startswith("rank 1: B(0, chunk 1) comes before F(0, chunk 1)"), msg


def test_a_v_whose_second_chunk_sends_the_wrong_way_is_named():
    """Chunk 1 ordered as if it went on down the ranks (each rank runs its mirror rank's
    chunk-1 order): rank 0 then waits for an activation that rank 1 sends only later."""
    def wrong_way(p, m, r):
        mirror = iter(a for a in SOL.zbv(p, 2, m, p - 1 - r) if a[2] == 1)
        return [next(mirror) if a[2] == 1 else a for a in SOL.zbv(p, 2, m, r)]
    for p in (2, 4):
        acts = [wrong_way(p, 8, r) for r in range(p)]
        msg = one_line_error(lambda: check_chunked_schedule(acts, p, 2, 8, V_SHAPE))
        assert msg.startswith(f"deadlock: rank 0 waits at F(1, chunk 1) (stage {2 * p - 1}) for "
                              f"F(1, chunk 1) on rank 1 (stage {2 * p - 2}'s activation)"), msg
    # the right V read with the interleaved placement fails the same way
    assert one_line_error(lambda: check_chunked_schedule(
        ranks(SOL.zbv, 2, 2, 4), 2, 2, 4, INTERLEAVED)).startswith("deadlock: ")


def test_a_deadlock_names_who_waits_for_whom():
    """Rank 0 runs 1F1B without a warm-up, rank 1 runs all its forwards first."""
    acts = [[(F, 0, 0), (B, 0, 0), (F, 1, 0), (B, 1, 0)],
            [(F, 0, 0), (F, 1, 0), (B, 0, 0), (B, 1, 0)]]
    msg = one_line_error(lambda: check_chunked_schedule(acts, 2, 1, 2))
    assert msg == ("deadlock: rank 0 waits at B(0, chunk 0) (stage 0) for B(0, chunk 0) on rank 1 "
                   "(stage 1's gradient); rank 1 waits at F(1, chunk 0) (stage 1) for "
                   "F(1, chunk 0) on rank 0 (stage 0's activation) -- no rank can move, so these "
                   "ranks would hang for ever")
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate_chunked(acts, 2, 1)


def test_missing_duplicate_and_malformed_actions_are_named():
    acts = ranks(SOL.zb_h1, 2, 2, 4)
    acts[0].remove((W, 3, 1))
    msg = one_line_error(lambda: check_chunked_schedule(acts, 2, 2, 4))
    assert msg.startswith("rank 0 of 2: a rank runs F, B and W once") and \
        msg.endswith("missing W(3, chunk 1)"), msg
    acts = ranks(SOL.interleaved_1f1b, 2, 2, 4)
    acts[1].append((F, 0, 0))
    assert one_line_error(lambda: check_chunked_schedule(acts, 2, 2, 4)).endswith(
        "extra F(0, chunk 0)")
    acts = ranks(SOL.interleaved_1f1b, 2, 2, 4)
    acts[1][0] = (F, 0)
    assert "rank 1: action ('F', 0) is not a tuple (kind, micro_batch, chunk)" in \
        one_line_error(lambda: check_chunked_schedule(acts, 2, 2, 4))
    acts[1][0] = [F, 0, 0]
    assert "rank 1: action ['F', 0, 0] is not a tuple" in \
        one_line_error(lambda: check_chunked_schedule(acts, 2, 2, 4))
    assert "give one per rank" in one_line_error(
        lambda: check_chunked_schedule(ranks(SOL.interleaved_1f1b, 2, 2, 4), 4, 2, 4))
    assert "even number of chunks" in one_line_error(
        lambda: check_chunked_schedule([[], []], 2, 3, 4, V_SHAPE))
    assert "each must be at least 1" in one_line_error(
        lambda: check_chunked_schedule([[], []], 2, 2, 0))
    # a split schedule with one chunk left unsplit: its W's are missing, never silently fused
    acts = ranks(SOL.zb_h1, 2, 2, 4)
    acts = [[a for a in r if not (a[0] == W and a[2] == 0)] for r in acts]
    assert "missing W(0, chunk 0), W(1, chunk 0), W(2, chunk 0), W(3, chunk 0)" in \
        one_line_error(lambda: check_chunked_schedule(acts, 2, 2, 4))


# --------------------------------------------------------------------------- simulate_chunked
@pytest.mark.parametrize("t_b", [0.5, 1.0, 2.0, 3.0])
def test_interleaved_bubble_is_p_minus_1_over_vm_plus_p_minus_1(t_b):
    """Busy v m (t_F + t_B) per rank, the fill p - 1 chunk forwards, the drain p - 1 chunk
    backwards, no wait between (module docstring): bubble (p - 1)/(v m + p - 1) on every rank,
    for t_B = 2 t_F (lab 10's ratio) and any other ratio, when transfers are free."""
    for p in (2, 3, 4):
        for v in (1, 2, 3, 4):
            for m in (p, 2 * p, 4 * p):
                line = simulate_chunked(ranks(SOL.interleaved_1f1b, p, v, m), p, v, t_f=1.0,
                                        t_b=t_b, t_w=0.0)
                want = interleaved_bubble_fraction(p, v, m)
                assert line.bubbles == pytest.approx([want] * p), (p, v, m)
                assert line.step == pytest.approx((v * m + p - 1) * (1.0 + t_b))
    # the case: 2 ranks, v = 2, m = 8: 1/17, against 1F1B's 1/9
    assert interleaved_bubble_fraction(2, 2, 8) == pytest.approx(1 / 17)


def test_simulate_chunked_plays_one_chunk_as_lab_10s_simulate():
    for p, m, t_p2p in ((2, 4, 0.0), (3, 5, 0.3), (4, 8, 0.7)):
        lab10 = simulate([LAB10.one_f_one_b(p, m, r) for r in range(p)], 1.0, 2.0, t_p2p)
        mine = simulate_chunked(ranks(SOL.interleaved_1f1b, p, 1, m), p, 1, t_f=1.0, t_b=1.0,
                                t_w=1.0, t_p2p=t_p2p)
        assert mine.step == pytest.approx(lab10.step)
        assert [[(s, e) for s, e, _ in r] for r in mine.spans] == \
            [[(s, e) for s, e, _ in r] for r in lab10.spans]
    # transfers cost: the bubble grows past the formula
    slow = simulate_chunked(ranks(SOL.interleaved_1f1b, 2, 2, 8), 2, 2, t_p2p=0.25)
    assert slow.bubble > interleaved_bubble_fraction(2, 2, 8)


def test_no_transfer_at_the_turn_of_the_v():
    line = simulate_chunked(ranks(SOL.zbv, 2, 2, 4), 2, 2, V_SHAPE, t_p2p=10.0)
    starts = {a: s for s, _, a in line.spans[1]}
    ends = {a: e for _, e, a in line.spans[1]}
    assert starts[(F, 0, 1)] == ends[(F, 0, 0)]          # stage 1 -> stage 2, both on rank 1
    assert starts[(F, 0, 0)] == 1.0 + 10.0               # stage 0 (rank 0) -> stage 1 (rank 1)


def test_peak_in_flight_counts_chunk_activations_until_w():
    # interleaved: Megatron's warm-up plus the steady state's forward, v*m at most
    for p, v, m in ((2, 2, 4), (4, 2, 8), (4, 3, 4)):
        line = simulate_chunked(ranks(SOL.interleaved_1f1b, p, v, m), p, v)
        assert line.peak_in_flight == [min(v * m, (v - 1) * p + 2 * (p - 1 - r) + 1)
                                       for r in range(p)], (p, v, m)
    # freed at W, not at B: the same order with the W's moved to the very end holds everything
    acts = ranks(SOL.zb_h1, 2, 1, 4)
    late = [[a for a in r if a[0] != W] + [a for a in r if a[0] == W] for r in acts]
    assert simulate_chunked(late, 2, 1).peak_in_flight == [4, 4]


def test_zb_h1_has_a_third_of_1f1bs_bubble_and_its_peak_memory():
    """Equal F, B, W times (the paper's assumption): 1F1B idles (p-1)(t_F+t_B+t_W) per rank,
    ZB-H1 (p-1)(t_F+t_B-t_W); every ZB-H1 rank holds p micro-batches, 1F1B's rank 0 peak."""
    for p in (2, 3, 4):
        for m in (p, 2 * p, 8, 16):
            one = simulate_chunked(ranks(SOL.interleaved_1f1b, p, 1, m), p, 1)
            zb = simulate_chunked(ranks(SOL.zb_h1, p, 1, m), p, 1)
            for r in range(p):
                assert one.idle(r) == pytest.approx(3 * (p - 1))
                assert zb.idle(r) == pytest.approx(p - 1)
                assert zb.idle(r) <= one.idle(r) / 3 + 1e-9
            assert zb.peak_in_flight == [p] * p and max(one.peak_in_flight) == p, (p, m)
    # unequal times: still (p - 1)(t_F + t_B - t_W)
    zb = simulate_chunked(ranks(SOL.zb_h1, 4, 1, 8), 4, 1, t_f=1.0, t_b=1.2, t_w=0.8)
    assert [zb.idle(r) for r in range(4)] == pytest.approx([3 * (1.0 + 1.2 - 0.8)] * 4)


def test_zbv_idles_only_the_unavoidable_fill_and_holds_1f1bs_memory():
    """Chunks of half a stage (t = 1/2 each) and m >= 2p: each rank idles (p - 1) t_F, the
    least any schedule can (rank p - 1 starts after p - 1 chunk forwards); the issue's target,
    step <= 1.10 x the no-bubble optimum m (T_F + T_B + T_W), holds at p = 2, m = 8."""
    for p in (2, 3, 4):
        for m in (2 * p, 8, 16):
            line = simulate_chunked(ranks(SOL.zbv, p, 2, m), p, 2, V_SHAPE, 0.5, 0.5, 0.5)
            assert [line.idle(r) for r in range(p)] == pytest.approx([(p - 1) * 0.5] * p)
            assert max(line.peak_in_flight) <= 2 * p, (p, m)       # p whole stages
    line = simulate_chunked(ranks(SOL.zbv, 2, 2, 8), 2, 2, V_SHAPE, 0.5, 0.5, 0.5)
    assert line.step <= 1.10 * 8 * 3.0
