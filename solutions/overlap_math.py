"""Lab `overlap_math`: predict, before running anything, whether communication can hide.

Overlap only helps if there is enough independent compute to hide behind. This lab turns that
into arithmetic you can do on paper for one transformer layer and each kind of parallelism, then
checks the arithmetic against traces measured on the simulated link.

Compute. A linear layer y = x W^T with x of shape [tokens, d_in] and W of shape [d_out, d_in]
costs 2 * tokens * d_in * d_out FLOPs forward (one multiply and one add per weight per token);
the backward pass costs twice that (gradient for the input and for the weight). Causal attention
adds the scores QK^T and the weighted sum AV: 2 * 2 * batch * seq^2 * hidden FLOPs forward.
Time is FLOPs / (FLOP/s of the device).

Communication. The alpha-beta model with nccl-tests' bus factors (see workbook/link.py):
t = latency + size_bytes * bus_factor / bandwidth, where the bus factor is 2(n-1)/n for an
all-reduce, (n-1)/n for all-gather and reduce-scatter (size = the full, gathered buffer), 1 for
a point-to-point send.

Per layer (h hidden, f ffn hidden, b batch, s sequence, e bytes per element):
* DP: after the backward pass every gradient is all-reduced: size = params * e;
* ZeRO-3: forward all-gathers the layer's parameters, backward all-gathers them again and
  reduce-scatters the gradients: 3 collectives of params * e;
* TP (Megatron): 2 all-reduces of b*s*h*e forward (after attention and after the MLP), 2 backward;
  compute per rank is the layer's compute / tp;
* PP: one send of the activations b*s*h*e per micro-batch to the next stage, hidden behind the
  compute of the next micro-batch on that stage.

A ratio comm / compute below 1 means the communication *can* hide (if the schedule lets it);
above 1, no schedule can: the step takes at least the communication time.

Run it: ``workbook run overlap_math`` (the grader's checks, then a table of your predictions),
``python labs/overlap_math.py`` or ``torchrun --nproc_per_node=2 labs/overlap_math.py``.
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
    ### BEGIN SOLUTION hint: one multiply and one add per weight per token
    return 2.0 * tokens * d_in * d_out
    ### END SOLUTION


def layer_params(layer: Layer) -> int:
    """Weights of one layer (matrices only): attention 4h^2; MLP 2hf (gpt) or 3hf (llama)."""
    ### BEGIN SOLUTION hint: q, k, v, o are h x h; the MLP has 2 (gpt) or 3 (llama) h x f matrices
    h, f = layer.hidden, layer.ffn_hidden
    return 4 * h * h + (3 if layer.style == "llama" else 2) * h * f
    ### END SOLUTION


def layer_forward_flops(layer: Layer) -> float:
    """Forward FLOPs of one layer: every linear layer, plus attention's QK^T and AV."""
    ### BEGIN SOLUTION hint: linear_flops for every weight, plus 2 * 2 * b * s^2 * h for attention
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
    ### BEGIN SOLUTION hint: latency + size * bus_factor / bandwidth; nothing to do alone
    if n <= 1 and op not in ("send", "recv"):
        return 0.0
    return hw.latency_s + size_bytes * link_model.bus_factor(op, n) / hw.bandwidth_Bps
    ### END SOLUTION


# ----------------------------------------------------------------------------- per parallelism
def tp_layer(layer: Layer, tp: int, hw: Hardware) -> Prediction:
    """Forward pass of one Megatron TP layer: 2 all-reduces of b*s*h vs the layer's compute / tp."""
    ### BEGIN SOLUTION
    activations = layer.batch * layer.seq * layer.hidden * layer.bytes_per_element
    comm = 2 * collective_time("all_reduce", activations, tp, hw)
    return Prediction(comm, compute_time(layer_forward_flops(layer) / tp, hw))
    ### END SOLUTION


def dp_layer(layer: Layer, dp: int, hw: Hardware) -> Prediction:
    """Backward pass of one layer under DP: its gradient all-reduce vs its backward compute."""
    ### BEGIN SOLUTION
    grads = layer_params(layer) * layer.bytes_per_element
    comm = collective_time("all_reduce", grads, dp, hw)
    return Prediction(comm, compute_time(2 * layer_forward_flops(layer), hw))
    ### END SOLUTION


def zero3_layer(layer: Layer, dp: int, hw: Hardware) -> Prediction:
    """Forward + backward of one ZeRO-3 layer: all-gather, all-gather, reduce-scatter of params."""
    ### BEGIN SOLUTION
    params = layer_params(layer) * layer.bytes_per_element
    comm = 2 * collective_time("all_gather", params, dp, hw) + \
        collective_time("reduce_scatter", params, dp, hw)
    return Prediction(comm, compute_time(3 * layer_forward_flops(layer), hw))
    ### END SOLUTION


def pp_stage(layer: Layer, layers_per_stage: int, hw: Hardware) -> Prediction:
    """Forward of one micro-batch: the activation send vs the next stage's compute."""
    ### BEGIN SOLUTION
    activations = layer.batch * layer.seq * layer.hidden * layer.bytes_per_element
    comm = collective_time("send", activations, 2, hw)
    return Prediction(comm, compute_time(layers_per_stage * layer_forward_flops(layer), hw))
    ### END SOLUTION


# ----------------------------------------------------------------------------- a measured step
def measure_tp_like_step(hidden: int = 256, tokens: int = 512):
    """On a rank: one forward of a column->row MLP pair with its all-reduce, on the current link.

    Returns what the link charged and what the matmuls took, for comparison with predictions."""
    import time

    import torch
    import torch.distributed as dist
    from workbook import link
    n = dist.get_world_size()
    x = torch.randn(tokens, hidden)
    w1 = torch.randn(4 * hidden // n, hidden) / hidden ** 0.5
    w2 = torch.randn(hidden, 4 * hidden // n) / hidden ** 0.5
    t0 = time.perf_counter()
    y = (x @ w1.T).relu() @ w2.T                        # [tokens, hidden], partial sums
    compute = time.perf_counter() - t0
    dist.all_reduce(y)
    record = link.op_log()[-1] if link.op_log() else None
    return {"compute_s": compute, "flops": 2.0 * tokens * hidden * 8 * hidden / n,
            "modelled_s": record.modelled_ns / 1e9 if record else 0.0,
            "bytes": y.numel() * y.element_size(), "world": n}


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
