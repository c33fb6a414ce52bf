"""``workbook bench tp_overlap``: its variants compute the same step, it runs end to end, and bad
options fail at once.

The benchmark is a timing tool, but its tp_overlap variants are code of their own (the lab's
``OverlapBlock`` s on sequence shards, the sequence gathered for the TPStack's head): their loss
and every gradient must equal vanilla TP's, or their timings would be of the wrong computation.
"""
from __future__ import annotations

import math

import pytest
from bench_checks import assert_cli_routes, flags, parse, run_tiny, vanilla_tp_step

from workbook.tensor_parallel import tp_overlap_bench

TINY = dict(hidden=64, heads=4, ffn=256, layers=2, batch=4, seq=32, vocab=128, p=2)


def _lab_variants_against_vanilla():
    import torch

    from workbook.grading.labs import load_lab
    from workbook.tensor_parallel.mappings import sequence_range
    lab = load_lab("tp_overlap", "solutions")
    m, cfg, x, targets, want_loss, want = vanilla_tp_step()
    xs = x[:, slice(*sequence_range(16))].contiguous()
    errors = {}
    for variant in ("sp", "pipelined+bulk", "chunked+bulk"):
        blocks = torch.nn.ModuleList(lab.OverlapBlock(cfg, i, overlap=lab.VARIANTS[variant])
                                     for i in range(cfg.n_layers))
        loss = tp_overlap_bench.lab_step(lab, blocks, m, xs, targets, 3)
        grads = {f"blocks.{i}.{k}": p.grad for i, b in enumerate(blocks)
                 for k, p in b.named_parameters()}
        grads.update({k: t.grad for k, t in m.params.items() if not k.startswith("blocks.")})
        assert set(grads) == set(want), sorted(set(want) ^ set(grads))
        errors[variant] = (abs(loss.item() - want_loss),
                           max(((want[k] - grads[k]).abs().max().item(), k) for k in want))
        m.zero_grad()
    return errors


def test_lab_variants_compute_what_vanilla_tp_computes():
    from workbook.runtime.launch import run
    for rank, errors in enumerate(run(_lab_variants_against_vanilla, 2, pool=True)):
        for variant, (loss_err, (grad_err, name)) in errors.items():
            assert loss_err < 1e-12, f"rank {rank}, {variant}: loss differs by {loss_err:.1e}"
            assert grad_err < 1e-12, f"rank {rank}, {variant}: gradient of {name} differs by {grad_err:.1e}"


def test_bench_runs_end_to_end_on_two_ranks(tmp_path, capsys):
    result, doc = run_tiny(tp_overlap_bench, tmp_path, "tp_overlap", *flags(TINY), "--steps", "1",
                           "--warmup", "1")
    assert set(doc["variants"]) == set(tp_overlap_bench.VARIANTS)
    for name, row in doc["variants"].items():
        figures = tp_overlap_bench.FIELDS if name != "no_comm" else ("step_ms", "comm_ms")
        for field in figures:
            assert row[field] is not None and math.isfinite(row[field]), (name, field, row[field])
    assert doc["variants"]["no_comm"]["comm_ms"] == 0
    f = doc["comm_fraction_pct"]
    assert 0 < f < 100 and doc["ceiling"] == pytest.approx(1 / (1 - f / 100))
    assert doc["targets"]["backward hidden %"]["met"] in (True, False)
    text = capsys.readouterr().out
    first = text.splitlines()[0]
    assert "SIMULATED link: dgx-h100" in first, first
    assert "simulated figures" in text and "like for like" in text
    assert tp_overlap_bench.report(result).splitlines()[0] == first
    assert "SIMULATED" in tp_overlap_bench.figure(result).layout.title.text


def test_bad_options_fail_in_one_line():
    with pytest.raises(SystemExit) as err:
        tp_overlap_bench.run_bench(parse(tp_overlap_bench, "--p", "3", "--heads", "5", "--nproc",
                                         "3", "--variants", "sp,ring"))
    message = str(err.value)
    assert "\n" not in message and message.startswith("workbook bench tp_overlap: ")
    d = tp_overlap_bench.DEFAULTS
    for part in ("unknown variant(s) ['ring']", f"--p 3 must divide --batch {d['batch']}",
                 f"--heads 5 must divide --hidden {d['hidden']}", "--nproc 3 must divide --heads 5",
                 f"--nproc 3 must divide --seq {d['seq']}"):
        assert part in message, (part, message)
    with pytest.raises(SystemExit, match="^workbook bench tp_overlap: unknown option"):
        tp_overlap_bench.measure(hiden=64)
    with pytest.raises(SystemExit, match=f"--chunks 3 must divide the {d['seq'] // 2} positions"):
        tp_overlap_bench.measure(chunks=3, link="pcie-h100")
    with pytest.raises(SystemExit, match="unknown link preset 'nvlink'"):
        tp_overlap_bench.measure(link="nvlink")


def test_cli_routes_bench_tp_overlap(capsys):
    assert_cli_routes(capsys, "tp_overlap", ["--p", "3"], "--p 3 must divide --batch",
                      usage_error=False)
