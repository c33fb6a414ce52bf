# Generated from solutions/overlap_math.py by `workbook assign`: this is your file to edit.
# Replace each `raise NotImplementedError` with your code, then grade it with
#     workbook grade --lab overlap_math
#
# Your tasks (10 pts in all):
#   1. linear_flops (1 pt): Forward FLOPs of y = x W^T for x [tokens, d_in], W [d_out, d_in].
#   2. layer_params (1 pt): Weights of one layer (matrices only): attention 4h^2; MLP 2hf (gpt) or
#      3hf (llama).
#   3. layer_forward_flops (1 pt): Forward FLOPs of one layer: every linear layer, plus attention's
#      QK^T and AV.
#   4. collective_time (5 pts): Alpha-beta time of one collective on `n` ranks (nccl-tests size and
#      bus factor).
#   5. tp_layer (0.5 pts): Forward pass of one Megatron TP layer: 2 all-reduces of b*s*h vs the
#      layer's compute / tp.
#   6. dp_layer (0.5 pts): Backward pass of one layer under DP: its gradient all-reduce vs its
#      backward compute.
#   7. zero3_layer (0.5 pts): Forward + backward of one ZeRO-3 layer: all-gather, all-gather,
#      reduce-scatter of params.
#   8. pp_stage (0.5 pts): Forward of one micro-batch: the activation send vs the next stage's
#      compute.
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
    # TODO: count the weights, then what each token does with each of them
    raise NotImplementedError("not implemented yet: overlap_math.linear_flops")


def layer_params(layer: Layer) -> int:
    """Weights of one layer (matrices only): attention 4h^2; MLP 2hf (gpt) or 3hf (llama)."""
    # TODO: list the matrices and their shapes; layer.style picks the MLP
    raise NotImplementedError("not implemented yet: overlap_math.layer_params")


def layer_forward_flops(layer: Layer) -> float:
    """Forward FLOPs of one layer: every linear layer, plus attention's QK^T and AV."""
    # TODO: each weight matrix is a linear layer over all b*s tokens; then add QK^T and AV
    raise NotImplementedError("not implemented yet: overlap_math.layer_forward_flops")


def compute_time(flops: float, hw: Hardware) -> float:
    return flops / hw.flops


# ----------------------------------------------------------------------------- communication
def collective_time(op: str, size_bytes: float, n: int, hw: Hardware) -> float:
    """Alpha-beta time of one collective on ``n`` ranks (nccl-tests size and bus factor)."""
    # TODO: the alpha-beta model above, with link_model.bus_factor; and a rank alone?
    raise NotImplementedError("not implemented yet: overlap_math.collective_time")


# ----------------------------------------------------------------------------- per parallelism
def tp_layer(layer: Layer, tp: int, hw: Hardware) -> Prediction:
    """Forward pass of one Megatron TP layer: 2 all-reduces of b*s*h vs the layer's compute / tp."""
    # TODO: size the activations from the layer; each rank computes a tp-th of it
    raise NotImplementedError("not implemented yet: overlap_math.tp_layer")


def dp_layer(layer: Layer, dp: int, hw: Hardware) -> Prediction:
    """Backward pass of one layer under DP: its gradient all-reduce vs its backward compute."""
    # TODO: every weight's gradient is all-reduced; backward costs twice forward
    raise NotImplementedError("not implemented yet: overlap_math.dp_layer")


def zero3_layer(layer: Layer, dp: int, hw: Hardware) -> Prediction:
    """Forward + backward of one ZeRO-3 layer: all-gather, all-gather, reduce-scatter of params."""
    # TODO: three collectives of the parameters' bytes vs forward + backward
    raise NotImplementedError("not implemented yet: overlap_math.zero3_layer")


def pp_stage(layer: Layer, layers_per_stage: int, hw: Hardware) -> Prediction:
    """Forward of one micro-batch: the activation send vs the next stage's compute."""
    # TODO: one send of the activations vs the next stage's layers
    raise NotImplementedError("not implemented yet: overlap_math.pp_stage")


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
