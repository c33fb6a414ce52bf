"""``workbook bench domino``: its variants compute the same step, and bad shapes fail at once.

The benchmark is a timing tool, but its sequence-parallel variant is code of its own (the SP
lab's conjugate ops on the weights of ``workbook.tensor_parallel.layer_stack``): its loss and every gradient must
equal vanilla TP's, or its timings would be of the wrong computation.
"""
from __future__ import annotations

import pytest

from workbook.tensor_parallel import domino_bench


def _sp_against_vanilla():
    import torch
    import torch.distributed as dist

    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig
    from workbook.tensor_parallel.layer_stack import TPStack
    lab, sp = load_lab("domino", "solutions"), load_lab("sp", "solutions")
    cfg = ModelConfig(hidden=64, heads=4, ffn_hidden=256, n_layers=2, seq_len=16, vocab_size=128,
                      dtype="float64", dropout=0.1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, 64, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 128, (4, 16), generator=g)
    m = TPStack(cfg, dist.get_rank(), dist.get_world_size())
    vanilla_loss = lab.train_step(m, x, targets, variant="vanilla_tp", step=3).item()
    vanilla = {k: t.grad.clone() for k, t in m.params.items()}
    m.zero_grad()
    loss = domino_bench._sp_forward(sp, m, x, targets, 3)
    loss.backward()
    domino_bench._all_reduce_sequence_parallel_grads(m)
    worst = max(((vanilla[k] - t.grad).abs().max().item(), k) for k, t in m.params.items())
    return abs(loss.item() - vanilla_loss), worst


def test_sp_variant_computes_what_vanilla_tp_computes():
    from workbook.runtime.launch import run
    for rank, (loss_err, (grad_err, name)) in enumerate(run(_sp_against_vanilla, 2)):
        assert loss_err < 1e-12, f"rank {rank}: SP loss differs from vanilla TP's by {loss_err:.1e}"
        assert grad_err < 1e-12, f"rank {rank}: gradient of {name} differs by {grad_err:.1e}"


def test_shapes_that_do_not_divide_fail_in_one_line():
    import argparse
    parser = argparse.ArgumentParser()
    domino_bench.add_arguments(parser)
    args = parser.parse_args(["--p", "3", "--heads", "5"])
    with pytest.raises(SystemExit) as err:
        domino_bench.run_bench(args)
    message = str(err.value)
    assert "\n" not in message
    assert "--p 3 must divide --batch 16" in message and "--heads 5 must divide --hidden" in message


def test_nodes_that_do_not_split_the_ranks_fail_in_one_line():
    import argparse
    parser = argparse.ArgumentParser()
    domino_bench.add_arguments(parser)
    with pytest.raises(SystemExit, match=r"--nnodes 3 must divide --nproc 4 \(nodes of equal"):
        domino_bench.run_bench(parser.parse_args(["--nproc", "4", "--nnodes", "3"]))


def test_tensor_parallelism_across_two_nodes_pays_the_network(capsys):
    """A small model on 2 ranks, one per simulated node: every TP all-reduce crosses the network,
    so each is charged one network card's cost (the link's own model, as the ranks saw it)."""
    import argparse
    parser = argparse.ArgumentParser()
    domino_bench.add_arguments(parser)
    args = parser.parse_args(["--nproc", "2", "--nnodes", "2", "--hidden", "64", "--heads", "4",
                              "--ffn", "256", "--batch", "4", "--seq", "32", "--vocab", "128",
                              "--p", "2", "--steps", "1", "--variants", "vanilla_tp,no_comm"])
    result = domino_bench.run_bench(args)
    out = capsys.readouterr().out
    assert out.startswith("Domino benchmark: 2 ranks on 2 simulated nodes of 1, simulated link")
    assert "tensor parallelism spans 2 nodes" in out
    assert result["topology"] and result["nnodes"] == 2
    assert result["variants"]["vanilla_tp"]["comm_ms"] > 0
    info = result["link_info"]                       # as the ranks' link described itself
    assert info["ranks_per_node"] == 1
    assert info["network_GBps"] == pytest.approx(info["bandwidth_GBps"] * 50 / 900)   # one card
