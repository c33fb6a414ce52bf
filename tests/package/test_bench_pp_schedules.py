"""``workbook bench pp_schedules`` (``workbook.pipeline_parallel.pp_schedules_bench``): one run on
tiny shapes on the warm ranks (the report's rank side, which the self-check's figures read too)
writes every variant and field, and what it reads from the schedule
or the link model holds whatever the load: no_comm moves nothing over the link, every other
variant's link time is its busiest rank's transfers times one transfer, the peaks are the
schedule's (ZB-H1's and ZBV's equal 1F1B's), every bubble and hidden share lies in its range, the
figures are labelled SIMULATED. No speed is judged. Its paper side agrees with lab 10's for 1F1B,
and bad options fail at once, in one line, with exit status 2."""
from __future__ import annotations

import json
import math

import pytest
from bench_checks import parse
from pp_schedules_reference import LAB10, SOL

from workbook.pipeline_parallel import pp_schedules_bench as bench
from workbook.pipeline_parallel import pp_schedules_figures as paper_side

TINY = dict(hidden=16, heads=2, layers=8, seq=4, rows=1, micro_batches=4, vocab=32)
P = 2


def _transfers(acts: list[list[tuple]], v: int, placement: str) -> list[int]:
    """Per rank: the sends and receives that cross to another rank (the V's turn stays home)."""
    from workbook.pipeline_parallel import ChunkAction, destination_of, source_of
    out = []
    for r, rank_acts in enumerate(acts):
        n = 0
        for a in map(ChunkAction._make, rank_acts):
            for end in (destination_of(r, a, P, v, placement), source_of(r, a, P, v, placement)):
                n += end is not None and end[0] != r
        out.append(n)
    return out


@pytest.fixture(scope="module")
def per_rank(tmp_path_factory):
    """One run on 2 warm ranks serves both the bench's tests and the self-check's figures: the
    report's rank side (``pp_schedules_report.run``: the bench's ``_rank_bench``, plus the
    schedules played) with the bench's options, every variant, at the tiny size."""
    from workbook.pipeline_parallel import pp_schedules_report as report
    from workbook.runtime.launch import run
    o = bench.options(nproc=P, links=[report.LINK], repeats=1, warmup=1, **TINY)
    return o, run(report.run, P, str(tmp_path_factory.mktemp("traces")), "solutions", o,
                  link=report.LINK, pool=True, timeout=120)


@pytest.fixture(scope="module")
def result(per_rank):
    """What ``bench.measure`` returns (and ``--json`` writes) for that run."""
    o, results = per_rank
    return bench.summarize(results, o)


def test_every_variant_and_field_on_the_simulated_link(result, tmp_path):
    from workbook.pipeline_parallel import simulate_chunked
    doc = json.loads(json.dumps(result))                       # what --json writes
    assert list(doc["links"]) == ["dgx-h100"] and doc["nproc"] == P
    r = doc["links"]["dgx-h100"]
    assert "simulated" in r["link_label"].lower() and "dgx-h100" in r["link_label"]
    assert list(r["variants"]) == list(bench.VARIANTS)
    assert r["activation_bytes"] == 4 * TINY["rows"] * TINY["seq"] * TINY["hidden"]
    m, rows = TINY["micro_batches"], r["variants"]
    for name, row in rows.items():
        fn, v = bench.SCHEDULE_OF[name]
        schedule, placement = SOL.SCHEDULES[fn]
        acts = SOL.all_ranks(schedule, P, v, m)
        assert doc["schedules"][name] == [[list(a) for a in rank] for rank in acts], name
        peaks = simulate_chunked(acts, P, v, placement).peak_in_flight
        assert row["peak_in_flight"] == peaks and row["peak_stages"] == max(peaks) / v, name
        assert math.isfinite(row["step_ms"]) and row["step_ms"] > 0, name
        for b in (row["bubble"], *row["rank_bubbles"], row["paper"]["bubble"], row["formula"]):
            assert 0 <= b < 1, (name, b)
        assert row["over_no_comm"] == pytest.approx(row["step_ms"] / r["no_comm_step_ms"])
        assert (row["t_w_ms"] is None) == (fn == "interleaved_1f1b"), name   # unsplit: W inside B
        if name == "no_comm":
            assert row["link_ms"] == 0 and row["exposed_ms"] is None and row["hidden_pct"] is None
            continue
        # modelled link time: the busiest rank's transfers, each one activation's time
        assert row["link_ms"] == pytest.approx(max(_transfers(acts, v, placement)) * r["t_p2p_ms"],
                                               rel=1e-3), name
        assert 0 <= row["hidden_pct"] <= 100 and 0 <= row["paper"]["hidden_pct"] <= 100, name
        assert row["exposed_ms"] >= -1e-6 and row["skew_ms"] >= 0, name
    for name, v in (("1f1b", 1), ("interleaved_v2", 2), ("interleaved_v4", 4)):
        book = (P - 1) / (v * m + P - 1)               # whatever the costs measured
        assert rows[name]["textbook"] == pytest.approx(book)
        assert rows[name]["formula"] == pytest.approx(book)
    assert rows["zb_h1"]["peak_stages"] == rows["1f1b"]["peak_stages"] == P
    assert rows["zbv"]["peak_stages"] == P
    assert set(r["targets"]) == {
        "interleaved v=2: steady-state p2p hidden >= 80%",
        "interleaved v=2: bubble within 10% of (p-1)/(vm+p-1)", "ZB-H1: bubble <= 1/3 of 1F1B's",
        "ZB-H1: idle time per rank <= 1/3 of 1F1B's (the paper's form)",
        "ZB-H1: peak activations in flight = 1F1B's",
        "ZBV: step <= 1.10 x the no-communication optimum"}
    assert all(t["met"] in (True, False) for t in r["targets"].values())
    assert r["targets"]["ZB-H1: peak activations in flight = 1F1B's"]["met"] is True
    text = bench.report(result)
    assert text.startswith("pp_schedules benchmark, SIMULATED link: dgx-h100"), text
    assert "[dgx-h100] SIMULATED link: dgx-h100" in text and "targets (benchmark figures" in text
    bench.figure(result).write_html(tmp_path / "f.html")
    assert (tmp_path / "f.html").stat().st_size > 1000


def test_paper_side_agrees_with_lab_10_on_1f1b():
    """Unsplit 1F1B on paper: ``simulate_chunked`` with v = 1 times it as lab 10's ``simulate``,
    and the steady state's hidden share is lab 10's bench's."""
    from workbook.pipeline_parallel import pp_overlap_bench
    for p, m in ((2, 8), (4, 8)):
        acts = SOL.all_ranks(SOL.interleaved_1f1b, p, 1, m)
        lab10 = [LAB10.one_f_one_b(p, m, s) for s in range(p)]
        got = paper_side.paper(acts, p, 1, "interleaved", {"t_f": 1.0, "t_b": 2.0, "t_w": 0.0}, 0.1)
        want = pp_overlap_bench.predict([[tuple(a) for a in s] for s in lab10], 1.0, 2.0, 0.1)
        assert got["step_ms"] == pytest.approx(want["step_ms"])
        assert got["bubble"] == pytest.approx(want["bubble"])
        assert got["hidden_pct"] == pytest.approx(want["hidden_pct"])
    line = paper_side.paper(acts, 4, 1, "interleaved", {"t_f": 1.0, "t_b": 2.0, "t_w": 0.0}, 0.0)
    assert line["hidden_pct"] is None and line["bubble"] == pytest.approx(3 / 11)


def test_bad_options_fail_in_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as err:
        bench.run_bench(parse(bench, "--micro-batches", "3", "--layers", "4", "--variants",
                              "zbv,zb", "--link", "none", "--nproc", "5"))
    assert err.value.code == 2
    message = str(err.value)
    assert "\n" not in message and message.startswith("workbook bench pp_schedules: ")
    for part in ("unknown variant(s) ['zb']", "unknown link preset(s) ['none']",
                 "--nproc 5: 2 to 4 ranks", "--layers 4 cannot fill 10 stages"):
        assert part in message, (part, message)
    assert capsys.readouterr().err.strip() == message
    with pytest.raises(SystemExit) as err:                   # Megatron's rule, by the module's command
        bench.main(["--micro-batches", "3"])
    assert err.value.code == 2 and "m a multiple of p (Megatron-LM's rule" in str(err.value)
    with pytest.raises(SystemExit, match="^workbook bench pp_schedules: unknown option"):
        bench.measure(hiden=64)
    with pytest.raises(SystemExit, match="^workbook bench pp_schedules: no lab file .*pp_sched"):
        bench.measure(impl=str(tmp_path))                    # before any rank starts


def test_the_self_checks_figures_name_every_schedule_beside_its_paper_figures(per_rank):
    """``workbook run pp_schedules`` (all checks passed) prints the lab's figures: the report's
    rank side on 2 warm ranks (the run the bench's tests read), then its lines."""
    from workbook.pipeline_parallel import pp_schedules_report as report
    _, results = per_rank
    assert len(results) == report.WORLD_SIZE
    assert set(report.REPORT_OPTIONS["run"]) <= set(results[0]["schedules"])
    text = report.describe(results)
    for name in ("1f1b", "interleaved_v2", "zb_h1", "zbv"):
        line = next(ln for ln in text.splitlines() if ln.split()[:1] == [name])
        step, x_opt = float(line.split()[1]), float(line.split()[2])
        assert step > 0 and x_opt > 0.5, line
    assert "simulated link: dgx-h100" in text and "simulate" in text
