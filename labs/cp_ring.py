# Generated from solutions/cp_ring.py by `workbook assign`: this is your file to edit.
# Replace each `raise NotImplementedError` with your code, then grade it with
#     workbook grade --lab cp_ring
#
# Your tasks (30 pts in all):
#   1. merge_partials (3 pts): The partial over the keys of `a` and of `b` together (disjoint key
#      sets, same query rows): with `m = max(m_a, m_b)`, rescale each side by `exp(m_side - m)` and
#      add.
#   2. block_mask (1.5 pts): What causal attention needs of chunk `q_chunk`'s queries over chunk
#      `kv_chunk`'s keys (chunks in sequence order): `SKIP` a later chunk (every key is in the
#      future), `CAUSAL` the same chunk (the lower triangle), `FULL` an earlier chunk (every key is
#      in the past).
#   3. block_pairs (1.5 pts): The blocks rank `rank` computes while it holds rank `src`'s K/V: one
#      `(query rows, key rows, causal)` per pair of a chunk of its own and a chunk of src's that
#      `block_mask` does not skip; rows are local (`layout.rows(j)` for the j-th chunk held).
#   4. ring_attention_forward (8.5 pts): Causal attention of this rank's queries over the whole
#      sequence: `q, k, v [B, h, S/n, d]` (this rank's positions, `layout`) ->
#      `(out [B, h, S/n, d], lse [B, h, S/n])`.
#   5. RingAttention.backward (11 pts): Ring attention as an autograd function:
#      `ring_attention_forward` forward; backward the ring again, recomputing each block from the
#      saved `(q, k, v, out, lse)`.
#   6. zigzag_layout (4.5 pts): Megatron's load-balanced split: 2n chunks, rank r holds chunks r
#      and 2n-1-r (in that order), so that every rank's queries do the same causal work.
"""Lab `cp_ring`: context parallelism, ring attention with its K/V traffic hidden.

Lesson 11 (``lessons/11_cp_ring.py``) explains it. Each of n ranks holds the queries, keys and
values of its positions only, ``[B, h, S/n, d]``; the K/V blocks travel around a ring of ranks
(Liu et al. 2023, arXiv 2310.01889), the transfer of the next block posted *before* the attention
on the current one, so that it travels behind that compute (NeMo's CP communication overlap). The
softmax is computed online, block by block (Milakov & Gimelshein 2018; FlashAttention, arXiv
2205.14135), and the causal mask decides per pair of chunks: a later chunk is skipped, the
diagonal masked, an earlier one fully visible. Last, the zig-zag split of Megatron/NeMo gives
every rank the same causal work. You write:

1. ``merge_partials``: the online-softmax merge of two partial results;
2. ``block_mask`` and ``block_pairs``: the mask decision per (query chunk, key chunk) pair;
3. ``ring_attention_forward``: n steps, the next K/V hop posted before each step's attention;
4. ``RingAttention.backward``: the same ring again, dK/dV riding along with K/V back home;
5. ``zigzag_layout``: rank r holds chunks r and 2n-1-r.

Given pieces: ``workbook/context_parallel.py``. Run: ``workbook run cp_ring``; grade:
``workbook grade --lab cp_ring``.
"""
from __future__ import annotations

import torch

from workbook.context_parallel import CAUSAL, FULL, SKIP, Layout, Partial, block_backward, \
    block_forward, cp_rank, finish, start_ring_exchange


# --------------------------------------------------------------------------- 1. online softmax
def merge_partials(a: Partial, b: Partial) -> Partial:
    """The partial over the keys of ``a`` and of ``b`` together (disjoint key sets, same query
    rows): with ``m = max(m_a, m_b)``, rescale each side by ``exp(m_side - m)`` and add.
    ``acc [B, h, c, d]``, ``m`` and ``l [B, h, c]``; the order of a and b does not matter."""
    # TODO: m = torch.maximum(a.m, b.m); each side's factor exp(side.m - m) multiplies its acc
    #       (unsqueeze(-1)) and its l; return Partial(acc, m, l)
    raise NotImplementedError("not implemented yet: cp_ring.merge_partials")


# --------------------------------------------------------------------------- 2. the mask, per block
def block_mask(q_chunk: int, kv_chunk: int) -> str:
    """What causal attention needs of chunk ``q_chunk``'s queries over chunk ``kv_chunk``'s keys
    (chunks in sequence order): ``SKIP`` a later chunk (every key is in the future), ``CAUSAL``
    the same chunk (the lower triangle), ``FULL`` an earlier chunk (every key is in the past)."""
    # TODO: compare the two chunk ids
    raise NotImplementedError("not implemented yet: cp_ring.block_mask")


def block_pairs(layout: Layout, rank: int, src: int) -> list[tuple[slice, slice, bool]]:
    """The blocks rank ``rank`` computes while it holds rank ``src``'s K/V: one
    ``(query rows, key rows, causal)`` per pair of a chunk of its own and a chunk of src's that
    ``block_mask`` does not skip; rows are local (``layout.rows(j)`` for the j-th chunk held)."""
    # TODO: for each (j, qc) in enumerate(layout.chunks[rank]) and (i, kc) in
    #       enumerate(layout.chunks[src]): block_mask(qc, kc); keep (layout.rows(j),
    #       layout.rows(i), mask == CAUSAL) unless SKIP
    raise NotImplementedError("not implemented yet: cp_ring.block_pairs")


# --------------------------------------------------------------------------- 3. the ring, forward
def ring_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout):
    """Causal attention of this rank's queries over the whole sequence: ``q, k, v [B, h, S/n, d]``
    (this rank's positions, ``layout``) -> ``(out [B, h, S/n, d], lse [B, h, S/n])``.

    K and V travel together, one buffer ``torch.stack([k, v])`` ``[2, B, h, S/n, d]`` a hop. At
    step t = 0..n-1 this rank holds the block of rank ``(r - t) mod n``: it *first* posts the hop
    of that block to the next rank (``start_ring_exchange``, not at the last step), then computes
    the step's ``block_pairs``, merging each into its query rows' running partial, and only then
    waits for the block the previous rank sent. n - 1 hops, each behind a step's attention."""
    # TODO: r = cp_rank(); kv = torch.stack([k, v]); a dict of running Partials keyed by
    #       q_rows.start; per step: post the hop (unless last), block_forward each pair
    #       (merge_partials into its rows' Partial), then wait; finish() the Partials in row order
    raise NotImplementedError("not implemented yet: cp_ring.ring_attention_forward")


# --------------------------------------------------------------------------- 4. the ring, backward
class RingAttention(torch.autograd.Function):
    """Ring attention as an autograd function: ``ring_attention_forward`` forward; backward
    the ring again, recomputing each block from the saved ``(q, k, v, out, lse)``."""

    @staticmethod
    def forward(ctx, q, k, v, layout: Layout):
        out, lse = ring_attention_forward(q, k, v, layout)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout = layout
        return out

    @staticmethod
    def backward(ctx, dout):
        """dQ of this rank's queries adds up locally, step by step. dK/dV of the block held at
        step t is a sum over *every* rank's queries: a buffer ``[2, B, h, S/n, d]`` rides the
        ring one step behind its K/V block, each rank adding its share (``block_backward``) to
        what the previous ranks added; after the last step one more hop brings each sum home.
        The next K/V hop is posted before the step's compute; the dK/dV hop right after it,
        waited for after the *next* step's compute. Hops: n - 1 of K/V, n of dK/dV."""
        q, k, v, out, lse = ctx.saved_tensors
        dout = dout.contiguous()
        delta = (dout * out).sum(dim=-1)                           # D = rowsum(dO * O) [B, h, S/n]
        # TODO: layout, r = ctx.layout, cp_rank(); kv = stack([k, v]); dq zeros; per step: post the
        #       K/V hop (unless last); zeros for this rank's share of src's dK/dV; block_backward
        #       each pair (dq rows +=, share[0]/[1] key rows +=); add what the previous rank sent
        #       (wait for its hop, from step 1 on); post the share's hop; wait for K/V; after the
        #       loop wait for the last dK/dV hop: it is yours. Return dq, dk, dv, None (the layout
        #       has no gradient)
        raise NotImplementedError("not implemented yet: cp_ring.RingAttention.backward")


def ring_attention(q, k, v, layout: Layout) -> torch.Tensor:
    """``[B, h, S/n, d]`` in and out, differentiable (what ``cp_attention`` calls)."""
    return RingAttention.apply(q, k, v, layout)


# --------------------------------------------------------------------------- 5. the zig-zag split
def zigzag_layout(seq_len: int, n: int) -> Layout:
    """Megatron's load-balanced split: 2n chunks, rank r holds chunks r and 2n-1-r (in that
    order), so that every rank's queries do the same causal work. ``Layout`` raises a
    ``ValueError`` when ``seq_len`` is not a multiple of 2n."""
    # TODO: Layout(seq_len, one (r, 2n - 1 - r) per rank, "zigzag")
    raise NotImplementedError("not implemented yet: cp_ring.zigzag_layout")


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
