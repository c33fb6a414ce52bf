"""``workbook plan`` (``workbook.capstone``): its formulas against values computed by hand, the
Llama 3 405B table of docs/plan-llama3.md within the stated error, the rules' one-line errors
(exit 2), and ``--search`` ranking only what fits.

Pure arithmetic, no torch and no ranks: the whole file runs in a few seconds.
"""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from workbook.capstone.plan import bubble_fraction, fit_efficiency, predict
from workbook.capstone.plan_comm import comm_times, groups
from workbook.capstone.plan_flops import layer_params, model_flops_per_token, total_params
from workbook.capstone.plan_memory import (activation_bytes_per_layer, chunks_in_flight,
                                           state_bytes)
from workbook.capstone.plan_shapes import (MODELS, Cluster, Model, PlanError, Split, parse_count,
                                           resolve)
from workbook.cli import main

# a toy model every figure of which can be checked on paper: h 8, 2 heads of 4, 1 KV head, f 16
TOY = Model(layers=4, hidden=8, ffn=16, heads=2, vocab=32, seq=8, kv_heads=1)
ONE_GPU = Cluster("dgx-h100", nodes=1, gpus_per_node=1, peak_tflops=1000.0, efficiency=0.5)
LLAMA = dict(MODELS["llama3-405b"])


# ----------------------------------------------------------------------------- formulas by hand
def test_parameters_and_flops_by_hand():
    # 2 h^2 + 2 h k d + 3 h f = 128 + 2*8*1*4 + 3*8*16 = 128 + 64 + 384
    assert layer_params(TOY) == 576
    assert total_params(TOY) == 4 * 576 + 2 * 8 * 32
    # 6 N + 6 L s h, N = L P_layer + h V
    assert model_flops_per_token(TOY) == 6 * (4 * 576 + 8 * 32) + 6 * 4 * 8 * 8
    llama = Model(seq=8192, **LLAMA)
    assert 405e9 < total_params(llama) < 406.5e9              # "405B", the paper's Table 3


def test_bubble_and_chunks_in_flight_by_hand():
    assert bubble_fraction(16, 32, 4) == pytest.approx(15 / 143)
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)
    split = Split(pp=16, dp=1, global_batch=32, virtual=4)
    # Megatron's warm-up on stage 0: 2 (p-1) + (v-1) p, plus the one running
    assert chunks_in_flight(0, split) == 2 * 15 + 3 * 16 + 1
    assert chunks_in_flight(0, replace(split, virtual=1)) == 16      # 1F1B: p micro-batches
    assert chunks_in_flight(15, replace(split, virtual=1)) == 1


def test_memory_terms_by_hand():
    split = Split(tp=1, cp=2, dp=2, zero=1)
    # ZeRO-1 over DP x CP = 4: 2 + 4 + 12/4 bytes a weight
    assert state_bytes(100, split) == {"params": 200, "grads": 400, "optimizer": 300}
    assert sum(state_bytes(100, replace(split, zero=3)).values()) == pytest.approx(1800 / 4)
    # A_none = b (s/CP) h (12 + 4 k/a + 6 f/h) / TP = 1 * 8 * 8 * (12 + 2 + 12)
    assert activation_bytes_per_layer(TOY, Split()) == 8 * 8 * 26
    assert activation_bytes_per_layer(TOY, Split(recompute="selective")) == 8 * 8 * 12
    assert activation_bytes_per_layer(TOY, Split(tp=2, cp=2, recompute="full")) == 4 * 8 * 2 / 2


def test_groups_and_collective_times_by_hand():
    cluster = Cluster("dgx-h100", nodes=4, gpus_per_node=8, peak_tflops=989.0)
    split = resolve(Model(seq=8192, **LLAMA), cluster, Split(tp=8, cp=2, pp=2))
    g = groups(split)
    assert g["tp"] == tuple(range(8)) and g["cp"] == (0, 8) and g["pp"] == (0, 16)
    assert g["dp"] == (0, 8)                                 # DP x CP: DP 1, the CP pair
    model = Model(seq=8192, **LLAMA)
    c = comm_times(model, cluster, split, stage_params=1e9)
    act = 1 * 4096 * 16384 * 2                              # b (s/CP) h bf16
    ag = 2e-6 + act * 7 / 8 / 900e9                         # NVLink: 900 GB/s, 2 us
    assert c.tp_fwd == pytest.approx(4 * ag)               # 2 AG + 2 RS, same cost each
    assert c.p2p == pytest.approx(5e-6 + act / 8 / 50e9)    # across nodes: one 50 GB/s card
    assert c.dp_grads == pytest.approx(5e-6 + 1e9 * 4 * 0.5 / 50e9)   # fp32 RS over 2 nodes


def test_one_gpu_without_communication_runs_at_the_efficiency():
    # nothing to wait for, no bubble: model FLOPs = executed FLOPs, so MFU = efficiency
    pred = predict(TOY, ONE_GPU, Split(global_batch=4))
    assert pred.mfu == pytest.approx(0.5)
    assert pred.step_s == pytest.approx(4 * 8 * model_flops_per_token(TOY) / 500e12)


def test_the_bubble_is_the_textbook_formula():
    cluster = replace(ONE_GPU, gpus_per_node=4)
    pred = predict(TOY, cluster, Split(pp=4, global_batch=8))
    busy = pred.parts["compute"] + pred.parts["bubble"]
    assert pred.parts["bubble"] / busy == pytest.approx(bubble_fraction(4, 8))
    assert sum(pred.parts.values()) == pytest.approx(pred.step_s)


def test_each_overlap_hides_and_none_slows_the_step():
    model = Model(seq=8192, **LLAMA)
    cluster = Cluster("dgx-h100", nodes=64, gpus_per_node=8, peak_tflops=989.0, efficiency=0.6)
    base = Split(tp=8, cp=2, pp=2, global_batch=256, overlaps=frozenset())
    off = predict(model, cluster, base)
    for name in ("tp", "cp", "pp", "dp"):
        on = predict(model, cluster, replace(base, overlaps=frozenset({name})))
        assert on.parts[name] < off.parts[name], name
        assert on.step_s < off.step_s, name
    assert off.parts["tp"] == pytest.approx(off.comm["tp"])      # off: all of it shows


def test_fit_efficiency_reproduces_the_target():
    model = Model(seq=8192, **LLAMA)
    cluster = Cluster("dgx-h100", nodes=1024, gpus_per_node=8, peak_tflops=989.0)
    split = Split(tp=8, pp=16, virtual=4, global_batch=2048, embedding_as_layer=True,
                  loss_as_layer=True, recompute="selective")
    eff = fit_efficiency(model, cluster, split, 430.0)
    assert predict(model, replace(cluster, efficiency=eff), split).tflops == pytest.approx(430.0)


# ----------------------------------------------------------------------------- Llama 3 405B
LLAMA_ARGS = ("--model llama3-405b --peak-tflops 989 --tp 8 --pp 16 --virtual-stages 4 "
              "--global-batch-tokens 16M --embedding-as-layer --loss-as-layer "
              "--recompute selective --overlap tp,pp,dp").split()
ROWS = [("--seq 8192 --nodes 1024", 430.0),                # fitted
        ("--seq 8192 --nodes 2048", 400.0),
        ("--seq 131072 --cp 16 --nodes 2048", 380.0)]


def plan_json(capsys, args) -> dict:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_llama3_405b_rows_within_15_percent(capsys):
    """docs/plan-llama3.md: one efficiency fitted on row 1, rows 2 and 3 predicted."""
    fit = plan_json(capsys, ROWS[0][0].split() + LLAMA_ARGS + ["--fit-tflops", "430"])
    eff = round(fit["cluster"]["efficiency"], 3)
    assert eff == pytest.approx(0.627, abs=0.002)
    for row, target in ROWS:
        out = plan_json(capsys, row.split() + LLAMA_ARGS + ["--efficiency", str(eff)])
        assert abs(out["tflops_per_gpu"] / target - 1) < 0.15, (row, out["tflops_per_gpu"])
        assert out["memory"]["fits"], row
    assert out["split"]["dp"] == 8                         # 16,384 / (8 x 16 x 16)


# ----------------------------------------------------------------------------- bad input
BAD = [("--nodes 1024 --tp 8 --pp 12", "does not divide the 8192 GPUs"),
       ("--nodes 1024 --tp 8 --pp 16 --dp 32", "the product must equal the GPU count"),
       ("--nodes 1024 --tp 8 --pp 16", "must be a multiple of PP x v"),
       ("--nodes 1024 --tp 8 --pp 16 --embedding-as-layer --loss-as-layer --global-batch 100",
        "must be a multiple of micro-batch x DP"),
       ("--nodes 2 --tp 16 --pp 1", "TP=16 does not divide the 8 KV heads"),
       ("--nodes 2 --tp 8 --cp 2 --seq 8190", "multiple of 2 x CP"),
       ("--nodes 1 --tp 8 --global-batch-tokens 1000", "multiple of --seq"),
       ("--nodes 1 --tp 8 --overlap tp,xx", "unknown overlap xx"),
       ("--nodes 1 --tp 8 --efficiency 1.5", "share of the peak"),
       ("--nodes 1 --tp 8 --search", "--search compares splits on one batch")]


@pytest.mark.parametrize("args, rule", BAD)
def test_a_broken_rule_is_one_line_and_exit_2(capsys, args, rule):
    argv = ["plan", "--model", "llama3-405b", "--seq", "8192", *args.split()]
    if "--seq" in args.split():
        argv = ["plan", "--model", "llama3-405b", *args.split()]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and rule in err, err
    assert err.startswith("workbook plan")


def test_a_split_that_does_not_fit_says_by_how_much_and_what_dominates(capsys):
    rc = main(["plan", "--model", "llama3-70b", "--seq", "8192", "--nodes", "1", "--tp", "8"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "does not fit:" in out and "GB over 80 GB" in out and "the largest term:" in out


# ----------------------------------------------------------------------------- search
def test_search_ranks_only_what_fits(capsys):
    args = ("--model llama3-70b --seq 8192 --nodes 8 --peak-tflops 989 --efficiency 0.6 "
            "--global-batch 256 --recompute selective --top 50").split()
    out = plan_json(capsys, args + ["--search"])
    ranked = out["ranked"]
    assert ranked and out["fitting"] >= len(ranked) and out["too_big"] > 0
    assert all(r["memory"]["fits"] for r in ranked)
    tflops = [r["tflops_per_gpu"] for r in ranked]
    assert tflops == sorted(tflops, reverse=True)
    assert all(not r["memory"]["fits"] for r in out["closest_too_big"])
    assert main(["plan", *args, "--search"]) == 0
    text = capsys.readouterr().out
    assert "closest that do not fit:" in text and "the largest term:" in text


def test_search_with_nothing_that_fits_exits_1(capsys):
    rc = main("plan --model llama3-405b --seq 8192 --nodes 1 --global-batch 8 --search".split())
    out = capsys.readouterr().out
    assert rc == 1 and " 0 fit in 80 GB" in out


def test_counts_read_as_the_paper_writes_them():
    assert parse_count("16M") == 1 << 24 and parse_count("8K") == 8192
    with pytest.raises(PlanError, match="whole count"):
        parse_count("1.5K3")
