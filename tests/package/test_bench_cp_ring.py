"""``workbook bench cp_ring``: it runs end to end on tiny shapes, writes every case, pass and
field for every link, its ring-step bookkeeping matches the lab's schedule, and bad options fail
at once, in one line, with exit status 2."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest
from bench_checks import assert_cli_routes, parse, run_tiny

from workbook.context_parallel import cp_ring_bench as bench
from workbook.context_parallel import Layout, contiguous_layout

TINY = ["--seq", "32,64", "--heads", "2", "--head-dim", "8", "--repeats", "1"]


def test_bench_runs_end_to_end_on_two_ranks(tmp_path, capsys):
    result, doc = run_tiny(bench, tmp_path, "cp_ring", *TINY, warm=True)
    cases = ["32/contiguous", "32/zigzag", "64/contiguous", "64/zigzag"]
    assert doc["nproc"] == 2 and doc["options"]["seqs"] == [32, 64] and list(doc["balance"]) == cases
    for case, b in doc["balance"].items():
        assert len(b["causal_work"]) == 2 and len(b["compute_ms"]) == 2, case
        assert all(c > 0 for c in b["compute_ms"]), case
        if case.endswith("zigzag"):                     # the same causal work on every rank
            assert b["work_imbalance"] == 1.0 and b["chunks"] == [[0, 3], [1, 2]], case
        else:                                           # the last rank sees the whole sequence
            assert b["work_imbalance"] > 1.4 and b["causal_work"][0] < b["causal_work"][1], case
    assert list(doc["links"]) == list(bench.LINKS)
    for preset, r in doc["links"].items():
        assert preset in r["link_label"] and list(r["cases"]) == cases
        for case, c in r["cases"].items():
            assert c["hop_bytes"] == 2 * 1 * 2 * (c["seq"] // 2) * 8 * 4, case
            for phase, p in c["passes"].items():
                where = (preset, case, phase)
                assert set(bench.FIELDS) <= set(p), where
                for field in ("step_ms", "no_comm_ms", "link_ms", "exposed_ms", "skew_ms",
                              "hidden_pct", "hideable_hidden_pct", "ratio"):
                    assert p[field] is not None and math.isfinite(p[field]), (*where, field)
                # n - 1 K/V hops forward; n - 1 of K/V and n of dK/dV backward (on 2 ranks)
                assert p["hops"] == (1 if phase == "forward" else 3), where
                assert p["link_ms"] == pytest.approx(p["hops"] * p["hop_ms"], rel=1e-6), where
                if phase == "forward":
                    assert p["by_design_ms"] == 0, where
                else:       # the last dK/dV hop: its send and receive, at least one hop's time
                    assert p["hop_ms"] * 0.999 <= p["by_design_ms"] <= 2 * p["hop_ms"] * 1.001, where
                assert [s["hops"] for s in p["steps"]] == bench.hops_behind(2, phase), where
                for s in p["steps"]:
                    assert len(s["compute_ms"]) == 2 and len(s["ratio"]) == 2, where
                t = c["targets"][phase]
                assert t["ratio"] == p["ratio"] and t["met"] in (True, False, None), where
                if p["ratio"] < 1:
                    assert t["met"] is None, where
        # the contiguous split's rank 0 has no block at the backward's last step: ratio 0
        back = r["cases"]["64/contiguous"]["passes"]["backward"]
        assert back["ratio"] == 0 and back["ratio_at"] == {"rank": 0, "step": 1}
    text = capsys.readouterr().out
    first = text.splitlines()[0]
    assert first.startswith("cp_ring benchmark, SIMULATED link: dgx-h100 (calibrated"), first
    assert "[dgx-h100-ib] SIMULATED link: dgx-h100-ib" in text and "n/a (ratio < 1)" in text
    assert "target: ring attention hides at least 80% of the K/V exchange" in text
    assert bench.report(result).splitlines()[0] == first
    assert (tmp_path / "f.html").stat().st_size > 1000
    assert (tmp_path / "traces" / "dgx-h100" / "S64" / "zigzag" / "step0").is_dir()


def test_ring_bookkeeping():
    """Blocks a rank computes per ring step, and hops behind each step's compute."""
    zig = Layout(16, ((0, 3), (1, 2)), "zigzag")
    assert bench.blocks_per_step(zig, 0) == [3, 2] and bench.blocks_per_step(zig, 1) == [3, 2]
    assert bench.blocks_per_step(contiguous_layout(12, 3), 0) == [1, 0, 0]
    assert bench.blocks_per_step(contiguous_layout(12, 3), 2) == [1, 1, 1]
    assert bench.hops_behind(2, "forward") == [1, 0] and bench.hops_behind(2, "backward") == [1, 1]
    assert bench.hops_behind(4, "forward") == [1, 1, 1, 0]
    assert bench.hops_behind(4, "backward") == [1, 2, 2, 1]     # 3 K/V + 3 dK/dV; the 4th follows
    ms = 10 ** 6                                                  # the last hop's send and receive
    assert bench._union_ms([(0, ms), (ms // 2, 2 * ms)]) == 2.0   # a late peer: they do not coincide
    assert bench._union_ms([(0, ms), (3 * ms, 4 * ms)]) == 2.0 and bench._union_ms([]) == 0


def test_bad_options_fail_in_one_line(capsys):
    with pytest.raises(SystemExit) as err:
        bench.run_bench(parse(bench, "--nproc", "5", "--link", "nvlink", "none", "--seq",
                              "1000,36", "--splits", "contiguous,diagonal", "--heads", "0"))
    assert err.value.code == 2
    message = str(err.value)
    assert "\n" not in message and message.startswith("workbook bench cp_ring: ")
    assert capsys.readouterr().err.strip() == message
    for part in ("unknown link preset(s) ['nvlink', 'none']", "unknown split(s) ['diagonal']",
                 "--nproc 5: 2 to 4", "--seq 1000,36: every length must be a multiple of 2 x "
                 "nproc = 10", "--batch, --heads and --head-dim must be at least 1"):
        assert part in message, (part, message)
    with pytest.raises(SystemExit, match=r"^workbook bench cp_ring: --seq '1k,2k'"):
        bench.run_bench(parse(bench, "--seq", "1k,2k"))
    with pytest.raises(SystemExit, match="^workbook bench cp_ring: unknown option"):
        bench.measure(hiden=64)
    with pytest.raises(SystemExit, match="--repeats must be at least 1"):
        bench.measure(repeats=0)


def test_module_runs_as_a_command():
    """``python -m workbook.context_parallel.cp_ring_bench``: its own parser, a bad option exits 2 in one line."""
    done = subprocess.run([sys.executable, "-m", "workbook.context_parallel.cp_ring_bench", "--nproc", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == "workbook bench cp_ring: --nproc 1: 2 to 4 context-parallel ranks"


def test_cli_routes_bench_cp_ring(capsys):
    assert_cli_routes(capsys, "cp_ring", ["--link", "dgx-h100", "nvlink"], "unknown link preset",
                      options=("--head-dim", "--seq"))
