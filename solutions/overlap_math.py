"""Lab `overlap_math`: predict, before running anything, whether communication can hide.

Lesson 7 derives the arithmetic for one transformer layer. Compute: a linear layer y = x W^T on
``tokens`` rows costs 2 * tokens * d_in * d_out FLOPs forward, backward twice that; causal attention
adds 2 * 2 * batch * seq^2 * hidden; time = FLOPs / FLOP/s. Communication: the alpha-beta model
with nccl-tests' bus factors (``workbook/link.py``), t = latency + bytes * bus_factor / bandwidth.
A ratio comm / compute below 1 means the communication *can* hide (if the schedule lets it); above
1 no schedule can. The grader checks your numbers and then measures one step on the simulated link.

Run it: ``workbook run overlap_math`` or ``torchrun --nproc_per_node=2 labs/overlap_math.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

from workbook import link as link_model


@dataclass(frozen=True)
class Hardware:
    """What the predictions need to know about a machine."""
    name: str
    flops: float             # FLOP/s of one device
    bandwidth_Bps: float     # bus bandwidth, bytes/s
    latency_s: float         # per-collective latency, seconds


@dataclass(frozen=True)
class Layer:
    """One transformer layer's shape. ``style`` "gpt" (GELU MLP) or "llama" (SwiGLU MLP)."""
    hidden: int
    ffn_hidden: int
    batch: int
    seq: int
    style: str = "gpt"
    bytes_per_element: int = 2


@dataclass(frozen=True)
class Prediction:
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
    """Forward FLOPs of y = x W^T for x [tokens, d_in], W [d_out, d_in]."""
    ### BEGIN SOLUTION hint: count the weights, then what each token does with each of them
    return 2.0 * tokens * d_in * d_out
    ### END SOLUTION


def layer_params(layer: Layer) -> int:
    """Weights of one layer (matrices only): attention 4h^2; MLP 2hf (gpt) or 3hf (llama)."""
    ### BEGIN SOLUTION hint: list the matrices and their shapes; layer.style picks the MLP
    h, f = layer.hidden, layer.ffn_hidden
    return 4 * h * h + (3 if layer.style == "llama" else 2) * h * f
    ### END SOLUTION


def layer_forward_flops(layer: Layer) -> float:
    """Forward FLOPs of one layer: every linear layer, plus attention's QK^T and AV."""
    ### BEGIN SOLUTION hint: each weight matrix is a linear layer over all b*s tokens; then add QK^T and AV
    tokens = layer.batch * layer.seq
    linears = 2.0 * tokens * layer_params(layer)
    attention = 2 * 2.0 * layer.batch * layer.seq ** 2 * layer.hidden
    return linears + attention
    ### END SOLUTION


def compute_time(flops: float, hw: Hardware) -> float:
    return flops / hw.flops


# ----------------------------------------------------------------------------- communication
def collective_time(op: str, size_bytes: float, n: int, hw: Hardware) -> float:
    """Alpha-beta time of one collective on ``n`` ranks (nccl-tests size and bus factor)."""
    ### BEGIN SOLUTION hint: the alpha-beta model above, with link_model.bus_factor; and a rank alone?
    if n <= 1 and op not in ("send", "recv"):
        return 0.0
    return hw.latency_s + size_bytes * link_model.bus_factor(op, n) / hw.bandwidth_Bps
    ### END SOLUTION


# ----------------------------------------------------------------------------- per parallelism
def tp_layer(layer: Layer, tp: int, hw: Hardware) -> Prediction:
    """Forward pass of one Megatron TP layer: 2 all-reduces of b*s*h vs the layer's compute / tp."""
    ### BEGIN SOLUTION hint: size the activations from the layer; each rank computes a tp-th of it
    activations = layer.batch * layer.seq * layer.hidden * layer.bytes_per_element
    comm = 2 * collective_time("all_reduce", activations, tp, hw)
    return Prediction(comm, compute_time(layer_forward_flops(layer) / tp, hw))
    ### END SOLUTION


def dp_layer(layer: Layer, dp: int, hw: Hardware) -> Prediction:
    """Backward pass of one layer under DP: its gradient all-reduce vs its backward compute."""
    ### BEGIN SOLUTION hint: every weight's gradient is all-reduced; backward costs twice forward
    grads = layer_params(layer) * layer.bytes_per_element
    comm = collective_time("all_reduce", grads, dp, hw)
    return Prediction(comm, compute_time(2 * layer_forward_flops(layer), hw))
    ### END SOLUTION


def zero3_layer(layer: Layer, dp: int, hw: Hardware) -> Prediction:
    """Forward + backward of one ZeRO-3 layer: all-gather, all-gather, reduce-scatter of params."""
    ### BEGIN SOLUTION hint: three collectives of the parameters' bytes vs forward + backward
    params = layer_params(layer) * layer.bytes_per_element
    comm = 2 * collective_time("all_gather", params, dp, hw) + \
        collective_time("reduce_scatter", params, dp, hw)
    return Prediction(comm, compute_time(3 * layer_forward_flops(layer), hw))
    ### END SOLUTION


def pp_stage(layer: Layer, layers_per_stage: int, hw: Hardware) -> Prediction:
    """Forward of one micro-batch: the activation send vs the next stage's compute."""
    ### BEGIN SOLUTION hint: one send of the activations vs the next stage's layers
    activations = layer.batch * layer.seq * layer.hidden * layer.bytes_per_element
    comm = collective_time("send", activations, 2, hw)
    return Prediction(comm, compute_time(layers_per_stage * layer_forward_flops(layer), hw))
    ### END SOLUTION


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
