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
### BEGIN CHALLENGE: the cost model of one layer, from FLOPs to the four strategies' predictions
def linear_flops(tokens: int, d_in: int, d_out: int) -> float:
    """The FLOPs of one linear layer's forward pass over a number of tokens: input rows of
    width d_in mapped to width d_out (a weight of d_out x d_in, no bias).

    Count FLOPs as the hardware's FLOP rates count them (lesson 7, "Compute: FLOPs of one
    layer"). Returns a number (int or float)."""
    ### BEGIN SOLUTION
    ### hint 1: one multiply and one add per weight per token; lesson 7, "Compute: FLOPs of one
    ###     layer".
    ### hint 2: count the weights of the matrix, then what every token does with each of them.
    ### hint 3: d_in x d_out weights, each used by every token for one multiply and one add:
    ###     2 FLOPs per weight per token.
    return 2.0 * tokens * d_in * d_out
    ### END SOLUTION


def layer_params(layer: Layer) -> int:
    """The number of weights in one transformer layer's matrices (biases and norms left out),
    for either MLP style of ``Layer``.

    Attention has its query, key, value and output projections of the hidden size; the MLP has
    the matrices of its style, of the hidden and the MLP's inner size: a GELU MLP for "gpt", a
    SwiGLU MLP for "llama" (lesson 7, "Compute: FLOPs of one layer"). Returns an
    int."""
    ### BEGIN SOLUTION
    ### hint 1: list the layer's matrices and their shapes; lesson 7, "Compute: FLOPs of one
    ###     layer", counts them for both MLP styles.
    ### hint 2: four square projections of the hidden size for attention; an up and a down
    ###     projection for a GELU MLP, plus a gate of the same shape for SwiGLU.
    ### hint 3: list the matrices and their shapes; layer.style picks the MLP (2 or 3 matrices of
    ###     h x f).
    h, f = layer.hidden, layer.ffn_hidden
    return 4 * h * h + (3 if layer.style == "llama" else 2) * h * f
    ### END SOLUTION


def layer_forward_flops(layer: Layer) -> float:
    """The FLOPs of one layer's forward pass over its whole micro-batch: every weight matrix
    applied to every token, and the two products of attention that use no weight (the scores,
    and the scores applied to the values), causal mask ignored.

    Lesson 7, "Compute: FLOPs of one layer", derives it. Returns a float."""
    ### BEGIN SOLUTION
    ### hint 1: the linear layers cost 2 FLOPs per weight per token; attention adds two
    ###     sequence-by-sequence products; lesson 7, "Compute: FLOPs of one layer".
    ### hint 2: the tokens are batch times sequence; the linear part is the weights' cost over all
    ###     of them; each attention product is, per sequence, seq x seq dot products of length
    ###     hidden, counted at 2 FLOPs per multiply-add.
    ### hint 3: each weight matrix is a linear layer over all b*s tokens (2 * tokens * params);
    ###     then add QK^T and AV, 2 * b * s^2 * h each.
    tokens = layer.batch * layer.seq
    linears = 2.0 * tokens * layer_params(layer)
    attention = 2 * 2.0 * layer.batch * layer.seq ** 2 * layer.hidden
    return linears + attention
    ### END SOLUTION


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
    ### BEGIN SOLUTION
    ### hint 1: the alpha-beta model of lesson 7, "Communication: bytes over bandwidth": a fixed
    ###     cost per operation plus the bytes the busiest link carries over its bandwidth.
    ### hint 2: the latency, plus the size scaled by the collective's bus factor (the link module
    ###     has a function for it), over the bus bandwidth; first, the case of a rank alone.
    ### hint 3: the alpha-beta model, with link_model.bus_factor; and a rank alone (n <= 1, not
    ###     a send)?
    if n <= 1 and op not in ("send", "recv"):
        return 0.0
    return hw.latency_s + size_bytes * link_model.bus_factor(op, n) / hw.bandwidth_Bps
    ### END SOLUTION


# ----------------------------------------------------------------------------- per parallelism
def tp_layer(layer: Layer, tp: int, hw: Hardware) -> Prediction:
    """The forward pass of one Megatron tensor-parallel layer on ``tp`` ranks: its
    communication time beside one rank's share of the layer's compute.

    Communication: the collectives Megatron's TP layer issues in its forward pass, on the
    layer's activations (lesson 7's strategy table; lesson 4 for why). Compute: one rank's part
    of the layer's forward pass. Both in seconds on ``hw``."""
    ### BEGIN SOLUTION
    ### hint 1: the TP row of lesson 7's table, "Communication: bytes over bandwidth": what
    ###     travels, how often, and what it hides behind.
    ### hint 2: the activations are one value per token per hidden unit, at the layer's bytes per
    ###     element; two all-reduces of them per forward pass; each rank computes a tp-th of the
    ###     layer's forward FLOPs.
    ### hint 3: size the activations from the layer (b * s * h * bytes); 2 * collective_time of
    ###     an all-reduce; each rank computes a tp-th of it.
    activations = layer.batch * layer.seq * layer.hidden * layer.bytes_per_element
    comm = 2 * collective_time("all_reduce", activations, tp, hw)
    return Prediction(comm, compute_time(layer_forward_flops(layer) / tp, hw))
    ### END SOLUTION


def dp_layer(layer: Layer, dp: int, hw: Hardware) -> Prediction:
    """One layer's backward pass under data parallelism on ``dp`` ranks: the communication of
    its gradients beside the backward compute it can hide behind.

    Lesson 7's strategy table says what travels and what hides it; gradients have the weights'
    element size. Both in seconds on ``hw``."""
    ### BEGIN SOLUTION
    ### hint 1: the DP row of lesson 7's table, "Communication: bytes over bandwidth"; the
    ###     backward pass's cost is in "Compute: FLOPs of one layer".
    ### hint 2: every weight has one gradient, all-reduced once; the backward pass costs twice
    ###     the forward.
    ### hint 3: every weight's gradient is all-reduced (params * bytes); backward costs twice
    ###     forward.
    grads = layer_params(layer) * layer.bytes_per_element
    comm = collective_time("all_reduce", grads, dp, hw)
    return Prediction(comm, compute_time(2 * layer_forward_flops(layer), hw))
    ### END SOLUTION


def zero3_layer(layer: Layer, dp: int, hw: Hardware) -> Prediction:
    """One layer's forward and backward passes under ZeRO-3 on ``dp`` ranks: every collective
    of its parameters and gradients beside the compute of both passes.

    Lesson 7's strategy table lists what ZeRO-3 moves per layer (lesson 9 builds it). Both in
    seconds on ``hw``."""
    ### BEGIN SOLUTION
    ### hint 1: the ZeRO-3 row of lesson 7's table, "Communication: bytes over bandwidth".
    ### hint 2: the weights are gathered before the forward and again before the backward, and
    ###     the gradients are reduce-scattered; each collective is of the whole layer's weights'
    ###     bytes; compute is forward plus backward.
    ### hint 3: three collectives of the parameters' bytes (2 all_gather + 1 reduce_scatter) vs
    ###     forward + backward (3x forward).
    params = layer_params(layer) * layer.bytes_per_element
    comm = 2 * collective_time("all_gather", params, dp, hw) + \
        collective_time("reduce_scatter", params, dp, hw)
    return Prediction(comm, compute_time(3 * layer_forward_flops(layer), hw))
    ### END SOLUTION


def pp_stage(layer: Layer, layers_per_stage: int, hw: Hardware) -> Prediction:
    """One micro-batch's forward pass through a pipeline stage of ``layers_per_stage`` layers:
    what the stage sends to the next one, beside the stage's compute.

    Lesson 7's strategy table says what travels between stages (lesson 10 builds the
    pipeline). Both in seconds on ``hw``."""
    ### BEGIN SOLUTION
    ### hint 1: the PP row of lesson 7's table, "Communication: bytes over bandwidth".
    ### hint 2: one point-to-point send of the micro-batch's activations between two ranks; the
    ###     stage computes the forward pass of each of its layers.
    ### hint 3: one send of the activations (b * s * h * bytes, 2 ranks) vs the stage's layers'
    ###     forward FLOPs.
    activations = layer.batch * layer.seq * layer.hidden * layer.bytes_per_element
    comm = collective_time("send", activations, 2, hw)
    return Prediction(comm, compute_time(layers_per_stage * layer_forward_flops(layer), hw))
    ### END SOLUTION
### END CHALLENGE


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
