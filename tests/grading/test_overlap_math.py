"""Grading the `overlap_math` lab: hand-computed values, then predictions vs measured traces."""
import json
import math

import pytest

from workbook.grading import load_lab
from workbook.grading.engine import on_ranks, world_sizes
from workbook.grading.timing import STRUCTURAL, measure_until_clear

H100 = dict(flops=790e12, bandwidth_Bps=900e9, latency_s=2e-6)


def lab():
    return load_lab("overlap_math")


def layer(**kw):
    base = dict(hidden=1024, ffn_hidden=4096, batch=2, seq=512, style="gpt", bytes_per_element=2)
    base.update(kw)
    return lab().Layer(**base)


def _check(got, want: float, what: str, mistakes: dict | None = None, unit: str = "",
           terms: str = "") -> None:
    """``got`` equals the hand-computed ``want`` (to rounding), else a message that names the
    wrong term when ``got`` is a known wrong derivation (``workbook.grading.predictions``)."""
    from workbook.grading.predictions import judge_prediction
    problem = judge_prediction(got, want, mistakes or {}, what=what, unit=unit, terms=terms,
                               rel_tol=1e-6)
    if problem:
        raise AssertionError(problem)


@pytest.mark.points(1)
@pytest.mark.tasks("linear_flops")
def test_linear_flops():
    for args in ((10, 3, 7), (4096, 8192, 8192)):
        t, d_in, d_out = args
        _check(lab().linear_flops(*args), 2 * t * d_in * d_out, f"linear_flops{args}",
               {"counted one FLOP per multiply-add: a multiply and an add are 2 FLOPs, as "
                "FLOP rates count them": t * d_in * d_out}, unit="FLOPs")


@pytest.mark.points(1)
@pytest.mark.tasks("layer_params")
def test_layer_params_gpt_and_llama():
    h = 1024
    for style, f, mlp, other in (("gpt", 4096, 2, 3), ("llama", 2816, 3, 2)):
        want = 4 * h * h + mlp * h * f
        _check(lab().layer_params(layer(style=style, ffn_hidden=f)), want,
               f"layer_params of a {style!r} layer (hidden {h}, ffn_hidden {f})",
               {f"gave the {style} MLP {other} matrices: a GELU MLP ('gpt') has 2 of hidden x "
                f"ffn_hidden, a SwiGLU MLP ('llama') 3": 4 * h * h + other * h * f,
                "left out attention's four projections": mlp * h * f,
                "counted attention's projections only": 4 * h * h,
                "counted 3 attention projections: query, key, value and the output make 4":
                    3 * h * h + mlp * h * f}, unit="weights")


@pytest.mark.points(1)
@pytest.mark.tasks("layer_forward_flops")
def test_layer_forward_flops_include_attention():
    tokens, params = 2 * 512, 12 * 1024**2
    attention = 4 * 2 * 512**2 * 1024
    expected = 2 * tokens * params + attention
    _check(lab().layer_forward_flops(layer()), expected,
           "layer_forward_flops of a gpt layer (hidden 1024, batch 2, seq 512)",
           {"left out attention's two weightless products (the scores, and the scores applied "
            "to the values)": 2 * tokens * params,
            "counted half of attention's weightless products: there are two (the scores, and "
            "the scores applied to the values), for each sequence of the batch":
                2 * tokens * params + attention / 2,
            "counted the linear layers for one sequence, not for every token of the batch":
                2 * 512 * params + attention,
            "counted one FLOP per weight per token: a multiply-add is 2 FLOPs":
                tokens * params + attention}, unit="FLOPs",
           terms="every weight applied to every token of the batch, and attention's two "
                 "sequence-by-sequence products")


@pytest.mark.points(2)
@pytest.mark.tasks("collective_time")
def test_collective_time_uses_bus_factors():
    L = lab()
    hw = L.Hardware("h100", **H100)
    for op, size, n, bus in (("all_reduce", 9e9, 8, 1.75), ("all_gather", 9e9, 4, 0.75),
                             ("reduce_scatter", 9e9, 3, 2 / 3), ("send", 9e8, 2, 1.0)):
        alpha, beta = H100["latency_s"], H100["bandwidth_Bps"]
        _check(L.collective_time(op, size, n, hw), alpha + size * bus / beta,
               f"collective_time({op!r}, {size:g} bytes, n={n}) on an H100 link", {
                   f"charged the size itself: the busiest link carries the size times the bus "
                   f"factor ({bus:.3g} for {op} on {n} ranks, workbook.link)": alpha + size / beta,
                   "left out the latency (alpha) of the operation": size * bus / beta,
               }, unit="s", terms="the latency, and the size times the collective's bus factor "
                                  "over the bandwidth")
    got = L.collective_time("all_reduce", 9e9, 1, hw)
    if got != 0.0:
        raise AssertionError(f"collective_time('all_reduce', 9e9 bytes, n=1) is {got!r}: a "
                             f"collective among one rank moves nothing and costs 0 s")


def _strategy(name: str, p, comm: float, compute: float, comm_mistakes: dict,
              compute_mistakes: dict, comm_terms: str, compute_terms: str) -> None:
    """One strategy's ``Prediction``: its communication, then its compute."""
    if not hasattr(p, "comm_s") or not hasattr(p, "compute_s"):
        raise AssertionError(f"{name} returned {type(p).__name__}, expected a Prediction")
    _check(p.comm_s, comm, f"{name}: the communication time", comm_mistakes, unit="s",
           terms=comm_terms)
    _check(p.compute_s, compute, f"{name}: the compute time", compute_mistakes, unit="s",
           terms=compute_terms)


@pytest.mark.points(2)
@pytest.mark.tasks("tp_layer", "dp_layer", "zero3_layer", "pp_stage")
def test_tp_dp_zero3_pp_predictions():
    L = lab()
    hw = L.Hardware("h100", **H100)
    ly = layer()
    flops, alpha, beta = H100["flops"], H100["latency_s"], H100["bandwidth_Bps"]
    fwd = 2 * 1024 * (12 * 1024**2) + 4 * 2 * 512**2 * 1024
    act = 2 * 512 * 1024 * 2
    params = 12 * 1024**2 * 2

    def t(size, bus):
        return alpha + size * bus / beta

    base = L.collective_time("all_reduce", act, 4, hw)
    if base != pytest.approx(t(act, 1.5)):
        raise AssertionError("collective_time is not right yet (its own test says how): every "
                             "strategy's communication is made of collective times, so these "
                             "predictions cannot be right before it is")
    _strategy("tp_layer(layer, tp=4, h100)", L.tp_layer(ly, 4, hw),
              2 * t(act, 1.5), fwd / 4 / flops,
              {"counted one all-reduce of the activations; the forward pass has two, after "
               "attention and after the MLP": t(act, 1.5),
               "all-reduced the layer's weights, not its activations": 2 * t(params, 1.5),
               "counted half the activations' bytes: every token of the micro-batch (batch x "
               "seq) times hidden, at the layer's bytes per element": 2 * t(act / 2, 1.5),
               "counted four all-reduces, as forward and backward together do; the prediction "
               "is the forward pass's": 4 * t(act, 1.5)},
              {"left the layer's compute whole: each of the tp ranks computes a tp-th of it":
                   fwd / flops,
               "counted forward and backward; the prediction is the forward pass's":
                   3 * fwd / 4 / flops},
              "what the TP forward pass all-reduces (lesson 7's table), its bytes, how often",
              "one rank's share of the layer's forward FLOPs")
    _strategy("dp_layer(layer, dp=8, h100)", L.dp_layer(ly, 8, hw),
              t(params, 1.75), 2 * fwd / flops,
              {"all-reduced the activations, not the gradients": t(act, 1.75),
               "counted the gradients' elements, not their bytes": t(params / 2, 1.75)},
              {"used the forward pass's compute: the backward pass costs twice the forward":
                   fwd / flops,
               "used forward + backward: the gradients of a layer hide behind the backward "
               "pass": 3 * fwd / flops},
              "every weight's gradient, in bytes, all-reduced once",
              "the backward pass's FLOPs")
    _strategy("zero3_layer(layer, dp=8, h100)", L.zero3_layer(ly, 8, hw),
              3 * t(params, 0.875), 3 * fwd / flops,
              {"counted one all-gather of the weights; ZeRO-3 gathers them before the forward "
               "and again before the backward": 2 * t(params, 0.875),
               "all-reduced the gradients; ZeRO-3 reduce-scatters them":
                   2 * t(params, 0.875) + t(params, 1.75),
               "counted one rank's shard as the size; nccl-tests' size is the full buffer":
                   3 * t(params / 8, 0.875)},
              {"used the forward pass's compute alone: ZeRO-3's collectives hide behind forward "
               "and backward": fwd / flops,
               "used the backward pass's compute alone": 2 * fwd / flops},
              "the collectives of the layer's weights and gradients in both passes (lesson 7's "
              "table)", "forward plus backward")
    _strategy("pp_stage(layer, layers_per_stage=4, h100)", L.pp_stage(ly, 4, hw),
              t(act, 1.0), 4 * fwd / flops,
              {"counted half the activations' bytes: every token of the micro-batch (batch x "
               "seq) times hidden, at the layer's bytes per element": t(act / 2, 1.0),
               "sent the stage's weights, not the activations": t(params, 1.0)},
              {"counted one layer, not the stage's layers": fwd / flops},
              "one send of the micro-batch's activations between two ranks",
              "the forward FLOPs of every layer of the stage")
    pp, tp = L.pp_stage(ly, 4, hw), L.tp_layer(ly, 4, hw)
    assert pp.hides and tp.ratio == pytest.approx(tp.comm_s / tp.compute_s)


def measured_on_link(trace_dir):
    """On each rank: several TP-like steps, traced on the simulated link, then this rank's
    matmul rate measured the same way the steps ran: all ranks at once, sharing the cores (the
    link's calibration is one rank's rate with the others idle: 3 ranks on 2 cores compute at
    a fraction of it, which is the machine, not the prediction, being off)."""
    import torch.distributed as dist

    from workbook import link as link_module
    from workbook.communication.overlap_math_report import measure_tp_like_step
    from workbook.trace.capture import rank_trace
    with rank_trace(trace_dir, lab="overlap_math"):
        steps = [measure_tp_like_step() for _ in range(5)]
    dist.barrier()
    rate = link_module.measure_local_flops(seconds=0.2)
    return [dict(s, shared_rate=rate) for s in steps]


def _measure(trace_dir) -> dict:
    """One traced run on 3 simulated-link ranks, with each rank's problem (None when right):
    the link spans are the model's, so a wrong prediction is structural; the compute time is
    measured, so a miss there is noise worth measuring again."""
    from workbook import link as link_module
    from workbook.grading.stubs import raise_if_stub
    L = lab()
    raise_if_stub(L.simulated_hardware)      # the first of the learner's called below: a stub fails now
    n, = world_sizes(3)
    res = on_ranks(n, measured_on_link, str(trace_dir), link="dgx-h100", timeout=120,
                   key=("measured", str(trace_dir)))
    meta = json.loads((trace_dir / "run.json").read_text())["link"]
    sim = link_module.make_link("dgx-h100", meta["local_gflops"] * 1e9)
    hw = L.simulated_hardware(sim)
    out = {"structure": None, "timing": None}
    for rank in range(n):
        events = json.loads((trace_dir / f"rank{rank}.trace.json").read_text())["traceEvents"]
        spans = [e for e in events if e.get("cat") == "link" and e["name"] == "all_reduce"]
        if len(spans) != 5:
            out["structure"] = f"rank {rank}: expected 5 all-reduce spans on the link, got {len(spans)}"
            return out
        for s in spans:
            predicted = L.collective_time("all_reduce", s["args"]["bytes"], n, hw) * 1e6
            if not s["dur"] == pytest.approx(predicted, rel=0.02):
                out["structure"] = (f"rank {rank}: all_reduce of {s['args']['bytes']} B lasted "
                                    f"{s['dur']:.0f} us on the link, collective_time predicts "
                                    f"{predicted:.0f} us")
                return out
        measured = sorted(r["compute_s"] for r in res[rank])[2]
        rate, flops = res[rank][0]["shared_rate"], res[rank][0]["flops"]
        shared = L.simulated_hardware(link_module.make_link("dgx-h100", rate))
        predicted = L.compute_time(flops, shared)
        if not (math.isfinite(predicted) and predicted == pytest.approx(flops / rate, rel=0.02)):
            out["structure"] = (f"rank {rank}: compute_time({flops:.3g} FLOPs) on hardware of "
                                f"{rate / 1e9:.0f} GFLOP/s gives {predicted * 1e3:.3g} ms; at that "
                                f"rate the FLOPs take {flops / rate * 1e3:.3g} ms")
            return out
        if not predicted / MEASURED_FACTOR < measured < predicted * MEASURED_FACTOR:
            out["timing"] = (f"rank {rank}: compute predicted {predicted * 1e3:.2f} ms (at the "
                             f"{rate / 1e9:.0f} GFLOP/s this rank measured while every rank "
                             f"computed), measured {measured * 1e3:.2f} ms (median of 5 steps); "
                             f"they should agree within a factor of {MEASURED_FACTOR:g}")
    return out


#: How far the measured compute time may stray from the prediction: the prediction itself is
#: checked exactly above (flops / rate); this only catches a rate of the wrong unit. A factor 3
#: failed the reference at load 15 on 2 cores (predicted 5.35 ms, measured 18.5 ms: the rate,
#: measured a moment after the steps, had changed that much; tests/bench/load_stability.py).
MEASURED_FACTOR = 10.0


@pytest.mark.points(3)
@pytest.mark.tasks("collective_time")
def test_predictions_match_the_measured_trace(tmp_path):
    """On 3 ranks (where the bus factor is not 1), every collective the trace shows on the link
    lasts what collective_time predicts (±2%); compute_time at the rate the rank measured while
    all ranks computed is that rate's time for the FLOPs (±2%), and within a factor of
    ``MEASURED_FACTOR`` of the measured median (measured again after a miss:
    ``workbook.grading.timing``)."""
    def run(k):
        (tmp_path / str(k)).mkdir()
        return _measure(tmp_path / str(k))

    out = measure_until_clear(run, lambda o: STRUCTURAL if o["structure"] else
                              (1.0 if o["timing"] else 0.0))
    if out["structure"] or out["timing"]:
        raise AssertionError(out["structure"] or out["timing"])
