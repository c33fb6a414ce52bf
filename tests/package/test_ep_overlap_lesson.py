"""Lesson 13's helpers (``workbook.expert_parallel.ep_overlap_lesson`` and ``..._ranks``): the
routing's counts add up, the dispatch's cost is its busiest port on the link model, the
all-to-all's transpose is the exchange with the splits swapped, a schedule on paper waits where it
must, the lesson draws a schedule only when the given check accepts it, and on 2 warm ranks the
variants are judged against one device and the traced step yields the timeline and the
prediction's row (the model shown only beside a prediction)."""
from __future__ import annotations

import types

import pytest
import torch

from workbook import link
from workbook.expert_parallel import ep_overlap_lesson as lesson
from workbook.expert_parallel import ep_overlap_lesson_ranks as ranks
from workbook.expert_parallel import layer_actions
from workbook.grading.labs import load_lab

SOL = load_lab("ep_overlap", "solutions")


# --------------------------------------------------------------------------- on paper
@pytest.mark.parametrize("E, k, ep", [(8, 2, 2), (16, 4, 4), (4, 1, 4)])
def test_routing_counts_every_assignment_of_every_rank(E, k, ep):
    r = lesson.routing(E, k, 32, ep, skew=1.0)
    assert [sum(row) for row in r["counts"]] == [32 * k] * ep
    rows = lesson.sent_rows(r["counts"], ep)
    assert [sum(row) for row in rows] == [32 * k] * ep
    per = E // ep
    assert rows[0][ep - 1] == sum(r["counts"][0][E - per:])       # to the last rank's experts
    assert torch.allclose(r["weights"].sum(-1), torch.ones(ep * 32))


def test_skew_concentrates_the_load_and_raises_the_aux_loss():
    flat, tilted = (lesson.routing(8, 2, 256, 2, skew=s) for s in (0.0, 3.0))
    assert flat["aux"] == pytest.approx(1.0, abs=0.05) and tilted["aux"] > flat["aux"] + 0.2
    load = [sum(col) for col in zip(*tilted["counts"])]
    assert load[0] > 3 * load[-1]


def test_bad_routing_shapes_say_what_to_fix():
    with pytest.raises(ValueError, match="multiple of 4"):
        lesson.routing(6, 2, 8, 4)
    with pytest.raises(ValueError, match="top-k=9"):
        lesson.routing(8, 9, 8, 2)
    assert lesson.explore(6, 2, 0.0, 4, 256, 2048, "dgx-h100") is None


def test_the_dispatch_costs_its_busiest_port():
    lk = link.make_link("dgx-h100", 790e12)                    # the real machine's rate
    rows = [[5, 30, 0], [10, 2, 0], [20, 0, 7]]                 # rank 1 receives 30 + 0
    costs = lesson.a2a_costs(lk, rows, 1000)
    # busiest: rank 0 sends 30 rows, receives 30; rank 1 receives 30; rank 2 sends 20
    assert costs["sent"] == [30_000, 10_000, 20_000] and costs["received"] == [30_000, 30_000, 0]
    assert costs["uneven"] == pytest.approx((lk.latency_s + 30_000 / lk.bandwidth_Bps) * 1e3)
    even = lesson.a2a_costs(lk, [[4, 4], [4, 4]], 1000)
    assert even["uneven"] == pytest.approx(even["balanced"])
    assert costs["uneven"] > costs["balanced"]


def test_an_ep_group_past_a_node_crosses_the_network():
    inside, across = lesson.real_link("dgx-h100", 8), lesson.real_link("dgx-h100", 16)
    assert inside.topology is None and across.topology is not None
    rows = [[8] * 16 for _ in range(16)]
    assert lesson.a2a_costs(across, rows, 8192)["uneven"] > 5 * lesson.a2a_costs(
        inside, [[16] * 8 for _ in range(8)], 8192)["uneven"]


@pytest.mark.parametrize("splits", [[[2, 3], [1, 0]], [[0, 0], [4, 1]], [[1, 2, 0], [0, 0, 3],
                                                                         [2, 1, 1]]])
def test_an_all_to_alls_transpose_is_the_exchange_with_the_splits_swapped(splits):
    got = lesson.adjoint_check(splits)
    total = sum(map(sum, splits))
    assert got == {"shape": (total, total), "permutation": True, "transpose_is_swapped": True}


def test_the_given_bookkeeping_on_paper(capsys):
    paper = lesson.dispatch_on_paper(num_experts=4, top_k=2, tokens=3, ep=2)
    assert [int(c.sum()) for c in paper["counts"]] == [6, 6]
    lesson.regroup_on_paper(torch.tensor([[1, 2], [2, 1]]))
    out = capsys.readouterr().out
    assert "regrouped (expert-major): s0e0 s1e0 s1e0 s0e1 s0e1 s1e1" in out


def test_deferred_weight_gradients_wait_in_the_store_then_equal_autograds(capsys):
    lesson.deferred_demo()
    out = capsys.readouterr().out
    assert "equal to autograd's: True" in out and "'fc1.weight': None" in out
    assert out.rstrip().endswith("equal to autograd's: True")


def test_a_schedule_on_paper_waits_where_it_must():
    costs = {"router": 1.0, "experts": 2.0, "transfer": 1.5}
    naive = lesson.play(list(layer_actions("forward")), costs)
    assert naive["waited"] == pytest.approx(4 * 1.5) and naive["end"] == pytest.approx(12.0)
    hiding = lesson.play(SOL.two_batch_schedule("forward"), costs)
    assert hiding["end"] < naive["end"] and hiding["waited"] < naive["waited"]
    assert len(hiding["rows"]["link"]) == 4
    fig = lesson.paper_figure({"naive": list(layer_actions("forward"))}, costs, "t")
    assert {y for t in fig.data for y in t.y} == {"naive · compute", "naive · link"}


def test_the_lesson_draws_a_schedule_only_once_the_check_accepts_it(capsys):
    assert lesson.schedule_or_none(types.SimpleNamespace(), "forward") is None
    waits_at_once = types.SimpleNamespace(two_batch_schedule=lambda phase: list(
        layer_actions(phase)))
    assert lesson.schedule_or_none(waits_at_once, "forward") is None
    assert "waits for the transfer at once" in capsys.readouterr().out
    assert lesson.schedule_or_none(SOL, "forward") == SOL.two_batch_schedule("forward")


def test_the_heatmap_has_a_cell_per_rank_and_expert():
    fig = lesson.load_heatmap([[1, 2, 3, 4], [5, 6, 7, 8]], "t")
    assert fig.data[0].z == ((1, 2, 3, 4), (5, 6, 7, 8)) or list(map(list, fig.data[0].z)) == \
        [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert list(fig.data[0].x) == ["e0·r0", "e1·r0", "e2·r1", "e3·r1"]


# --------------------------------------------------------------------------- on ranks
@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    from workbook.lessons import on_ranks
    root = tmp_path_factory.mktemp("lesson13")
    return on_ranks(ranks.ep_step, 2, str(root), {"two_batch": "solutions",
                                                   "shared_overlap": "solutions"},
                    4 * ranks.HIDDEN, link="dgx-h100", timeout=180)


def test_the_reference_passes_the_lessons_check_and_the_stubs_do_not():
    from workbook.lessons import on_ranks
    got = on_ranks(ranks.check, 2, "solutions", timeout=120)
    assert got == [dict.fromkeys(ranks.VARIANTS, "ok")] * 2
    stub = on_ranks(ranks.check, 2, "labs", timeout=120)[0]
    assert all(v.startswith("NotImplementedError") for v in stub.values()), stub


def test_the_traced_step_gives_every_action_and_all_to_all(traced):
    for res in traced:
        v = res["variants"]["two_batch"]
        computes = [a for a in SOL.two_batch_schedule("forward") if a[0] == "compute"] + \
            [a for a in SOL.two_batch_schedule("backward") if a[0] == "compute"]
        assert len([a for a in v["actions"] if a[1] == "compute"]) == len(computes)
        tokens = [o for o in v["ops"] if not o["counts"]]
        assert sum(o["counts"] for o in v["ops"]) == 2 and len(tokens) == 8   # 4 a pass
        assert all(o["waited"] is not None for o in v["ops"])
        assert 0 < v["forward_end"] < v["end"]
        narrow = res["variants"]["shared_narrow"]
        assert len(narrow["shared"]) == 1 and ranks.measured_exposed_ms(narrow) >= 0
        sent = ranks.dispatch_of(narrow)["rows"]            # the group's, [sender][receiver]
        assert [sum(row) for row in sent] == [ranks.TOKENS * ranks.K] * 2
    fig = ranks.rank_timeline(traced, "two_batch", "t")
    assert {"rank 0 · compute", "rank 1 · link"} <= {y for t in fig.data for y in (t.y or [])}


def test_the_models_value_is_shown_only_beside_a_prediction(traced, capsys):
    sim = link.make_link("dgx-h100", traced[0]["local_flops"])
    ranks.prediction_table(traced, types.SimpleNamespace(), sim)
    out = capsys.readouterr().out
    assert "(your predict_dispatch_exposed_ms: AttributeError" in out
    assert all(line.split()[-3:-1] == ["-", "-"] for line in out.splitlines()
               if line.lstrip().startswith("rank"))
    mine = types.SimpleNamespace(predict_dispatch_exposed_ms=lambda *a: 1e6)
    ranks.prediction_table(traced, mine, sim)
    out = capsys.readouterr().out
    rows = [ln.split() for ln in out.splitlines() if ln.lstrip().startswith("rank")]
    assert len(rows) == 2 and all(r[-3] == "1,000,000" and r[-2] != "-" for r in rows), out
    assert out.count("the model gives") == 2                  # the judge's word on each
    from workbook.expert_parallel.ep_overlap_report import dispatch_exposed_model

    def right(*args):
        return dispatch_exposed_model(*args)[0]
    ranks.prediction_table(traced, types.SimpleNamespace(predict_dispatch_exposed_ms=right), sim)
    out = capsys.readouterr().out
    assert "the model gives" not in out and out.count("dispatch exposed") == 2


def test_a_variant_that_raises_is_shown_not_raised(capsys):
    broken = [{"variants": {"two_batch": {"impl": "labs", "error": "ValueError: nope"}}}] * 2
    assert ranks.failed(broken, "two_batch") == "rank 0: ValueError: nope"
    assert ranks.rank_timeline(broken, "two_batch", "t") is None
    ranks.hidden_table(broken)
    ranks.prediction_table([{"variants": {"shared_narrow": broken[0]["variants"]["two_batch"]}}],
                           types.SimpleNamespace(), None)
    out = capsys.readouterr().out
    assert out.count("did not run: rank 0: ValueError: nope") == 3
