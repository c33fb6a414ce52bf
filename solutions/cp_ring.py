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
    ### BEGIN SOLUTION hint: m = torch.maximum(a.m, b.m); each side's factor exp(side.m - m) multiplies its acc (unsqueeze(-1)) and its l; return Partial(acc, m, l)
    m = torch.maximum(a.m, b.m)                                    # the new running max
    sa, sb = torch.exp(a.m - m), torch.exp(b.m - m)                # <= 1: rescale to the new max
    return Partial(a.acc * sa.unsqueeze(-1) + b.acc * sb.unsqueeze(-1), m, a.l * sa + b.l * sb)
    ### END SOLUTION


# --------------------------------------------------------------------------- 2. the mask, per block
def block_mask(q_chunk: int, kv_chunk: int) -> str:
    """What causal attention needs of chunk ``q_chunk``'s queries over chunk ``kv_chunk``'s keys
    (chunks in sequence order): ``SKIP`` a later chunk (every key is in the future), ``CAUSAL``
    the same chunk (the lower triangle), ``FULL`` an earlier chunk (every key is in the past)."""
    ### BEGIN SOLUTION hint: compare the two chunk ids
    if kv_chunk > q_chunk:
        return SKIP
    return CAUSAL if kv_chunk == q_chunk else FULL
    ### END SOLUTION


def block_pairs(layout: Layout, rank: int, src: int) -> list[tuple[slice, slice, bool]]:
    """The blocks rank ``rank`` computes while it holds rank ``src``'s K/V: one
    ``(query rows, key rows, causal)`` per pair of a chunk of its own and a chunk of src's that
    ``block_mask`` does not skip; rows are local (``layout.rows(j)`` for the j-th chunk held)."""
    ### BEGIN SOLUTION hint: for each (j, qc) in enumerate(layout.chunks[rank]) and (i, kc) in enumerate(layout.chunks[src]): block_mask(qc, kc); keep (layout.rows(j), layout.rows(i), mask == CAUSAL) unless SKIP
    pairs = []
    for j, qc in enumerate(layout.chunks[rank]):
        for i, kc in enumerate(layout.chunks[src]):
            mask = block_mask(qc, kc)
            if mask != SKIP:
                pairs.append((layout.rows(j), layout.rows(i), mask == CAUSAL))
    return pairs
    ### END SOLUTION


# --------------------------------------------------------------------------- 3. the ring, forward
def ring_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout):
    """Causal attention of this rank's queries over the whole sequence: ``q, k, v [B, h, S/n, d]``
    (this rank's positions, ``layout``) -> ``(out [B, h, S/n, d], lse [B, h, S/n])``.

    K and V travel together, one buffer ``torch.stack([k, v])`` ``[2, B, h, S/n, d]`` a hop. At
    step t = 0..n-1 this rank holds the block of rank ``(r - t) mod n``: it *first* posts the hop
    of that block to the next rank (``start_ring_exchange``, not at the last step), then computes
    the step's ``block_pairs``, merging each into its query rows' running partial, and only then
    waits for the block the previous rank sent. n - 1 hops, each behind a step's attention."""
    ### BEGIN SOLUTION hint: r = cp_rank(); kv = torch.stack([k, v]); a dict of running Partials keyed by q_rows.start; per step: post the hop (unless last), block_forward each pair (merge_partials into its rows' Partial), then wait; finish() the Partials in row order
    r, kv = cp_rank(), torch.stack([k, v])                         # kv: [2, B, h, S/n, d]
    parts: dict[int, Partial] = {}
    for step in range(layout.n):
        src = (r - step) % layout.n                                # whose K/V we hold
        if step < layout.n - 1:
            hop = start_ring_exchange(kv)                          # in flight ...
        for q_rows, kv_rows, causal in block_pairs(layout, r, src):   # ... behind this attention
            k_, v_ = kv[0][:, :, kv_rows], kv[1][:, :, kv_rows]
            part = block_forward(q[:, :, q_rows], k_, v_, causal)
            key = q_rows.start
            parts[key] = part if key not in parts else merge_partials(parts[key], part)
        if step < layout.n - 1:
            kv = hop.wait()
    return finish([parts[key] for key in sorted(parts)])
    ### END SOLUTION


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
        ### BEGIN SOLUTION hint: layout, r = ctx.layout, cp_rank(); kv = stack([k, v]); dq zeros; per step: post the K/V hop (unless last); zeros for this rank's share of src's dK/dV; block_backward each pair (dq rows +=, share[0]/[1] key rows +=); add what the previous rank sent (wait for its hop, from step 1 on); post the share's hop; wait for K/V; after the loop wait for the last dK/dV hop: it is yours. Return dq, dk, dv, None (the layout has no gradient)
        layout, r = ctx.layout, cp_rank()
        kv = torch.stack([k, v])                                   # [2, B, h, S/n, d]
        dq, incoming = torch.zeros_like(q), None
        for step in range(layout.n):
            src = (r - step) % layout.n
            if step < layout.n - 1:
                hop = start_ring_exchange(kv)                      # next K/V, behind this step
            share = torch.zeros_like(kv)                           # our part of src's dK, dV
            for q_rows, kv_rows, causal in block_pairs(layout, r, src):
                k_, v_ = kv[0][:, :, kv_rows], kv[1][:, :, kv_rows]
                dq_, dk_, dv_ = block_backward(q[:, :, q_rows], k_, v_, out[:, :, q_rows],
                                               lse[:, :, q_rows], dout[:, :, q_rows],
                                               delta[:, :, q_rows], causal)
                dq[:, :, q_rows] += dq_
                share[0][:, :, kv_rows] += dk_
                share[1][:, :, kv_rows] += dv_
            if incoming is not None:
                share += incoming.wait()                           # the ranks before us
            incoming = start_ring_exchange(share)                  # on to the next rank
            if step < layout.n - 1:
                kv = hop.wait()
        dkv = incoming.wait()                                      # ours, every rank's share in
        return dq, dkv[0], dkv[1], None
        ### END SOLUTION


def ring_attention(q, k, v, layout: Layout) -> torch.Tensor:
    """``[B, h, S/n, d]`` in and out, differentiable (what ``cp_attention`` calls)."""
    return RingAttention.apply(q, k, v, layout)


# --------------------------------------------------------------------------- 5. the zig-zag split
def zigzag_layout(seq_len: int, n: int) -> Layout:
    """Megatron's load-balanced split: 2n chunks, rank r holds chunks r and 2n-1-r (in that
    order), so that every rank's queries do the same causal work. ``Layout`` raises a
    ``ValueError`` when ``seq_len`` is not a multiple of 2n."""
    ### BEGIN SOLUTION hint: Layout(seq_len, one (r, 2n - 1 - r) per rank, "zigzag")
    return Layout(seq_len, tuple((r, 2 * n - 1 - r) for r in range(n)), "zigzag")
    ### END SOLUTION


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
