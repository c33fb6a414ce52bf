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
    ### BEGIN SOLUTION hint: two dist.P2POp (isend to the next rank, irecv from the previous) in one dist.batch_isend_irecv
    n, r = tp_world_size(), tp_rank()
    return dist.batch_isend_irecv([dist.P2POp(dist.isend, send, (r + 1) % n),
                                   dist.P2POp(dist.irecv, recv, (r - 1) % n)])
    ### END SOLUTION


def ring_all_gather_matmul(x: torch.Tensor, weight: torch.Tensor):
    """All-gather + GEMM, pipelined: ``y = AG(x) W^T`` for ``x [B, S/n, in]``, ``W [out, in]``.

    At step k = 0..n-1 this rank holds shard ``(r - k) mod n``: it passes that shard on while it
    multiplies it into its rows of ``y``, then takes the shard the previous rank passed it. The
    n - 1 exchanges all travel behind GEMMs. Returns ``(y [B, S, out], x_full [B, S, in])``."""
    n, r, s = tp_world_size(), tp_rank(), x.shape[1]
    y = x.new_empty(x.shape[0], n * s, weight.shape[0])
    x_full = x.new_empty(x.shape[0], n * s, x.shape[2])
    ### BEGIN SOLUTION hint: shard = x; each step: start exchange(shard, a new buffer) unless last, GEMM the shard into its rows of y (and x_full), wait, take the buffer
    shard = x.contiguous()
    for k in range(n):
        src = (r - k) % n                                                     # whose shard we hold
        if k < n - 1:
            nxt = torch.empty_like(shard)
            works = exchange(shard, nxt)                                      # in flight ...
        rows = slice(src * s, (src + 1) * s)
        y[:, rows] = shard @ weight.T                                         # ... behind this GEMM
        x_full[:, rows] = shard
        if k < n - 1:
            for w in works:
                w.wait()
            shard = nxt
    ### END SOLUTION
    return y, x_full


def ring_matmul_reduce_scatter(a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """GEMM + reduce-scatter, pipelined: ``RS(a W^T)`` for ``a [B, S, in/n]``, ``W [out, in/n]``.

    At step k this rank computes its partial sum for shard ``(r - k - 1) mod n``, adds the
    running sum of that shard the previous rank passed it, and passes the total on; at the last
    step the shard is its own and the total is complete. Returns ``[B, S/n, out]``."""
    n, r = tp_world_size(), tp_rank()
    s = a.shape[1] // n
    ### BEGIN SOLUTION hint: each step: GEMM the rows of this step's shard; from step 1 on wait for the running sum and add it; unless last, start exchange(total, a new buffer)
    total, works, received = None, [], None
    for k in range(n):
        dst = (r - k - 1) % n                                                 # whose sum we add to
        part = a[:, dst * s:(dst + 1) * s] @ weight.T                         # behind the exchange
        if k > 0:
            for w in works:
                w.wait()
            part = part + received
        if k < n - 1:
            received = torch.empty_like(part)
            works = exchange(part, received)
        total = part
    return total
    ### END SOLUTION


def chunked_matmul_reduce_scatter(a: torch.Tensor, weight: torch.Tensor, chunks: int) -> torch.Tensor:
    """GEMM + reduce-scatter in ``chunks`` pieces: piece c holds positions ``c*q`` to ``(c+1)*q``
    of *every* shard (q = S/n/chunks), so its reduce-scatter gives this rank piece c of its own
    shard. Each piece's reduce-scatter travels during the next piece's GEMM; the last one is
    exposed. Returns ``[B, S/n, out]``."""
    n = tp_world_size()
    s = a.shape[1] // n
    if s % chunks:
        raise ValueError(f"chunks={chunks} must divide the {s} positions of a shard")
    ### BEGIN SOLUTION hint: a.unflatten(1, (n, chunks, q))[:, :, c].flatten(1, 2) is piece c; start_reduce_scatter_sequence each GEMM'd piece, wait for all, cat along dim 1
    pieces = a.unflatten(1, (n, chunks, s // chunks))                        # [B, n, chunks, q, in]
    pending = [start_reduce_scatter_sequence(pieces[:, :, c].flatten(1, 2) @ weight.T)
               for c in range(chunks)]
    return torch.cat([p.wait() for p in pending], dim=1)                     # [B, S/n, out]
    ### END SOLUTION


# --------------------------------------------------------------------------- 2. the linears' autograd
class ColumnParallelMatmul(torch.autograd.Function):
    """``y = AG(x) W^T``: sequence shard ``[B, S/n, in]`` in, ``[B, S, out/n]`` out. Backward:
    ``dx = RS(dy W)``, ``dW = dy^T AG(x)``. With ``bulk`` only the shard is saved: its all-gather
    travels during the dgrad GEMM, and dgrad's reduce-scatter during the wgrad GEMM."""

    @staticmethod
    def forward(ctx, x, weight, overlap: Overlap):
        ### BEGIN SOLUTION hint: the ring (pipelined) or all_gather_sequence then the GEMM; save the shard if bulk, else the gathered input
        if overlap.pipelined:
            y, x_full = ring_all_gather_matmul(x, weight)
        else:
            x_full = all_gather_sequence(x)
            y = x_full @ weight.T
        ctx.overlap = overlap
        ctx.save_for_backward(x if overlap.bulk else x_full, weight)
        return y
        ### END SOLUTION

    @staticmethod
    def backward(ctx, dy):
        saved, weight = ctx.saved_tensors
        ### BEGIN SOLUTION hint: bulk: start the all-gather, dgrad GEMM, wait, start the reduce-scatter, wgrad GEMM, wait; pipelined: the ring reduce-scatter with W^T
        if ctx.overlap.bulk:
            gather = start_all_gather_sequence(saved)         # in flight ...
            dx_full = dy @ weight                             # ... behind dgrad   [B, S, in]
            x_full = gather.wait()
            scatter = start_reduce_scatter_sequence(dx_full)  # in flight ...
            dw = weight_grad(dy, x_full)                      # ... behind wgrad   [out/n, in]
            dx = scatter.wait()                               # [B, S/n, in]
        elif ctx.overlap.pipelined:
            dx = ring_matmul_reduce_scatter(dy, weight.T)
            dw = weight_grad(dy, saved)
        else:
            dx = reduce_scatter_sequence(dy @ weight)
            dw = weight_grad(dy, saved)
        return dx, dw, None
        ### END SOLUTION


class RowParallelMatmul(torch.autograd.Function):
    """``y = RS(a W^T)``: ``[B, S, in/n]`` in, sequence shard ``[B, S/n, out]`` out. Backward:
    ``dy`` is all-gathered (pipelined: inside the dgrad GEMM), ``da = AG(dy) W``,
    ``dW = AG(dy)^T a``."""

    @staticmethod
    def forward(ctx, a, weight, overlap: Overlap):
        ### BEGIN SOLUTION hint: plain, ring or chunked, as overlap says; save what backward needs
        if not overlap.pipelined:
            y = reduce_scatter_sequence(a @ weight.T)
        elif overlap.reduce_scatter == "chunked":
            y = chunked_matmul_reduce_scatter(a, weight, overlap.chunks)
        else:
            y = ring_matmul_reduce_scatter(a, weight)
        ctx.overlap = overlap
        ctx.save_for_backward(a, weight)
        return y
        ### END SOLUTION

    @staticmethod
    def backward(ctx, dy):
        a, weight = ctx.saved_tensors
        ### BEGIN SOLUTION hint: the ring all-gather with W^T gives da and AG(dy) at once
        if ctx.overlap.pipelined:
            da, dy_full = ring_all_gather_matmul(dy.contiguous(), weight.T)
        else:
            dy_full = all_gather_sequence(dy)
            da = dy_full @ weight
        return da, weight_grad(dy_full, a), None
        ### END SOLUTION


# --------------------------------------------------------------------------- 3. linears, sublayers, block
def column_parallel_linear(x: torch.Tensor, linears: list, overlap: Overlap) -> list:
    """Several column-parallel linears of one input (q, k, v; or gate, up) behind *one*
    all-gather: their weights stacked into one GEMM. Returns each one's ``[B, S, out/n]``."""
    ### BEGIN SOLUTION hint: torch.cat the weights, one ColumnParallelMatmul, split the output, add each bias
    y = ColumnParallelMatmul.apply(x, torch.cat([lin.weight for lin in linears]), overlap)
    outs = y.split([lin.weight.shape[0] for lin in linears], dim=-1)
    return [o if lin.bias is None else o + lin.bias for o, lin in zip(outs, linears)]
    ### END SOLUTION


def row_parallel_linear(a: torch.Tensor, linear: ShardedLinear, overlap: Overlap) -> torch.Tensor:
    """The row-parallel linear: ``[B, S, in/n] -> [B, S/n, out]``, the whole bias added once."""
    ### BEGIN SOLUTION hint: RowParallelMatmul, then the bias on the shard
    y = RowParallelMatmul.apply(a, linear.weight, overlap)
    return y if linear.bias is None else y + linear.bias
    ### END SOLUTION


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
        ### BEGIN SOLUTION hint: column_parallel_linear of wq wk wv, model_ops.causal_attention (rope_tables of the full sequence), row_parallel_linear
        q, k, v = column_parallel_linear(x, [self.wq, self.wk, self.wv], self.overlap)   # [B, S, H/n]
        ctx = model_ops.causal_attention(q, k, v, self.local_heads, rope_tables(self.cfg, q))
        return row_parallel_linear(ctx, self.wo, self.overlap)                          # [B, S/n, H]
        ### END SOLUTION


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
        ### BEGIN SOLUTION hint: gpt: fc1, gelu, fc2; llama: gate and up behind one all-gather, silu(gate) * up, w_down
        if self.cfg.style == "gpt":
            h, = column_parallel_linear(x, [self.fc1], self.overlap)                  # [B, S, F/n]
            return row_parallel_linear(model_ops.gelu(h), self.fc2, self.overlap)     # [B, S/n, H]
        gate, up = column_parallel_linear(x, [self.w_gate, self.w_up], self.overlap)
        return row_parallel_linear(model_ops.silu(gate) * up, self.w_down, self.overlap)
        ### END SOLUTION


def OverlapBlock(cfg: ModelConfig, layer: int = 0, device=None, overlap: Overlap = Overlap()):
    """The pre-norm block on sequence shards with the overlapped sublayers (norms, dropout and
    residual as in lab 5: ``workbook.tensor_parallel.sequence_parallel.SequenceParallelBlock``)."""
    device = device or ranks.device()
    return SequenceParallelBlock(cfg, layer, OverlapAttention(cfg, layer, device, overlap),
                                 OverlapMLP(cfg, layer, device, overlap), device)


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
