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
### BEGIN CHALLENGE: the collective matmul rings (one ring step, all-gather + GEMM, GEMM + reduce-scatter)
def exchange(send: torch.Tensor, recv: torch.Tensor) -> list:
    """One step of the ring, started and not waited on.

    The first tensor goes to the next rank of the tensor-parallel group and the second (a buffer
    of the same shape) is filled by the previous rank; the ranks form a ring, so the last rank's
    next is rank 0. Point to point only, both directions in flight at once. Returns the list of
    works the caller waits on before it reads the buffer or reuses the tensor it sent. Lesson 8,
    "The ring all-gather + GEMM"."""
    ### BEGIN SOLUTION
    ### hint 1: a ring step is a send to one neighbour and a receive from the other, started
    ###     together (lesson 8, "The ring all-gather + GEMM"; lesson 1 for point-to-point ops)
    ### hint 2: find this rank and the group's size, name the next and the previous rank (modulo
    ###     the size), describe the send and the receive as two operations and start them in one
    ###     batch; return what starting them gives you
    ### hint 3: two dist.P2POp (isend to (r + 1) % n, irecv from (r - 1) % n) in one
    ###     dist.batch_isend_irecv, which returns the works
    n, r = tp_world_size(), tp_rank()
    return dist.batch_isend_irecv([dist.P2POp(dist.isend, send, (r + 1) % n),
                                   dist.P2POp(dist.irecv, recv, (r - 1) % n)])
    ### END SOLUTION


def ring_all_gather_matmul(x: torch.Tensor, weight: torch.Tensor):
    """All-gather + GEMM as a pipelined ring: the forward pass's "collective matmul".

    Contract: the input is this rank's sequence shard [B, S/n, in], the weight [out, in].
    Returns a pair: the product AG(x) W^T, [B, S, out], and the gathered input AG(x), [B, S, in]
    (the backward pass needs it), every shard's rows where the collective all-gather would put
    them. Communication: ring steps between neighbours only (no collective), n - 1 of them, one
    shard each, every one in flight while a GEMM runs: none waited on before the GEMM it hides
    behind has been issued. Works on one rank too. Lesson 8, "The ring all-gather + GEMM" (the
    left-hand grid says which shard a rank holds at each step)."""
    ### BEGIN SOLUTION
    ### hint 1: the rows of AG(x) W^T that belong to shard j need shard j alone, so multiply the
    ###     shard you hold while the next one travels (lesson 8, "The ring all-gather + GEMM", and
    ###     its grid: at step k rank r holds shard (r - k) mod n)
    ### hint 2: allocate both outputs; start from your own shard; at each of the n steps start
    ###     passing the shard you hold on (except at the last step), multiply it into its own rows
    ###     and copy it into the gathered input, then wait and continue with the shard received
    ### hint 3: n, r, s = tp_world_size(), tp_rank(), x.shape[1]; y = x.new_empty(B, n * s, out);
    ###     x_full = x.new_empty(B, n * s, in); shard = x.contiguous(); for k in range(n):
    ###     src = (r - k) % n; if k < n - 1: nxt = torch.empty_like(shard); works =
    ###     exchange(shard, nxt); y[:, rows of src] = shard @ weight.T; x_full[:, rows of src] =
    ###     shard; then wait on works and shard = nxt; return y, x_full
    n, r, s = tp_world_size(), tp_rank(), x.shape[1]
    y = x.new_empty(x.shape[0], n * s, weight.shape[0])
    x_full = x.new_empty(x.shape[0], n * s, x.shape[2])
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
    return y, x_full
    ### END SOLUTION


def ring_matmul_reduce_scatter(a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """GEMM + reduce-scatter as a pipelined ring.

    Contract: the input is [B, S, in/n] (this rank's slice of the features, every position), the
    weight [out, in/n]. Returns this rank's sequence shard of RS(a W^T), [B, S/n, out]: for the
    positions of shard r, the sum over every rank of its partial product, what the collective
    reduce-scatter returns. Communication: ring steps between neighbours only (no collective),
    n - 1 of them, each carrying one shard's running sum while a GEMM runs. Works on one rank
    too. Lesson 8, "The ring all-gather + GEMM" (the right-hand grid) and "GEMM + reduce-scatter,
    and what stays exposed"."""
    ### BEGIN SOLUTION
    ### hint 1: here the running sums travel, not the inputs: each rank adds its partial product
    ###     of one shard to the sum it received and passes it on, so that a shard's sum is complete
    ###     when it reaches its owner (lesson 8, the right-hand grid: at step k rank r works on
    ###     shard (r - k - 1) mod n)
    ### hint 2: at each of the n steps multiply the rows of this step's shard; from the second
    ###     step on, wait for the sum the previous rank passed and add it; unless it is the last
    ###     step, start passing the new sum on; the last step's sum is your own shard's, complete
    ### hint 3: n, r = tp_world_size(), tp_rank(); s = a.shape[1] // n; for k in range(n):
    ###     dst = (r - k - 1) % n; part = a[:, rows of dst] @ weight.T;
    ###     if k > 0: wait on works, part = part + received; if k < n - 1: received =
    ###     torch.empty_like(part); works = exchange(part, received); return the last part
    n, r = tp_world_size(), tp_rank()
    s = a.shape[1] // n
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
### END CHALLENGE


def chunked_matmul_reduce_scatter(a: torch.Tensor, weight: torch.Tensor, chunks: int) -> torch.Tensor:
    """GEMM + reduce-scatter in asynchronous pieces: NeMo's chunked alternative to the ring.

    Contract: the same inputs and result as the ring version above ([B, S, in/n] and
    [out, in/n] in, this rank's [B, S/n, out] shard of the sum out), but built from
    as many collective reduce-scatters as there are chunks, each started asynchronously with the
    given sequence-parallel helpers, so that one piece's reduce-scatter travels while the next
    piece's GEMM runs (only the last one is exposed). Raises ``ValueError`` when the number of
    chunks does not divide the S/n positions of a shard. Lesson 8, "GEMM + reduce-scatter, and
    what stays exposed"."""
    ### BEGIN SOLUTION
    ### hint 1: a reduce-scatter hands rank r the r-th of n equal parts of its input, so a piece
    ###     must be made of the same slice of every rank's shard; then its reduce-scatter returns
    ###     a slice of your own shard (lesson 8, "GEMM + reduce-scatter, and what stays exposed")
    ### hint 2: check the chunks divide a shard's positions; view the positions as (rank, chunk,
    ###     position within the chunk); for each chunk, GEMM the rows of that chunk in every shard
    ###     and start its reduce-scatter without waiting; then wait for them all, in order, and
    ###     join the slices along the sequence
    ### hint 3: n = tp_world_size(); s = a.shape[1] // n, a ValueError if s % chunks; pieces =
    ###     a.unflatten(1, (n, chunks, s // chunks)); piece c is
    ###     pieces[:, :, c].flatten(1, 2); start_reduce_scatter_sequence(piece @ weight.T) for each,
    ###     then torch.cat([p.wait() for p in pending], dim=1)
    n = tp_world_size()
    s = a.shape[1] // n
    if s % chunks:
        raise ValueError(f"chunks={chunks} must divide the {s} positions of a shard")
    pieces = a.unflatten(1, (n, chunks, s // chunks))                        # [B, n, chunks, q, in]
    pending = [start_reduce_scatter_sequence(pieces[:, :, c].flatten(1, 2) @ weight.T)
               for c in range(chunks)]
    return torch.cat([p.wait() for p in pending], dim=1)                     # [B, S/n, out]
    ### END SOLUTION


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
    ### BEGIN SOLUTION
    ### hint 1: the ring makes n - 1 steps that each pair one exchange with one shard's GEMM, and
    ###     a step exposes what the exchange takes beyond its GEMM (lesson 8, "Predict, then
    ###     measure"; lesson 7, "Compute: FLOPs of one layer" and "Communication: bytes over
    ###     bandwidth")
    ### hint 2: one exchange costs the link's latency plus one shard's bytes over its bandwidth;
    ###     one step's GEMM costs two FLOPs per multiply-add of one shard's rows by the weight,
    ###     over the compute rate; a step exposes the difference, never less than zero; the ring
    ###     repeats it at each step that has an exchange; convert seconds to milliseconds
    ### hint 3: rows = batch * (seq // n); t_c = link.latency_s + rows * hidden * element_bytes /
    ###     link.bandwidth_Bps; t_g = 2 * rows * hidden * out_features / link.local_flops;
    ###     return 1e3 * (n - 1) * max(0.0, t_c - t_g)
    if n <= 1:
        return 0.0
    rows = batch * (seq // n)
    t_c = rows * hidden * element_bytes / link.bandwidth_Bps     # WRONG: no link.latency_s
    t_g = 2 * rows * hidden * out_features / link.local_flops
    return 1e3 * (n - 1) * max(0.0, t_c - t_g)
    ### END SOLUTION


# --------------------------------------------------------------------------- 3. the linears' autograd
### BEGIN CHALLENGE: the linears' autograd, ColumnParallelMatmul and RowParallelMatmul whole
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
        ### BEGIN SOLUTION
        ### hint 1: the forward is lab 5's all-gather then GEMM, or your ring in its place; what it
        ###     keeps for the backward decides whether the backward must gather again (lesson 8,
        ###     "Bulk overlap in the backward pass")
        ### hint 2: pipelined: the ring gives the output and the gathered input at once; else
        ###     gather, then multiply; remember the overlap; keep the shard (bulk) or the gathered
        ###     input (otherwise), and the weight
        ### hint 3: y, x_full = ring_all_gather_matmul(x, weight) or x_full = all_gather_sequence(x);
        ###     y = x_full @ weight.T; ctx.overlap = overlap; ctx.save_for_backward(x if
        ###     overlap.bulk else x_full, weight); return y
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
        ### BEGIN SOLUTION
        ### hint 1: two GEMMs (dgrad, wgrad) and two collectives; with bulk, each collective runs
        ###     beside the GEMM that does not depend on it (lesson 8, "Bulk overlap in the backward
        ###     pass", the figure and the table)
        ### hint 2: bulk: start gathering the saved shard, run the dgrad GEMM, wait, start the
        ###     reduce-scatter of the full input gradient, run the wgrad GEMM on the gathered input,
        ###     wait; pipelined alone: the reduce-scatter ring with the weight transposed, then the
        ###     wgrad; plain: the blocking collective, then the wgrad
        ### hint 3: saved, weight = ctx.saved_tensors; bulk: gather = start_all_gather_sequence(saved);
        ###     dx_full = dy @ weight; x_full = gather.wait(); scatter =
        ###     start_reduce_scatter_sequence(dx_full); dw = weight_grad(dy, x_full); dx =
        ###     scatter.wait(); pipelined: dx = ring_matmul_reduce_scatter(dy, weight.T);
        ###     return dx, dw, None
        saved, weight = ctx.saved_tensors
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
        ### BEGIN SOLUTION
        ### hint 1: three ways to the same reduce-scattered result: the plain collective after the
        ###     GEMM, the ring, or the chunks (lesson 8, "GEMM + reduce-scatter, and what stays
        ###     exposed")
        ### hint 2: choose by the overlap's switches; remember the overlap and keep the input and
        ###     the weight for the backward
        ### hint 3: y = reduce_scatter_sequence(a @ weight.T), or chunked_matmul_reduce_scatter(a,
        ###     weight, overlap.chunks), or ring_matmul_reduce_scatter(a, weight); ctx.overlap =
        ###     overlap; ctx.save_for_backward(a, weight)
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
        ### BEGIN SOLUTION
        ### hint 1: the input gradient is an all-gather followed by a GEMM: the forward pass's
        ###     ring once more, with the weight's roles swapped (lesson 8, end of "Bulk overlap in
        ###     the backward pass")
        ### hint 2: pipelined: run your all-gather ring on the output gradient with the transposed
        ###     weight, which also hands you the gathered gradient; else gather, then multiply; the
        ###     weight gradient takes the gathered gradient and the saved input
        ### hint 3: a, weight = ctx.saved_tensors; pipelined: da, dy_full =
        ###     ring_all_gather_matmul(dy.contiguous(), weight.T); else dy_full =
        ###     all_gather_sequence(dy); da = dy_full @ weight; return da, weight_grad(dy_full, a), None
        a, weight = ctx.saved_tensors
        if ctx.overlap.pipelined:
            da, dy_full = ring_all_gather_matmul(dy.contiguous(), weight.T)
        else:
            dy_full = all_gather_sequence(dy)
            da = dy_full @ weight
        return da, weight_grad(dy_full, a), None
        ### END SOLUTION
### END CHALLENGE


# --------------------------------------------------------------------------- 4. linears, sublayers, block
def column_parallel_linear(x: torch.Tensor, linears: list, overlap: Overlap) -> list:
    """Several column-parallel linears of one input (q, k, v; or gate and up) behind a single
    all-gather of it, under the given overlap.

    Contract: the input is a sequence shard ``[B, S/n, in]``; each linear is a column-parallel
    ``ShardedLinear`` (weight ``[out_i/n, in]``, a bias or None). Returns one ``[B, S, out_i/n]``
    output per linear, in order, each with its own bias. The input is gathered once whatever
    the number of linears: one overlapped GEMM serves them all. Lesson 8, "The ring all-gather +
    GEMM"; lesson 5 for the layout."""
    ### BEGIN SOLUTION
    ### hint 1: one all-gather for several linears means one GEMM for several weights (lesson 8,
    ###     "The ring all-gather + GEMM")
    ### hint 2: stack the weights along their output features, run the column-parallel function
    ###     once, split its output back into one piece per linear, and add each one's bias
    ### hint 3: ColumnParallelMatmul.apply(x, torch.cat([lin.weight for lin in linears]), overlap),
    ###     then y.split([lin.weight.shape[0] for lin in linears], dim=-1), + lin.bias where not None
    y = ColumnParallelMatmul.apply(x, torch.cat([lin.weight for lin in linears]), overlap)
    outs = y.split([lin.weight.shape[0] for lin in linears], dim=-1)
    return [o if lin.bias is None else o + lin.bias for o, lin in zip(outs, linears)]
    ### END SOLUTION


def row_parallel_linear(a: torch.Tensor, linear: ShardedLinear, overlap: Overlap) -> torch.Tensor:
    """The row-parallel linear under the given overlap: ``[B, S, in/n]`` in, a sequence shard
    ``[B, S/n, out]`` out; the linear's bias (whole on every rank) counted exactly once in the
    result. Lesson 5, "Two ways to shard one block"; lesson 8 for the overlap."""
    ### BEGIN SOLUTION
    ### hint 1: the bias is replicated, the GEMM's result is summed over the ranks: add the bias
    ###     where it is not summed (lesson 5, "Two ways to shard one block")
    ### hint 2: run the row-parallel function, then add the bias (if any) to this rank's shard
    ### hint 3: y = RowParallelMatmul.apply(a, linear.weight, overlap); return y if linear.bias is
    ###     None else y + linear.bias
    y = RowParallelMatmul.apply(a, linear.weight, overlap)
    return y if linear.bias is None else y + linear.bias
    ### END SOLUTION


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
        ### BEGIN SOLUTION
        ### hint 1: the sublayer is column-parallel in, attention on local heads, row-parallel out
        ###     (lesson 5, "Two ways to shard one block"; lesson 8's table)
        ### hint 2: the three projections through your multi-linear column function, the given
        ###     causal attention on this rank's heads with the rotary tables of the whole sequence,
        ###     then your row-parallel linear
        ### hint 3: q, k, v = column_parallel_linear(x, [self.wq, self.wk, self.wv], self.overlap);
        ###     ctx = model_ops.causal_attention(q, k, v, self.local_heads, rope_tables(self.cfg, q));
        ###     return row_parallel_linear(ctx, self.wo, self.overlap)
        q, k, v = column_parallel_linear(x, [self.wq, self.wk, self.wv], self.overlap)   # [B, S, H/n]
        ctx = model_ops.causal_attention(q, k, v, self.local_heads, rope_tables(self.cfg, q))
        return row_parallel_linear(ctx, self.wo, self.overlap)                          # [B, S/n, H]
        ### END SOLUTION


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
        ### BEGIN SOLUTION
        ### hint 1: column-parallel in, the activation on the local features, row-parallel out;
        ###     for llama the gate and the up projection read the same input (lesson 5, "Two ways
        ###     to shard one block")
        ### hint 2: gpt: the first projection, GELU, the second; llama: gate and up through one
        ###     call of your multi-linear column function, SiLU of the gate times up, the down
        ###     projection
        ### hint 3: gpt: h, = column_parallel_linear(x, [self.fc1], self.overlap); return
        ###     row_parallel_linear(model_ops.gelu(h), self.fc2, self.overlap); llama: gate, up =
        ###     ... [self.w_gate, self.w_up] ...; model_ops.silu(gate) * up into self.w_down
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
