# Generated from solutions/tp_overlap.py by `workbook assign`: this is your file to edit.
# Replace each `raise NotImplementedError` with your code, then grade it with
#     workbook grade --lab tp_overlap
#
# Your tasks (30 pts in all):
#    1. exchange (2.2 pts): One ring step, started: `send` to the next rank (r + 1), `recv` filled
#       from the previous one (r - 1).
#    2. ring_all_gather_matmul (5.7 pts): All-gather + GEMM, pipelined: `y = AG(x) W^T` for
#       `x [B, S/n, in]`, `W [out, in]`.
#    3. ring_matmul_reduce_scatter (5.7 pts): GEMM + reduce-scatter, pipelined: `RS(a W^T)` for
#       `a [B, S, in/n]`, `W [out, in/n]`.
#    4. chunked_matmul_reduce_scatter (2 pts): GEMM + reduce-scatter in `chunks` pieces: piece c
#       holds positions `c*q` to `(c+1)*q` of *every* shard (q = S/n/chunks), so its reduce-scatter
#       gives this rank piece c of its own shard.
#    5. ColumnParallelMatmul.forward and .backward (3.45 pts): `y = AG(x) W^T`: sequence shard
#       `[B, S/n, in]` in, `[B, S, out/n]` out.
#    6. RowParallelMatmul.forward and .backward (3.45 pts): `y = RS(a W^T)`: `[B, S, in/n]` in,
#       sequence shard `[B, S/n, out]` out.
#    7. column_parallel_linear (0.75 pts): Several column-parallel linears of one input (q, k, v;
#       or gate, up) behind *one* all-gather: their weights stacked into one GEMM.
#    8. row_parallel_linear (0.75 pts): The row-parallel linear: `[B, S, in/n] -> [B, S/n, out]`,
#       the whole bias added once.
#    9. OverlapAttention.forward (3 pts): `blocks.{layer}.attn` from sequence shards to sequence
#       shards: q, k, v behind one ring all-gather, attention on heads/n heads over the whole
#       sequence, wo's ring reduce-scatter.
#   10. OverlapMLP.forward (3 pts): `blocks.{layer}.mlp` from sequence shards to sequence shards
#       (GELU, or SwiGLU).
"""Lab `tp_overlap`: hide sequence-parallel TP's all-gather and reduce-scatter inside the GEMMs.

Lesson 8 (``lessons/08_tp_overlap.py``) explains it. The layout is lab 5's: ``[B, S/n, H]``
sequence shards between sublayers, shard r = positions ``r*S/n .. (r+1)*S/n``. Instead of
waiting for a whole all-gather before a GEMM (or a whole GEMM before its reduce-scatter), each
rank multiplies one shard while the next one travels around the ring (n - 1 p2p steps: NeMo's
``tp_comm_overlap_ag`` / ``_rs``, PyTorch's async TP), and in the backward pass it sends what has
no dependency on the GEMM running beside it (``tp_comm_bulk_dgrad`` / ``_wgrad``). Given pieces:
``workbook/sequence_parallel.py``. Run: ``workbook run tp_overlap``; grade: ``workbook grade
--lab tp_overlap``; compare with plain SP and Domino: ``workbook bench tp_overlap``.
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


# --------------------------------------------------------------------------- 1. the ring
def exchange(send: torch.Tensor, recv: torch.Tensor) -> list:
    """One ring step, started: ``send`` to the next rank (r + 1), ``recv`` filled from the
    previous one (r - 1). Returns the works to wait on (``dist.batch_isend_irecv``)."""
    # TODO: two dist.P2POp (isend to the next rank, irecv from the previous) in one
    #       dist.batch_isend_irecv
    raise NotImplementedError("not implemented yet: tp_overlap.exchange")


def ring_all_gather_matmul(x: torch.Tensor, weight: torch.Tensor):
    """All-gather + GEMM, pipelined: ``y = AG(x) W^T`` for ``x [B, S/n, in]``, ``W [out, in]``.

    At step k = 0..n-1 this rank holds shard ``(r - k) mod n``: it passes that shard on while it
    multiplies it into its rows of ``y``, then takes the shard the previous rank passed it. The
    n - 1 exchanges all travel behind GEMMs. Returns ``(y [B, S, out], x_full [B, S, in])``."""
    n, r, s = tp_world_size(), tp_rank(), x.shape[1]
    y = x.new_empty(x.shape[0], n * s, weight.shape[0])
    x_full = x.new_empty(x.shape[0], n * s, x.shape[2])
    # TODO: shard = x; each step: start exchange(shard, a new buffer) unless last, GEMM the shard
    #       into its rows of y (and x_full), wait, take the buffer
    raise NotImplementedError("not implemented yet: tp_overlap.ring_all_gather_matmul")
    return y, x_full


def ring_matmul_reduce_scatter(a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """GEMM + reduce-scatter, pipelined: ``RS(a W^T)`` for ``a [B, S, in/n]``, ``W [out, in/n]``.

    At step k this rank computes its partial sum for shard ``(r - k - 1) mod n``, adds the
    running sum of that shard the previous rank passed it, and passes the total on; at the last
    step the shard is its own and the total is complete. Returns ``[B, S/n, out]``."""
    n, r = tp_world_size(), tp_rank()
    s = a.shape[1] // n
    # TODO: each step: GEMM the rows of this step's shard; from step 1 on wait for the running sum
    #       and add it; unless last, start exchange(total, a new buffer)
    raise NotImplementedError("not implemented yet: tp_overlap.ring_matmul_reduce_scatter")


def chunked_matmul_reduce_scatter(a: torch.Tensor, weight: torch.Tensor, chunks: int) -> torch.Tensor:
    """GEMM + reduce-scatter in ``chunks`` pieces: piece c holds positions ``c*q`` to ``(c+1)*q``
    of *every* shard (q = S/n/chunks), so its reduce-scatter gives this rank piece c of its own
    shard. Each piece's reduce-scatter travels during the next piece's GEMM; the last one is
    exposed. Returns ``[B, S/n, out]``."""
    n = tp_world_size()
    s = a.shape[1] // n
    if s % chunks:
        raise ValueError(f"chunks={chunks} must divide the {s} positions of a shard")
    # TODO: a.unflatten(1, (n, chunks, q))[:, :, c].flatten(1, 2) is piece c;
    #       start_reduce_scatter_sequence each GEMM'd piece, wait for all, cat along dim 1
    raise NotImplementedError("not implemented yet: tp_overlap.chunked_matmul_reduce_scatter")


# --------------------------------------------------------------------------- 2. the linears' autograd
class ColumnParallelMatmul(torch.autograd.Function):
    """``y = AG(x) W^T``: sequence shard ``[B, S/n, in]`` in, ``[B, S, out/n]`` out. Backward:
    ``dx = RS(dy W)``, ``dW = dy^T AG(x)``. With ``bulk`` only the shard is saved: its all-gather
    travels during the dgrad GEMM, and dgrad's reduce-scatter during the wgrad GEMM."""

    @staticmethod
    def forward(ctx, x, weight, overlap: Overlap):
        # TODO: the ring (pipelined) or all_gather_sequence then the GEMM; save the shard if bulk,
        #       else the gathered input
        raise NotImplementedError("not implemented yet: tp_overlap.ColumnParallelMatmul.forward")

    @staticmethod
    def backward(ctx, dy):
        saved, weight = ctx.saved_tensors
        # TODO: bulk: start the all-gather, dgrad GEMM, wait, start the reduce-scatter, wgrad GEMM,
        #       wait; pipelined: the ring reduce-scatter with W^T
        raise NotImplementedError("not implemented yet: tp_overlap.ColumnParallelMatmul.backward")


class RowParallelMatmul(torch.autograd.Function):
    """``y = RS(a W^T)``: ``[B, S, in/n]`` in, sequence shard ``[B, S/n, out]`` out. Backward:
    ``dy`` is all-gathered (pipelined: inside the dgrad GEMM), ``da = AG(dy) W``,
    ``dW = AG(dy)^T a``."""

    @staticmethod
    def forward(ctx, a, weight, overlap: Overlap):
        # TODO: plain, ring or chunked, as overlap says; save what backward needs
        raise NotImplementedError("not implemented yet: tp_overlap.RowParallelMatmul.forward")

    @staticmethod
    def backward(ctx, dy):
        a, weight = ctx.saved_tensors
        # TODO: the ring all-gather with W^T gives da and AG(dy) at once
        raise NotImplementedError("not implemented yet: tp_overlap.RowParallelMatmul.backward")


# --------------------------------------------------------------------------- 3. linears, sublayers, block
def column_parallel_linear(x: torch.Tensor, linears: list, overlap: Overlap) -> list:
    """Several column-parallel linears of one input (q, k, v; or gate, up) behind *one*
    all-gather: their weights stacked into one GEMM. Returns each one's ``[B, S, out/n]``."""
    # TODO: torch.cat the weights, one ColumnParallelMatmul, split the output, add each bias
    raise NotImplementedError("not implemented yet: tp_overlap.column_parallel_linear")


def row_parallel_linear(a: torch.Tensor, linear: ShardedLinear, overlap: Overlap) -> torch.Tensor:
    """The row-parallel linear: ``[B, S, in/n] -> [B, S/n, out]``, the whole bias added once."""
    # TODO: RowParallelMatmul, then the bias on the shard
    raise NotImplementedError("not implemented yet: tp_overlap.row_parallel_linear")


class OverlapAttention(nn.Module):
    """``blocks.{layer}.attn`` from sequence shards to sequence shards: q, k, v behind one ring
    all-gather, attention on heads/n heads over the whole sequence, wo's ring reduce-scatter."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None, overlap: Overlap = Overlap()):
        super().__init__()
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        self.cfg, self.name, self.overlap = cfg, f"blocks.{layer}.attn", overlap
        self.local_heads = cfg.heads // tp_world_size()
        for w in ("wq", "wk", "wv"):
            setattr(self, w, ShardedLinear(cfg, f"{self.name}.{w}", "column", device))
        self.wo = ShardedLinear(cfg, f"{self.name}.wo", "row", device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO: column_parallel_linear of wq wk wv, model_ops.causal_attention (rope_tables of the
        #       full sequence), row_parallel_linear
        raise NotImplementedError("not implemented yet: tp_overlap.OverlapAttention.forward")


class OverlapMLP(nn.Module):
    """``blocks.{layer}.mlp`` from sequence shards to sequence shards (GELU, or SwiGLU)."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None, overlap: Overlap = Overlap()):
        super().__init__()
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        self.cfg, self.name, self.overlap = cfg, f"blocks.{layer}.mlp", overlap
        names = ("fc1", "fc2") if cfg.style == "gpt" else ("w_gate", "w_up", "w_down")
        for w in names:
            setattr(self, w, ShardedLinear(cfg, f"{self.name}.{w}", "row" if w in ("fc2", "w_down")
                                           else "column", device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO: gpt: fc1, gelu, fc2; llama: gate and up behind one all-gather, silu(gate) * up,
        #       w_down
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
