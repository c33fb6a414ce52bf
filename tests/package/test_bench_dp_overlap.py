"""``workbook bench dp_overlap``: it runs end to end on tiny shapes, writes every variant and
field for every link, its predictions agree with what the schedule model must give, and bad
options fail at once, in one line."""
from __future__ import annotations

import math

import pytest
from bench_checks import assert_cli_routes, flags, parse, run_tiny

from workbook.data_parallel import dp_overlap_bench as bench

TINY = dict(hidden=32, heads=2, ffn=64, layers=2, batch=4, seq=16, vocab=64)
NAMES = ["naive", "bucketed@1KiB", "bucketed@64KiB", "zero1", "zero2", "zero3", "no_comm"]


def test_bench_runs_end_to_end_on_two_ranks(tmp_path, capsys):
    result, doc = run_tiny(bench, tmp_path, "dp_overlap", *flags(TINY), "--buckets", "1KiB,64K",
                           "--steps", "1", warm=True)
    assert list(doc["links"]) == list(bench.LINKS) and doc["options"]["names"] == NAMES
    for preset, r in doc["links"].items():
        assert preset in r["link_label"] and list(r["variants"]) == NAMES
        for name, row in r["variants"].items():
            assert set(row) == set(bench.FIELDS), (preset, name)
            comm = name != "no_comm"
            for field in ("step_ms", "link_ms", "exposed_ms", "fwd_compute_ms", "bwd_compute_ms",
                          *(("hidden_pct", "bwd_hidden_pct") if comm else ())):
                assert row[field] is not None and math.isfinite(row[field]), (preset, name, field)
            # the link time is modelled: the prediction from the shapes is the same sum
            assert row["link_ms"] == pytest.approx(r["predicted"][name]["link_ms"], rel=1e-3)
        assert r["variants"]["no_comm"]["link_ms"] == 0
        assert r["variants"]["naive"]["hidden_pct"] < 20                # blocking: nothing hides
        assert r["predicted"]["naive"]["hidden_pct"] == pytest.approx(0, abs=1e-9)
        assert r["variants"]["zero3"]["fwd_hidden_pct"] is not None
        assert set(r["ratios"]) == {"bucketed@1KiB", "bucketed@64KiB", "zero3"}
        assert set(r["targets"]) == {"bucketed@1KiB hidden %", "bucketed@64KiB hidden %",
                                     "zero3 forward hidden %"}
        assert r["targets"]["zero3 forward hidden %"]["met"] in (True, False)
    for name, m in doc["memory"].items():                       # the ZeRO table, exactly
        assert m["measured"] == m["predicted"], name
    text = capsys.readouterr().out
    first = text.splitlines()[0]
    assert first.startswith("dp_overlap benchmark, SIMULATED link: dgx-h100 (calibrated"), first
    assert "[dgx-h100-ib] SIMULATED link: dgx-h100-ib" in text and "NOT met" in text
    assert bench.report(result).splitlines()[0] == first


def test_schedule_model():
    """``_play``: a blocking op after the compute is all exposed; an op issued before enough
    compute is all hidden; a queue behind a long op starts late."""
    assert bench._play([("c", 1.0), ("i", 0.5), ("w", None)]) == (0.5, 0.0)
    assert bench._play([("i", 0.5), ("c", 1.0), ("w", 0)]) == (0.5, 0.5)
    assert bench._play([("i", 1.0), ("i", 1.0), ("c", 1.5), ("w", None)]) == (2.0, 1.5)
    assert bench.names(["naive", "bucketed"], "256KiB,1M") == ["naive", "bucketed@256KiB",
                                                                "bucketed@1MiB"]


def test_sizes_with_binary_suffixes():
    """``workbook.communication.bandwidth_bench.parse_size`` reads 256KiB as well as 256K (it once upper-cased the text
    and then looked for a lower-case i)."""
    from workbook.measure.bench_cli import parse_size
    assert [parse_size(t) for t in ("4096", "1K", "256KiB", "1MiB", "64M", "1GB", "8B")] == \
        [4096, 1024, 256 << 10, 1 << 20, 64 << 20, 1 << 30, 8]
    assert bench.size("4MiB") == 4 << 20
    with pytest.raises(ValueError, match="not a size"):
        parse_size("1Q")


def test_bad_options_fail_in_one_line():
    with pytest.raises(SystemExit) as err:
        bench.run_bench(parse(bench, "--heads", "5", "--nproc", "3", "--variants", "naive,ring",
                              "--link", "nvlink", "--buckets", "1Q"))
    message = str(err.value)
    assert "\n" not in message and message.startswith("workbook bench dp_overlap: ")
    d = bench.DEFAULTS
    for part in ("unknown variant(s) ['ring']", "unknown link preset(s) ['nvlink']",
                 "--buckets '1Q'", f"--heads 5 must divide --hidden {d['hidden']}",
                 f"--nproc 3 must divide --batch {d['batch']}"):
        assert part in message, (part, message)
    with pytest.raises(SystemExit, match="^workbook bench dp_overlap: unknown option"):
        bench.measure(hiden=64)


def test_cli_routes_bench_dp_overlap(capsys):
    assert_cli_routes(capsys, "dp_overlap", ["--link", "dgx-h100", "nvlink"],
                      "unknown link preset", usage_error=False)
