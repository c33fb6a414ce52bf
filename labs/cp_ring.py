# Generated from solutions/cp_ring.py by `workbook assign` (level: standard): this is your file to edit.
# Replace each `raise NotImplementedError` with your code; check it with `workbook run cp_ring`
# (or `workbook watch cp_ring`). Stuck on task N? `workbook hint cp_ring N`, one hint at a time.
#
# Your tasks (32 pts in all):
#   1. merge_partials (3 pts): The online-softmax state of the same query rows over the keys of a
#      and of b together (two disjoint key sets), exact: what one block would give over all those
#      keys.
#   2. block_mask (1.5 pts): What causal attention needs of the queries of one chunk over the keys
#      of another (chunk ids in sequence order): one of the three mask constants the lab imports
#      from the given module (skip, causal, full).
#   3. block_pairs (1.5 pts): The attention blocks a rank computes while it holds the keys/values
#      of rank src: one triple per pair (a chunk of its own, a chunk of src's) that needs any work:
#      the query rows and the key rows, each a *local* slice (which rows of a rank's [B, h, S/n, d]
#      tensors hold that chunk), and a flag, true only for a diagonal block.
#   4. ring_attention_forward (8.5 pts): Exact causal attention of this rank's queries over the
#      *whole* sequence, with every rank holding only its own positions: queries, keys and values
#      [B, h, S/n, d] (this rank's rows, in the layout's order) -> the pair (output [B, h, S/n, d],
#      log-sum-exp [B, h, S/n]) of its query rows, as one device would compute them (the backward
#      pass needs both).
#   5. RingAttention.backward (11 pts): Ring attention as an autograd function, so that the ring
#      also runs backward.
#   6. zigzag_layout (4.5 pts): Megatron/NeMo's load-balanced split of the positions over the
#      ranks: a layout (the given class, named "zigzag") of 2n equal chunks, two a rank, under
#      which every rank's queries do the same causal work; each rank lists its earlier chunk first.
#   7. predict_forward_exposed_ms (2 pts): Your prediction, before the run: how many milliseconds
#      of the forward pass's key/value exchange *your* ring forward (task 4) leaves exposed (no
#      attention running beside it), on the zig-zag split of n ranks, for queries, keys and values
#      of [batch, heads, seq_len / n, head_dim] in dtype, on the calibrated simulated link lk (the
#      given link class of workbook.link: its fields hold alpha, the bandwidth 1/beta and the
#      compute rate a block's attention runs at).
"""Lab `cp_ring`: context parallelism, ring attention with its K/V traffic hidden.

Lesson 11 (``lessons/11_cp_ring.py``) explains every idea this lab needs. Each of n ranks holds
the queries, keys and values of its own positions only, ``[B, h, S/n, d]``; you build exact
causal attention over the whole sequence by passing the key/value blocks round a ring of ranks
(Liu et al. 2023, arXiv 2310.01889), each transfer travelling behind the attention of a ring step
(NeMo's CP communication overlap), and the split of the sequence that keeps every rank equally
busy under the causal mask (Megatron/NeMo). Before you run it, you predict how much of the
forward pass's exchange stays exposed on the simulated link.

The tasks are listed below, in order. The given pieces (the layout, one ring hop, one block's
attention forward and backward, the single-device reference) are in
``workbook/context_parallel/context_parallel.py``: read its docstring first.

Check yourself: ``workbook run cp_ring`` (the grader's checks, then the lab's figures); grade:
``workbook grade --lab cp_ring``; hints, one rung at a time: ``workbook hint cp_ring TASK``.
"""
from __future__ import annotations

import torch

from workbook.context_parallel import CAUSAL, FULL, SKIP, Layout, Partial, block_backward, \
    block_forward, cp_rank, finish, start_ring_exchange


# --------------------------------------------------------------------------- online softmax
def merge_partials(a: Partial, b: Partial) -> Partial:
    """The online-softmax state of the same query rows over the keys of a and of b together
    (two disjoint key sets), exact: what one block would give over all those keys.

    Contract: two partial states of the same rows in (the given named tuple), one out, with the
    same shapes ([B, h, rows, d] and [B, h, rows]); symmetric in its arguments; finite for large
    scores. Lesson 11, section "The online softmax"."""
    raise NotImplementedError("not implemented yet: cp_ring.merge_partials")


# --------------------------------------------------------------------------- the mask, per block
def block_mask(q_chunk: int, kv_chunk: int) -> str:
    """What causal attention needs of the queries of one chunk over the keys of another (chunk
    ids in sequence order): one of the three mask constants the lab imports from the given
    module (skip, causal, full). Lesson 11, section "The causal mask, one block pair at a
    time"."""
    raise NotImplementedError("not implemented yet: cp_ring.block_mask")


def block_pairs(layout: Layout, rank: int, src: int) -> list[tuple[slice, slice, bool]]:
    """The attention blocks a rank computes while it holds the keys/values of rank src: one
    triple per pair (a chunk of its own, a chunk of src's) that needs any work: the query rows
    and the key rows, each a *local* slice (which rows of a rank's [B, h, S/n, d] tensors hold
    that chunk), and a flag, true only for a diagonal block. No pair twice, none that needs
    nothing. Lesson 11, section "The causal mask, one block pair at a time"."""
    raise NotImplementedError("not implemented yet: cp_ring.block_pairs")


# --------------------------------------------------------------------------- the ring, forward
def ring_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout):
    """Exact causal attention of this rank's queries over the *whole* sequence, with every rank
    holding only its own positions: queries, keys and values [B, h, S/n, d] (this rank's rows,
    in the layout's order) -> the pair (output [B, h, S/n, d], log-sum-exp [B, h, S/n]) of its
    query rows, as one device would compute them (the backward pass needs both).

    Contract: keys and values reach the other ranks only through the given one-hop ring exchange
    of the family module, both in *one* buffer a hop ([2, B, h, S/n, d]), n - 1 hops in all,
    no collective; every block's attention is computed by the given block forward (the grader
    times it) on the blocks task 3 lists, the results merged with task 1. Overlap: each hop is
    posted before the attention of the step it travels behind and waited for only after it.
    Works on any layout (contiguous, zig-zag) and any n, including 1. Lesson 11, sections
    "What a rank needs, and two ways to give it" and "What travels, and when it hides"."""
    raise NotImplementedError("not implemented yet: cp_ring.ring_attention_forward")


# --------------------------------------------------------------------------- the ring, backward
class RingAttention(torch.autograd.Function):
    """Ring attention as an autograd function, so that the ring also runs backward.

    Forward: the output of the ring forward above, keeping the queries, keys, values, output
    and log-sum-exp (and the layout) for backward. Backward: from the output's gradient, the
    gradients of this rank's queries, keys and values, each [B, h, S/n, d] and equal to the
    single-device gradients at its positions, and none for the layout. Lesson 11, section "What
    travels, and when it hides" (Backward)."""

    @staticmethod
    def forward(ctx, q, k, v, layout: Layout):
        """Run the ring forward; keep what backward recomputes the blocks from."""
        out, lse = ring_attention_forward(q, k, v, layout)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout = layout
        return out

    @staticmethod
    def backward(ctx, dout):
        """The ring again, every block's gradients recomputed from the saved state by the given
        block backward (the grader times it), never from stored probabilities.

        Contract: the query gradient of this rank's rows is local; the key/value gradient of a
        block is a sum over the queries of *every* rank that reads it and must end on the rank
        that owns the block. Traffic: n - 1 key/value hops and n hops of key/value gradients,
        each one buffer [2, B, h, S/n, d] through the given ring exchange, no collective.
        Overlap: a key/value hop posted before the step's compute; a gradient hop posted right
        after it and waited for only after the next step's compute (only the very last one has
        nothing left to hide behind). Lesson 11, "What travels, and when it hides"."""
        q, k, v, out, lse = ctx.saved_tensors
        dout = dout.contiguous()
        delta = (dout * out).sum(dim=-1)                           # [B, h, S/n], one per query row
        raise NotImplementedError("not implemented yet: cp_ring.RingAttention.backward")


def ring_attention(q, k, v, layout: Layout) -> torch.Tensor:
    """Ring attention on this rank's positions, [B, h, S/n, d] in and out, differentiable: the
    ring forward with the ring backward behind it (what the attention sublayer and the grader
    call)."""
    return RingAttention.apply(q, k, v, layout)


# --------------------------------------------------------------------------- the zig-zag split
def zigzag_layout(seq_len: int, n: int) -> Layout:
    """Megatron/NeMo's load-balanced split of the positions over the ranks: a layout (the
    given class, named "zigzag") of 2n equal chunks, two a rank, under which every rank's
    queries do the same causal work; each rank lists its earlier chunk first. Raises a
    ValueError when the positions do not cut into such chunks. Lesson 11, section "The causal
    mask, one block pair at a time"."""
    raise NotImplementedError("not implemented yet: cp_ring.zigzag_layout")


# --------------------------------------------------------------------------- the prediction
def predict_forward_exposed_ms(lk, n: int, seq_len: int, batch: int, heads: int, head_dim: int,
                               dtype: torch.dtype) -> float:
    """Your prediction, before the run: how many milliseconds of the forward pass's key/value
    exchange *your* ring forward (task 4) leaves exposed (no attention running beside it), on
    the zig-zag split of n ranks, for queries, keys and values of [batch, heads, seq_len / n,
    head_dim] in dtype, on the calibrated simulated link lk (the given link class of
    workbook.link: its fields hold alpha, the bandwidth 1/beta and the compute rate a block's
    attention runs at). A float in ms, from the alpha-beta model and FLOP counts only: no ranks,
    no timing.

    Lesson 11, section "Predict your exposed exchange" gives the model (which blocks a step
    computes, what one hop carries, what a step hides); the grader compares with the package's
    model on three settings, and the self-check's figures (``workbook run cp_ring``) print your
    prediction beside the model and the measured trace."""
    raise NotImplementedError("not implemented yet: cp_ring.predict_forward_exposed_ms")


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
