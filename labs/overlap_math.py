# Generated from solutions/overlap_math.py by `workbook assign` (level: standard): this is your file to edit.
# Replace each `raise NotImplementedError` with your code; check it with `workbook run overlap_math`
# (or `workbook watch overlap_math`). Stuck on task N? `workbook hint overlap_math N`, one hint at a time.
#
# Your tasks (10 pts in all):
#   1. linear_flops (1 pt): The FLOPs of one linear layer's forward pass over a number of tokens:
#      input rows of width d_in mapped to width d_out (a weight of d_out x d_in, no bias).
#   2. layer_params (1 pt): The number of weights in one transformer layer's matrices (biases and
#      norms left out), for either MLP style of `Layer`.
#   3. layer_forward_flops (1 pt): The FLOPs of one layer's forward pass over its whole
#      micro-batch: every weight matrix applied to every token, and the two products of attention
#      that use no weight (the scores, and the scores applied to the values), causal mask ignored.
#   4. collective_time (5 pts): Seconds one collective `op` takes on `n` ranks of `hw`, under the
#      alpha-beta model that the simulated link charges.
#   5. tp_layer (0.5 pts): The forward pass of one Megatron tensor-parallel layer on `tp` ranks:
#      its communication time beside one rank's share of the layer's compute.
#   6. dp_layer (0.5 pts): One layer's backward pass under data parallelism on `dp` ranks: the
#      communication of its gradients beside the backward compute it can hide behind.
#   7. zero3_layer (0.5 pts): One layer's forward and backward passes under ZeRO-3 on `dp` ranks:
#      every collective of its parameters and gradients beside the compute of both passes.
#   8. pp_stage (0.5 pts): One micro-batch's forward pass through a pipeline stage of
#      `layers_per_stage` layers: what the stage sends to the next one, beside the stage's compute.
"""Lab `overlap_math`: predict, before running anything, whether communication can hide.

You write the cost model of lesson 7 for one transformer layer: what it computes and how long
that takes, how long one collective takes on a given machine, and, for data parallelism,
ZeRO-3, tensor parallelism and pipeline parallelism, the layer's communication time beside the
compute it could hide behind (a ``Prediction``: below a ratio of 1 the communication *can*
hide, if the schedule lets it; above 1 no schedule can). Lesson 7 derives every term; the
notebook draws its figures with your functions once they are written.

The grader checks your numbers against hand-computed values, then runs TP-like steps on the
simulated link and compares every all-reduce in the trace with what your ``collective_time``
predicts. Run it: ``workbook run overlap_math`` or ``torchrun --nproc_per_node=2
labs/overlap_math.py``; grade it with ``workbook grade --lab overlap_math``.
"""
from __future__ import annotations

from dataclasses import dataclass

from workbook import link as link_model


@dataclass(frozen=True)
class Hardware:
    """What the predictions need to know about a machine: one device's FLOP rate, the bus
    bandwidth of its link and the latency of one collective (the alpha-beta model's figures)."""
    name: str
    flops: float             # FLOP/s of one device
    bandwidth_Bps: float     # bus bandwidth, bytes/s
    latency_s: float         # per-collective latency, seconds


@dataclass(frozen=True)
class Layer:
    """One transformer layer's shape: hidden size, the MLP's inner size, the micro-batch
    (``batch`` sequences of ``seq`` tokens), the MLP ``style`` ("gpt": GELU, "llama": SwiGLU)
    and the bytes of one element of the weights and activations (2: bf16)."""
    hidden: int
    ffn_hidden: int
    batch: int
    seq: int
    style: str = "gpt"
    bytes_per_element: int = 2


@dataclass(frozen=True)
class Prediction:
    """One strategy's prediction for a layer: communication seconds beside the compute seconds
    it could hide behind."""
    comm_s: float
    compute_s: float

    @property
    def ratio(self) -> float:
        return self.comm_s / self.compute_s

    @property
    def hides(self) -> bool:
        return self.ratio < 1.0


def hardware(preset: str) -> Hardware:
    """The real hardware behind a link preset (not the CPU-calibrated simulation)."""
    p = link_model.PRESETS[preset]
    return Hardware(preset, p.peak_tflops * 1e12, p.bandwidth_GBps * 1e9, p.latency_us * 1e-6)


def simulated_hardware(sim: link_model.Link) -> Hardware:
    """A calibrated CPU link as Hardware: the machine a simulated run actually is."""
    return Hardware(f"simulated {sim.preset}", sim.local_flops, sim.bandwidth_Bps, sim.latency_s)


# ----------------------------------------------------------------------------- compute
def linear_flops(tokens: int, d_in: int, d_out: int) -> float:
    """The FLOPs of one linear layer's forward pass over a number of tokens: input rows of
    width d_in mapped to width d_out (a weight of d_out x d_in, no bias).

    Count FLOPs as the hardware's FLOP rates count them (lesson 7, "Compute: FLOPs of one
    layer"). Returns a number (int or float)."""
    raise NotImplementedError("not implemented yet: overlap_math.linear_flops")


def layer_params(layer: Layer) -> int:
    """The number of weights in one transformer layer's matrices (biases and norms left out),
    for either MLP style of ``Layer``.

    Attention has its query, key, value and output projections of the hidden size; the MLP has
    the matrices of its style, of the hidden and the MLP's inner size: a GELU MLP for "gpt", a
    SwiGLU MLP for "llama" (lesson 7, "Compute: FLOPs of one layer"). Returns an
    int."""
    raise NotImplementedError("not implemented yet: overlap_math.layer_params")


def layer_forward_flops(layer: Layer) -> float:
    """The FLOPs of one layer's forward pass over its whole micro-batch: every weight matrix
    applied to every token, and the two products of attention that use no weight (the scores,
    and the scores applied to the values), causal mask ignored.

    Lesson 7, "Compute: FLOPs of one layer", derives it. Returns a float."""
    raise NotImplementedError("not implemented yet: overlap_math.layer_forward_flops")


def compute_time(flops: float, hw: Hardware) -> float:
    """Seconds that ``flops`` FLOPs take on ``hw`` at its FLOP rate (a best case: the peak)."""
    return flops / hw.flops


# ----------------------------------------------------------------------------- communication
def collective_time(op: str, size_bytes: float, n: int, hw: Hardware) -> float:
    """Seconds one collective ``op`` takes on ``n`` ranks of ``hw``, under the alpha-beta model
    that the simulated link charges.

    ``op`` is a collective's name as the link names it ("all_reduce", "all_gather",
    "reduce_scatter", "send", ...); ``size_bytes`` is nccl-tests' size, the full buffer (for an
    all-gather the gathered result, not one rank's piece). A collective among one rank moves
    nothing and costs 0 s; a send always crosses the link. ``workbook.link`` has each
    collective's bus factor; lesson 7, "Communication: bytes over bandwidth", the model. The
    grader compares your times with the durations the simulated link charges in a trace."""
    raise NotImplementedError("not implemented yet: overlap_math.collective_time")


# ----------------------------------------------------------------------------- per parallelism
def tp_layer(layer: Layer, tp: int, hw: Hardware) -> Prediction:
    """The forward pass of one Megatron tensor-parallel layer on ``tp`` ranks: its
    communication time beside one rank's share of the layer's compute.

    Communication: the collectives Megatron's TP layer issues in its forward pass, on the
    layer's activations (lesson 7's strategy table; lesson 4 for why). Compute: one rank's part
    of the layer's forward pass. Both in seconds on ``hw``."""
    raise NotImplementedError("not implemented yet: overlap_math.tp_layer")


def dp_layer(layer: Layer, dp: int, hw: Hardware) -> Prediction:
    """One layer's backward pass under data parallelism on ``dp`` ranks: the communication of
    its gradients beside the backward compute it can hide behind.

    Lesson 7's strategy table says what travels and what hides it; gradients have the weights'
    element size. Both in seconds on ``hw``."""
    raise NotImplementedError("not implemented yet: overlap_math.dp_layer")


def zero3_layer(layer: Layer, dp: int, hw: Hardware) -> Prediction:
    """One layer's forward and backward passes under ZeRO-3 on ``dp`` ranks: every collective
    of its parameters and gradients beside the compute of both passes.

    Lesson 7's strategy table lists what ZeRO-3 moves per layer (lesson 9 builds it). Both in
    seconds on ``hw``."""
    raise NotImplementedError("not implemented yet: overlap_math.zero3_layer")


def pp_stage(layer: Layer, layers_per_stage: int, hw: Hardware) -> Prediction:
    """One micro-batch's forward pass through a pipeline stage of ``layers_per_stage`` layers:
    what the stage sends to the next one, beside the stage's compute.

    Lesson 7's strategy table says what travels between stages (lesson 10 builds the
    pipeline). Both in seconds on ``hw``."""
    raise NotImplementedError("not implemented yet: overlap_math.pp_stage")


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
