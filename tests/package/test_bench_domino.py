"""``workbook bench domino``: its variants compute the same step, and bad shapes fail at once.

The benchmark is a timing tool, but its sequence-parallel variant is code of its own (the SP
lab's conjugate ops on the weights of ``workbook.tensor_parallel.layer_stack``): its loss and every gradient must
equal vanilla TP's, or its timings would be of the wrong computation.
"""
from __future__ import annotations

import pytest
from bench_checks import parse, vanilla_tp_step

from workbook.tensor_parallel import domino_bench


def _sp_against_vanilla():
    from workbook.grading.labs import load_lab
    m, _, x, targets, vanilla_loss, vanilla = vanilla_tp_step()
    sp = load_lab("sp", "solutions")
    loss = domino_bench._sp_forward(sp, m, x, targets, 3)
    loss.backward()
    domino_bench._all_reduce_sequence_parallel_grads(m)
    worst = max(((vanilla[k] - t.grad).abs().max().item(), k) for k, t in m.params.items())
    return abs(loss.item() - vanilla_loss), worst


def test_sp_variant_computes_what_vanilla_tp_computes():
    from workbook.runtime.launch import run
    for rank, (loss_err, (grad_err, name)) in enumerate(run(_sp_against_vanilla, 2, pool=True)):
        assert loss_err < 1e-12, f"rank {rank}: SP loss differs from vanilla TP's by {loss_err:.1e}"
        assert grad_err < 1e-12, f"rank {rank}: gradient of {name} differs by {grad_err:.1e}"


def test_shapes_that_do_not_divide_fail_in_one_line():
    args = parse(domino_bench, "--p", "3", "--heads", "5")
    with pytest.raises(SystemExit) as err:
        domino_bench.run_bench(args)
    message = str(err.value)
    assert "\n" not in message
    assert "--p 3 must divide --batch 16" in message and "--heads 5 must divide --hidden" in message


def test_nodes_that_do_not_split_the_ranks_fail_in_one_line():
    with pytest.raises(SystemExit, match=r"--nnodes 3 must divide --nproc 4 \(nodes of equal"):
        domino_bench.run_bench(parse(domino_bench, "--nproc", "4", "--nnodes", "3"))


def test_tensor_parallelism_across_two_nodes_pays_the_network(capsys):
    """A small model on 2 ranks, one per simulated node: every TP all-reduce crosses the network,
    so each is charged one network card's cost (the link's own model, as the ranks saw it)."""
    args = parse(domino_bench, "--nproc", "2", "--nnodes", "2", "--hidden", "64", "--heads", "4",
                 "--ffn", "256", "--batch", "4", "--seq", "32", "--vocab", "128", "--p", "2",
                 "--steps", "1", "--variants", "vanilla_tp,no_comm")
    result = domino_bench.run_bench(args)
    out = capsys.readouterr().out
    assert out.startswith("Domino benchmark: 2 ranks on 2 simulated nodes of 1, simulated link")
    assert "tensor parallelism spans 2 nodes" in out
    assert result["topology"] and result["nnodes"] == 2
    assert result["variants"]["vanilla_tp"]["comm_ms"] > 0
    info = result["link_info"]                       # as the ranks' link described itself
    assert info["ranks_per_node"] == 1
    assert info["network_GBps"] == pytest.approx(info["bandwidth_GBps"] * 50 / 900)   # one card
