"""``workbook bench tp_overlap``: its variants compute the same step, it runs end to end, and bad
options fail at once.

The benchmark is a timing tool, but its tp_overlap variants are code of their own (the lab's
``OverlapBlock`` s on sequence shards, the sequence gathered for the TPStack's head): their loss
and every gradient must equal vanilla TP's, or their timings would be of the wrong computation.
"""
from __future__ import annotations

import argparse
import json
import math

import pytest

from workbook.tensor_parallel import tp_overlap_bench

TINY = dict(hidden=64, heads=4, ffn=256, layers=2, batch=4, seq=32, vocab=128, p=2)


def _lab_variants_against_vanilla():
    import torch
    import torch.distributed as dist

    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig
    from workbook.tensor_parallel.mappings import sequence_range
    from workbook.tensor_parallel.layer_stack import TPStack
    domino, lab = load_lab("domino", "solutions"), load_lab("tp_overlap", "solutions")
    cfg = ModelConfig(hidden=64, heads=4, ffn_hidden=256, n_layers=2, seq_len=16, vocab_size=128,
                      dtype="float64", dropout=0.1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, 64, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 128, (4, 16), generator=g)
    m = TPStack(cfg, dist.get_rank(), dist.get_world_size())
    want_loss = domino.train_step(m, x, targets, variant="vanilla_tp", step=3).item()
    want = {k: t.grad.clone() for k, t in m.params.items()}
    m.zero_grad()
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
    for rank, errors in enumerate(run(_lab_variants_against_vanilla, 2)):
        for variant, (loss_err, (grad_err, name)) in errors.items():
            assert loss_err < 1e-12, f"rank {rank}, {variant}: loss differs by {loss_err:.1e}"
            assert grad_err < 1e-12, f"rank {rank}, {variant}: gradient of {name} differs by {grad_err:.1e}"


def _args(*argv):
    parser = argparse.ArgumentParser()
    tp_overlap_bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_bench_runs_end_to_end_on_two_ranks(tmp_path, capsys):
    tiny = [f"--{k}={v}" for k, v in TINY.items()]
    path = tmp_path / "tp_overlap.json"
    result = tp_overlap_bench.run_bench(_args(*tiny, "--steps", "1", "--warmup", "1",
                                              "--trace-dir", str(tmp_path / "traces"),
                                              "--json", str(path), "--figure", str(tmp_path / "f.html")))
    doc = json.loads(path.read_text())
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
    assert (tmp_path / "f.html").stat().st_size > 1000


def test_bad_options_fail_in_one_line():
    with pytest.raises(SystemExit) as err:
        tp_overlap_bench.run_bench(_args("--p", "3", "--heads", "5", "--nproc", "3",
                                         "--variants", "sp,ring"))
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
    from workbook.cli import main
    with pytest.raises(SystemExit, match="--p 3 must divide --batch"):
        main(["bench", "tp_overlap", "--p", "3"])
    with pytest.raises(SystemExit):
        main(["bench", "tp_overlap", "--help"])
    assert "workbook bench tp_overlap" in capsys.readouterr().out
    assert main(["bench", "--nproc", "2", "tp_overlap"]) == 2
