# Generated from solutions/tp_overlap.py by `workbook assign` (level: standard): this is your file to edit.
# Replace each `raise NotImplementedError` with your code; check it with `workbook run tp_overlap`
# (or `workbook watch tp_overlap`). Stuck on task N? `workbook hint tp_overlap N`, one hint at a time.
#
# Your tasks (32 pts in all):
#    1. exchange (2.2 pts): One step of the ring, started and not waited on.
#    2. ring_all_gather_matmul (5.7 pts): All-gather + GEMM as a pipelined ring: the forward pass's
#       "collective matmul".
#    3. ring_matmul_reduce_scatter (5.7 pts): GEMM + reduce-scatter as a pipelined ring.
#    4. chunked_matmul_reduce_scatter (2 pts): GEMM + reduce-scatter in asynchronous pieces: NeMo's
#       chunked alternative to the ring.
#    5. predict_ring_exposed_ms (2 pts): Your prediction, made before the run: the milliseconds of
#       communication that your ring all-gather + GEMM leaves exposed (no compute beside it) on the
#       simulated link.
#    6. ColumnParallelMatmul.forward and .backward (3.45 pts): The column-parallel GEMM of
#       sequence-parallel TP, forward and backward, as `Overlap` says.
#    7. RowParallelMatmul.forward and .backward (3.45 pts): The row-parallel GEMM of
#       sequence-parallel TP, forward and backward, as `Overlap` says.
#    8. column_parallel_linear (0.75 pts): Several column-parallel linears of one input (q, k, v;
#       or gate and up) behind a single all-gather of it, under the given overlap.
#    9. row_parallel_linear (0.75 pts): The row-parallel linear under the given overlap:
#       `[B, S, in/n]` in, a sequence shard `[B, S/n, out]` out; the linear's bias (whole on every
#       rank) counted exactly once in the result.
#   10. OverlapAttention.forward (3 pts): `blocks.{layer}.attn` from sequence shards to sequence
#       shards, its communication inside the GEMMs as its `Overlap` says.
#   11. OverlapMLP.forward (3 pts): `blocks.{layer}.mlp` from sequence shards to sequence shards
#       (GELU for gpt, SwiGLU for llama), its communication inside the GEMMs as its `Overlap` says.
"""Lab `tp_overlap`: hide sequence-parallel TP's all-gather and reduce-scatter inside the GEMMs.

Lesson 8 (``lessons/08_tp_overlap.py``) explains it. On lab 5's layout (sequence shards
``[B, S/n, H]`` between sublayers, shard r holding positions ``r*S/n .. (r+1)*S/n``) you build
the "collective matmul" of NeMo's ``tp_comm_overlap`` and PyTorch's async TP: ring exchanges
that run inside the GEMMs of the forward pass, bulk overlap in the backward pass, and the
linears, sublayers and block that use them under every ``Overlap`` variant. Before you run it,
you predict how much communication your ring leaves exposed; the figures printed after the
checks set your prediction beside the model and your own trace.

Given pieces: ``workbook.tensor_parallel.sequence_parallel`` (lab 5's collectives, sharded
linears, norms and block). Run: ``workbook run tp_overlap``; grade: ``workbook grade --lab
tp_overlap``; a hint when stuck: ``workbook hint tp_overlap TASK``; compare with plain SP and
Domino: ``workbook bench tp_overlap``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from workbook.model import ModelConfig
from workbook.model import ops as model_ops    # (not "ops": cloudpickle would mistake it for torch.ops)
from workbook.model.reference import rope_tables
from workbook.tensor_parallel.sequence_parallel import SequenceParallelBlock, ShardedLinear, all_gather_sequence, \
    reduce_scatter_sequence, start_all_gather_sequence, start_reduce_scatter_sequence, \
    sync_sequence_parallel_grads  # noqa: F401 (re-exported: call it after backward, for the norms)
from workbook.tensor_parallel.mappings import tp_rank, tp_world_size
from workbook.runtime import ranks


@dataclass(frozen=True)
class Overlap:
    """Which overlaps run. ``pipelined``: the forward all-gather and reduce-scatter become ring
    exchanges inside the GEMM (and the row-parallel dgrad's all-gather too); ``bulk``: the
    column-parallel backward sends its all-gather during the dgrad GEMM and its reduce-scatter
    during the wgrad GEMM; ``reduce_scatter="chunked"``: the pipelined forward reduce-scatter is
    ``chunks`` asynchronous reduce-scatters instead of a p2p ring."""
    pipelined: bool = True
    bulk: bool = True
    reduce_scatter: str = "ring"
    chunks: int = 2


VARIANTS = {"sp": Overlap(False, False), "bulk": Overlap(False, True),
            "pipelined": Overlap(True, False), "pipelined+bulk": Overlap(True, True),
            "chunked+bulk": Overlap(True, True, "chunked")}


def weight_grad(grad_out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
    """``dW = grad_out^T inp`` summed over batch and positions: ``[.., out], [.., in] -> [out, in]``."""
    return grad_out.flatten(0, -2).T @ inp.flatten(0, -2)


# --------------------------------------------------------------------------- 1. the rings
def exchange(send: torch.Tensor, recv: torch.Tensor) -> list:
    """One step of the ring, started and not waited on.

    The first tensor goes to the next rank of the tensor-parallel group and the second (a buffer
    of the same shape) is filled by the previous rank; the ranks form a ring, so the last rank's
    next is rank 0. Point to point only, both directions in flight at once. Returns the list of
    works the caller waits on before it reads the buffer or reuses the tensor it sent. Lesson 8,
    "The ring all-gather + GEMM"."""
    raise NotImplementedError("not implemented yet: tp_overlap.exchange")


def ring_all_gather_matmul(x: torch.Tensor, weight: torch.Tensor):
    """All-gather + GEMM as a pipelined ring: the forward pass's "collective matmul".

    Contract: the input is this rank's sequence shard [B, S/n, in], the weight [out, in].
    Returns a pair: the product AG(x) W^T, [B, S, out], and the gathered input AG(x), [B, S, in]
    (the backward pass needs it), every shard's rows where the collective all-gather would put
    them. Communication: ring steps between neighbours only (no collective), n - 1 of them, one
    shard each, every one in flight while a GEMM runs: none waited on before the GEMM it hides
    behind has been issued. Works on one rank too. Lesson 8, "The ring all-gather + GEMM" (the
    left-hand grid says which shard a rank holds at each step)."""
    raise NotImplementedError("not implemented yet: tp_overlap.ring_all_gather_matmul")


def ring_matmul_reduce_scatter(a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """GEMM + reduce-scatter as a pipelined ring.

    Contract: the input is [B, S, in/n] (this rank's slice of the features, every position), the
    weight [out, in/n]. Returns this rank's sequence shard of RS(a W^T), [B, S/n, out]: for the
    positions of shard r, the sum over every rank of its partial product, what the collective
    reduce-scatter returns. Communication: ring steps between neighbours only (no collective),
    n - 1 of them, each carrying one shard's running sum while a GEMM runs. Works on one rank
    too. Lesson 8, "The ring all-gather + GEMM" (the right-hand grid) and "GEMM + reduce-scatter,
    and what stays exposed"."""
    raise NotImplementedError("not implemented yet: tp_overlap.ring_matmul_reduce_scatter")


def chunked_matmul_reduce_scatter(a: torch.Tensor, weight: torch.Tensor, chunks: int) -> torch.Tensor:
    """GEMM + reduce-scatter in asynchronous pieces: NeMo's chunked alternative to the ring.

    Contract: the same inputs and result as the ring version above ([B, S, in/n] and
    [out, in/n] in, this rank's [B, S/n, out] shard of the sum out), but built from
    as many collective reduce-scatters as there are chunks, each started asynchronously with the
    given sequence-parallel helpers, so that one piece's reduce-scatter travels while the next
    piece's GEMM runs (only the last one is exposed). Raises ``ValueError`` when the number of
    chunks does not divide the S/n positions of a shard. Lesson 8, "GEMM + reduce-scatter, and
    what stays exposed"."""
    raise NotImplementedError("not implemented yet: tp_overlap.chunked_matmul_reduce_scatter")


# --------------------------------------------------------------------------- 2. before you run: predict
def predict_ring_exposed_ms(link, n: int, batch: int, seq: int, hidden: int, out_features: int,
                            element_bytes: int = 4) -> float:
    """Your prediction, made before the run: the milliseconds of communication that your ring
    all-gather + GEMM leaves exposed (no compute beside it) on the simulated link.

    The setting: n ranks on the given simulated link (a ``workbook.link.Link``: its alpha-beta
    figures, and the compute rate it was calibrated to, measured on this machine); every rank
    holds a sequence shard of ``[batch, seq, hidden]`` and a weight ``[out_features, hidden]``,
    elements of element_bytes bytes each. Return a float, in milliseconds, derived from the link's
    figures and the shapes alone: no ranks, no timing. The grader compares it with the course's
    model of your schedule on several links and shapes, and names the term of a wrong derivation;
    the figures after the self-check print your prediction, the model and the time measured in
    your own ring's trace side by side. Lesson 8, "Predict, then measure"."""
    raise NotImplementedError("not implemented yet: tp_overlap.predict_ring_exposed_ms")


# --------------------------------------------------------------------------- 3. the linears' autograd
class ColumnParallelMatmul(torch.autograd.Function):
    """The column-parallel GEMM of sequence-parallel TP, forward and backward, as ``Overlap`` says.

    Forward: the input is a sequence shard [B, S/n, in], the weight this rank's [out/n, in];
    returns AG(x) W^T, [B, S, out/n]. Pipelined: the all-gather runs inside the GEMM (your
    ring); else one collective before it.

    Backward: returns the gradients of the input (a sequence shard [B, S/n, in], summed over the
    ranks) and of the weight ([out/n, in]), and None for the overlap switches. Bulk:
    the forward pass keeps only the input shard (the memory SP saves), and each of the backward's
    two collectives is started before, and waited on after, the GEMM that does not need it.
    Pipelined without bulk: the input gradient's reduce-scatter runs inside its GEMM (your
    ring). Neither: the plain collectives. Lesson 8, "Bulk overlap in the backward pass" and its
    table; lesson 5 for the gradients of sequence-parallel TP."""

    @staticmethod
    def forward(ctx, x, weight, overlap: Overlap):
        raise NotImplementedError("not implemented yet: tp_overlap.ColumnParallelMatmul.forward")

    @staticmethod
    def backward(ctx, dy):
        raise NotImplementedError("not implemented yet: tp_overlap.ColumnParallelMatmul.backward")


class RowParallelMatmul(torch.autograd.Function):
    """The row-parallel GEMM of sequence-parallel TP, forward and backward, as ``Overlap`` says.

    Forward: the input is [B, S, in/n], the weight this rank's [out, in/n]; returns this rank's
    sequence shard [B, S/n, out] of the GEMM summed over the ranks. Pipelined: the reduce-scatter
    runs inside the GEMM, as your ring or, when the switches say "chunked", as your chunked
    version with their number of chunks; else one collective after it.

    Backward: the output gradient arrives as a sequence shard; returns the gradients of the
    input ([B, S, in/n]) and of the weight ([out, in/n]), and None for the overlap switches.
    Both need the gathered output gradient; pipelined, that all-gather runs inside the input
    gradient's GEMM (your ring), else one collective. Lesson 8, "Bulk overlap in the backward
    pass" (its last paragraph and the table)."""

    @staticmethod
    def forward(ctx, a, weight, overlap: Overlap):
        raise NotImplementedError("not implemented yet: tp_overlap.RowParallelMatmul.forward")

    @staticmethod
    def backward(ctx, dy):
        raise NotImplementedError("not implemented yet: tp_overlap.RowParallelMatmul.backward")


# --------------------------------------------------------------------------- 4. linears, sublayers, block
def column_parallel_linear(x: torch.Tensor, linears: list, overlap: Overlap) -> list:
    """Several column-parallel linears of one input (q, k, v; or gate and up) behind a single
    all-gather of it, under the given overlap.

    Contract: the input is a sequence shard ``[B, S/n, in]``; each linear is a column-parallel
    ``ShardedLinear`` (weight ``[out_i/n, in]``, a bias or None). Returns one ``[B, S, out_i/n]``
    output per linear, in order, each with its own bias. The input is gathered once whatever
    the number of linears: one overlapped GEMM serves them all. Lesson 8, "The ring all-gather +
    GEMM"; lesson 5 for the layout."""
    raise NotImplementedError("not implemented yet: tp_overlap.column_parallel_linear")


def row_parallel_linear(a: torch.Tensor, linear: ShardedLinear, overlap: Overlap) -> torch.Tensor:
    """The row-parallel linear under the given overlap: ``[B, S, in/n]`` in, a sequence shard
    ``[B, S/n, out]`` out; the linear's bias (whole on every rank) counted exactly once in the
    result. Lesson 5, "Two ways to shard one block"; lesson 8 for the overlap."""
    raise NotImplementedError("not implemented yet: tp_overlap.row_parallel_linear")


class OverlapAttention(nn.Module):
    """``blocks.{layer}.attn`` from sequence shards to sequence shards, its communication inside
    the GEMMs as its ``Overlap`` says.

    ``forward(x)``: the input and the output are sequence shards ``[B, S/n, H]``. The query, key
    and value projections share one gathering of the input; each rank attends with its heads/n
    heads over the whole sequence (causal; rotary positions of the full sequence for llama, as in
    the reference model); the output projection returns a sequence shard. The model's attention
    core is given (``workbook.model.ops``). Lesson 8, the table at the end of "Bulk overlap in the
    backward pass"; lesson 5, "Two ways to shard one block"."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None, overlap: Overlap = Overlap()):
        super().__init__()
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        self.cfg, self.name, self.overlap = cfg, f"blocks.{layer}.attn", overlap
        self.local_heads = cfg.heads // tp_world_size()
        for w in ("wq", "wk", "wv"):
            setattr(self, w, ShardedLinear(cfg, f"{self.name}.{w}", "column", device))
        self.wo = ShardedLinear(cfg, f"{self.name}.wo", "row", device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("not implemented yet: tp_overlap.OverlapAttention.forward")


class OverlapMLP(nn.Module):
    """``blocks.{layer}.mlp`` from sequence shards to sequence shards (GELU for gpt, SwiGLU for
    llama), its communication inside the GEMMs as its ``Overlap`` says.

    ``forward(x)``: the input and the output are sequence shards ``[B, S/n, H]``; the
    column-parallel projections of one input share one gathering of it; the activation is the
    model's (given in ``workbook.model.ops``). Lesson 8, the table at the end of "Bulk overlap in
    the backward pass"; lesson 5, "Two ways to shard one block"."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None, overlap: Overlap = Overlap()):
        super().__init__()
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        self.cfg, self.name, self.overlap = cfg, f"blocks.{layer}.mlp", overlap
        names = ("fc1", "fc2") if cfg.style == "gpt" else ("w_gate", "w_up", "w_down")
        for w in names:
            setattr(self, w, ShardedLinear(cfg, f"{self.name}.{w}", "row" if w in ("fc2", "w_down")
                                           else "column", device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("not implemented yet: tp_overlap.OverlapMLP.forward")


def OverlapBlock(cfg: ModelConfig, layer: int = 0, device=None, overlap: Overlap = Overlap()):
    """The pre-norm block on sequence shards with the overlapped sublayers (norms, dropout and
    residual as in lab 5: ``workbook.tensor_parallel.sequence_parallel.SequenceParallelBlock``)."""
    device = device or ranks.device()
    return SequenceParallelBlock(cfg, layer, OverlapAttention(cfg, layer, device, overlap),
                                 OverlapMLP(cfg, layer, device, overlap), device)


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
