"""``workbook bench ep_overlap`` (``workbook.expert_parallel.ep_overlap_bench``): one run at the
``--quick`` size on the warm ranks, one node and two, writes every variant and field, and what it
reads from the layer or the link model holds whatever the load: every variant computes the same
loss, every variant but no_comm moves the same rows (two micro-batches one count exchange more),
no_comm moves nothing over the link, each count exchange costs the fabric's latency (the
network's across two nodes), every hidden share lies in 0-100, the figures are labelled
SIMULATED and the issue's targets judged on one node only. No speed is judged. Bad options, a
folder without the lab and a lab that does not import fail at once, in one line, with exit
status 2, before any rank starts."""
from __future__ import annotations

import json

import pytest
from bench_checks import assert_cli_routes, parse

from workbook.expert_parallel import ep_overlap_bench as bench

P = 2
LINKS = ["dgx-h100", "dgx-h100:2nodes"]
E = bench.QUICK["experts"]
# all-to-alls a step: the counts, the tokens there and back (forward), there and back (backward)
EXCHANGES = {"ep_moe": 5, "shared_overlap": 5, "deferred_wgrad": 5, "two_batch": 10,
             "two_batch_deferred": 10, "no_comm": 0}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return bench.measure(nproc=P, links=LINKS, repeats=1, warmup=0, pool=True, quick=True,
                         trace_dir=tmp_path_factory.mktemp("traces"))


def test_every_variant_and_field_on_the_simulated_link(result, tmp_path):
    doc = json.loads(json.dumps(result))                       # what --json writes
    assert list(doc["links"]) == LINKS and doc["nproc"] == P
    assert doc["options"]["tokens"] == bench.QUICK["tokens"]
    losses = []
    for spec, r in doc["links"].items():
        assert "simulated" in r["link_label"].lower() and "dgx-h100" in r["link_label"], spec
        assert ("nodes of 1 ranks" in r["link_label"]) == (spec == "dgx-h100:2nodes")
        assert list(r["variants"]) == list(bench.VARIANTS)
        rows = r["variants"]
        # one count exchange: the fabric's latency (E int64 are next to nothing to carry)
        latency_ms = (r["link"]["network_latency_us"] if r["nodes"] > 1
                      else r["link"]["latency_us"]) / 1e3
        for name, row in rows.items():
            losses.append(row["loss"])
            assert row["step_ms"] > 0 and row["over_no_comm"] == pytest.approx(
                row["step_ms"] / r["no_comm_step_ms"]), (spec, name)
            assert row["a2a_count"] == EXCHANGES[name], (spec, name, row["a2a_count"])
            assert row["exposed_over_no_comm"] == pytest.approx(
                1 + (row["exposed_ms"] or 0) / r["no_comm_step_ms"]), (spec, name)
            if name == "no_comm":
                assert row["a2a_bytes"] == 0 and row["fwd_a2a_ms"] == row["bwd_a2a_ms"] == 0
                assert row["fwd_hidden_pct"] is None and row["exposed_ms"] is None
                continue
            n_counts = 2 if name.startswith("two_batch") else 1
            assert row["fwd_counts_ms"] == pytest.approx(n_counts * latency_ms, rel=0.02)
            assert row["bwd_counts_ms"] == 0, (spec, name)
            assert row["fwd_a2a_ms"] > row["fwd_counts_ms"] and row["bwd_a2a_ms"] > 0
            for p in bench.PASSES:
                assert 0 <= row[f"{p}_hidden_pct"] <= 100, (spec, name, p)
                assert row[f"{p}_exposed_ms"] >= -1e-6, (spec, name, p)
        # the same rows travel, whichever variant; two micro-batches exchange the counts twice
        sent = rows["ep_moe"]["a2a_bytes"]
        assert sent > 0 and all(rows[n]["a2a_bytes"] == sent
                                for n in ("shared_overlap", "deferred_wgrad"))
        for name in ("two_batch", "two_batch_deferred"):
            assert rows[name]["a2a_bytes"] == sent + 8 * E // P * (P - 1), name
        t = r["targets"]
        assert set(t) == {"two micro-batches: forward all-to-all hidden >= 70%",
                          "two micro-batches: backward all-to-all hidden >= 60%",
                          "two micro-batches: step <= 1.15 x the no-communication optimum"}
        assert all(x["met"] in (True, False) and x["judged"] == (spec == "dgx-h100")
                   for x in t.values()), t
        assert 0 < t["two micro-batches: forward all-to-all hidden >= 70%"]["ceiling"] < 75      # three of four token exchanges
    assert max(losses) - min(losses) <= 1e-4 * abs(losses[0]), losses
    text = bench.report(result)
    assert text.startswith("ep_overlap benchmark, SIMULATED link: dgx-h100"), text
    assert "[dgx-h100] SIMULATED link: dgx-h100" in text and "targets (benchmark figures" in text
    assert "[dgx-h100:2nodes] SIMULATED link: dgx-h100, nodes of 1 ranks" in text
    bench.figure(result).write_html(tmp_path / "f.html")
    assert (tmp_path / "f.html").stat().st_size > 1000


def test_bad_options_fail_in_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as err:
        bench.run_bench(parse(bench, "--variants", "ep_moe,two", "--link", "none",
                              "dgx-h100-ib:2nodes", "dgx-h100:3nodes", "--nproc", "2",
                              "--experts", "5", "--top-k", "6", "--tokens", "7",
                              "--capacity-factor", "0"))
    assert err.value.code == 2
    message = str(err.value)
    assert "\n" not in message and message.startswith("workbook bench ep_overlap: ")
    for part in ("unknown variant(s) ['two']", "unknown link preset 'none'",
                 "dgx-h100-ib is flat", "2 ranks do not split into 3 equal nodes",
                 "--experts 5 is not divisible by --nproc 2", "--top-k 6 is larger than",
                 "--tokens 7 must be even", "--capacity-factor 0.0: must be a number > 0"):
        assert part in message, (part, message)
    assert capsys.readouterr().err.strip() == message
    with pytest.raises(SystemExit, match="^workbook bench ep_overlap: .*--nproc 5: 2 to 4 ranks"):
        bench.main(["--nproc", "5"])
    for bad in ("-0.5", "nan"):
        with pytest.raises(SystemExit, match="^workbook bench ep_overlap: --capacity-factor"):
            bench.main(["--capacity-factor", bad])
    with pytest.raises(SystemExit, match="^workbook bench ep_overlap: unknown option"):
        bench.measure(hiden=64)
    with pytest.raises(SystemExit, match="^workbook bench ep_overlap: no lab file .*ep_overlap"):
        bench.measure(impl=str(tmp_path))                    # before any rank starts
    (tmp_path / "ep_overlap.py").write_text("def dispatch(:\n")
    with pytest.raises(SystemExit, match="^workbook bench ep_overlap: .*does not import.*line 1"):
        bench.measure(impl=str(tmp_path))


def test_workbook_bench_routes_here(capsys):
    assert_cli_routes(capsys, "ep_overlap", ["--link", "dgx-h100:two"], "--link 'dgx-h100:two'",
                      options=("--link", "--quick", "--variants", "--tokens"))
