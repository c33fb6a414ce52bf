"""``workbook bench capstone`` (``workbook.capstone.capstone_bench``): one run at the ``--quick``
size on the warm ranks writes every configuration, variant and field, and what it reads from the
lab or the link model holds whatever the load: the three variants of a configuration compute
the same step (the same loss), the overlaps-off variants hide nothing of the DP all-reduce (one
bucket, sent when the backward is over), no_comm is the optimum each ratio divides by, every
hidden share lies in 0-100, the figures are labelled SIMULATED. No speed is judged. Bad
options, a folder without the lab and a lab that does not import fail at once, in one line,
with exit status 2, before any rank starts."""
from __future__ import annotations

import json

import pytest
from bench_checks import assert_cli_routes, parse, run_tiny

from workbook.capstone import capstone_bench as bench


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("capstone_bench")
    out, doc = run_tiny(bench, tmp, "capstone", "--quick", "--repeats", "1", warm=True)
    return out, doc


def test_every_configuration_variant_and_field(result):
    out, doc = result
    assert doc == json.loads(json.dumps(out))                  # what --json wrote
    assert doc["nproc"] == 4 and doc["mesh"] == "2 x 2"
    assert doc["options"]["hidden"] == bench.QUICK["hidden"] and not doc["notes"]
    assert list(doc["kinds"]) == list(bench.KINDS)
    for kind, r in doc["kinds"].items():
        assert "simulated" in r["link_label"].lower() and "dgx-h100" in r["link_label"]
        rows = r["variants"]
        assert list(rows) == list(bench.VARIANTS)
        assert rows["no_comm"]["over_no_comm"] == 1.0
        losses = [row["loss"] for row in rows.values()]
        assert max(losses) - min(losses) <= 1e-4 * abs(losses[0]), (kind, losses)
        for name, row in rows.items():
            assert row["step_ms"] > 0 and row["over_no_comm"] == pytest.approx(
                row["step_ms"] / r["no_comm_step_ms"]), (kind, name)
            assert row["exposed_over_no_comm"] == pytest.approx(
                1 + row["exposed_ms"] / r["no_comm_step_ms"]), (kind, name)
            assert row["exposed_ms"] >= -1e-6 and (name != "no_comm" or row["exposed_ms"] == 0)
            for group in (kind.upper(), "DP"):
                if name == "no_comm":              # no link: nothing on it
                    assert row[f"{group}_comm_ms"] == 0 and row[f"{group}_hidden_pct"] is None
                    continue
                assert row[f"{group}_comm_ms"] > 0, (kind, name, group)
                assert 0 <= row[f"{group}_hidden_pct"] <= 100, (kind, name, group)
                assert 0 <= row[f"{group}_exposed_ms"] <= row[f"{group}_comm_ms"] + 1e-6
        # the same bytes cross the DP group, overlapped or not
        assert rows["overlap"]["DP_comm_ms"] == pytest.approx(rows["no_overlap"]["DP_comm_ms"],
                                                              rel=0.05)
    text = bench.report(out)
    assert text.startswith("capstone benchmark, SIMULATED link: dgx-h100"), text
    for line in ("TP x DP", "PP x DP", "overlaps off", "overlaps on", "no communication"):
        assert line in text, line


def test_bad_options_fail_in_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as err:
        bench.run_bench(parse(bench, "--kinds", "tp,ep", "--link", "none", "--nproc", "3",
                              "--repeats", "0"))
    assert err.value.code == 2
    message = str(err.value)
    assert "\n" not in message and message.startswith("workbook bench capstone: ")
    for part in ("--kinds tp,ep: choose tp, pp or both", "unknown link preset 'none'",
                 "--nproc 3: 2, 4, 6 or 8 ranks", "--repeats 0: at least 1"):
        assert part in message, (part, message)
    assert capsys.readouterr().err.strip() == message
    with pytest.raises(SystemExit, match="^workbook bench capstone: PP x DP: a DP shard of 3 "
                                         "rows does not cut into micro_batches=2"):
        bench.main(["--quick", "--batch", "6"])
    with pytest.raises(SystemExit, match="^workbook bench capstone: TP x DP: batch=10 rows do "
                                         "not split into dp=4"):
        bench.main(["--quick", "--batch", "10", "--nproc", "8"])
    with pytest.raises(SystemExit, match="^workbook bench capstone: PP x DP: n_layers=3"):
        bench.main(["--layers", "3"])
    with pytest.raises(SystemExit, match="^workbook bench capstone: TP x DP: .*heads=3 does "
                                         "not divide hidden=64"):
        bench.main(["--quick", "--heads", "3", "--kinds", "tp"])
    with pytest.raises(SystemExit, match="^workbook bench capstone: --hidden must be at least 1"):
        bench.main(["--hidden", "0"])
    with pytest.raises(SystemExit, match="^workbook bench capstone: unknown option"):
        bench.measure(hiden=64)
    with pytest.raises(SystemExit, match="^workbook bench capstone: no lab file .*capstone"):
        bench.measure(impl=str(tmp_path), quick=True)          # before any rank starts
    (tmp_path / "capstone.py").write_text("def mesh_ranks(:\n")
    with pytest.raises(SystemExit, match="^workbook bench capstone: .*does not import.*line 1"):
        bench.measure(impl=str(tmp_path), quick=True)


def test_workbook_bench_routes_here(capsys):
    assert_cli_routes(capsys, "capstone", ["--kinds", "ep"], "--kinds ep",
                      options=("--kinds", "--quick", "--hidden", "--repeats"))
