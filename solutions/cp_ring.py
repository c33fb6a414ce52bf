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
    ### BEGIN SOLUTION
    ### hint 1: each side was summed with its own maximum; lesson 11, "The online softmax", derives
    ###     how two such summaries combine without overflow
    ### hint 2: take the larger of the two maxima per row; bring each side to it by one factor per
    ###     row (at most 1), applied to both its output accumulator and its sum; then add the sides
    ### hint 3: m = torch.maximum(a.m, b.m); each side's factor exp(side.m - m) multiplies its acc
    ###     (unsqueeze(-1)) and its l; return Partial(acc, m, l)
    m = torch.maximum(a.m, b.m)                                    # the new running max
    sa, sb = torch.exp(a.m - m), torch.exp(b.m - m)                # <= 1: rescale to the new max
    return Partial(a.acc * sa.unsqueeze(-1) + b.acc * sb.unsqueeze(-1), m, a.l * sa + b.l * sb)
    ### END SOLUTION


# --------------------------------------------------------------------------- the mask, per block
def block_mask(q_chunk: int, kv_chunk: int) -> str:
    """What causal attention needs of the queries of one chunk over the keys of another (chunk
    ids in sequence order): one of the three mask constants the lab imports from the given
    module (skip, causal, full). Lesson 11, section "The causal mask, one block pair at a
    time"."""
    ### BEGIN SOLUTION
    ### hint 1: lesson 11, "The causal mask, one block pair at a time": three kinds of block,
    ###     decided by where the key chunk lies relative to the query chunk
    ### hint 2: a key chunk after the query chunk is all future; the same chunk is the triangle;
    ###     an earlier chunk is all past
    ### hint 3: compare the two chunk ids: kv_chunk > q_chunk -> SKIP, == -> CAUSAL, else FULL
    if kv_chunk > q_chunk:
        return SKIP
    return CAUSAL if kv_chunk == q_chunk else FULL
    ### END SOLUTION


def block_pairs(layout: Layout, rank: int, src: int) -> list[tuple[slice, slice, bool]]:
    """The attention blocks a rank computes while it holds the keys/values of rank src: one
    triple per pair (a chunk of its own, a chunk of src's) that needs any work: the query rows
    and the key rows, each a *local* slice (which rows of a rank's [B, h, S/n, d] tensors hold
    that chunk), and a flag, true only for a diagonal block. No pair twice, none that needs
    nothing. Lesson 11, section "The causal mask, one block pair at a time"."""
    ### BEGIN SOLUTION
    ### hint 1: every pair of one of this rank's chunks (queries) and one of src's chunks (keys)
    ###     is a candidate block; the mask decision of task 2 says which ones count
    ### hint 2: loop over the rank's chunks with their position in its rows, and over src's
    ###     likewise; keep the pairs that are not skipped, with the local row slices of both
    ###     chunks and whether the pair is the diagonal
    ### hint 3: for each (j, qc) in enumerate(layout.chunks[rank]) and (i, kc) in
    ###     enumerate(layout.chunks[src]): block_mask(qc, kc); keep (layout.rows(j),
    ###     layout.rows(i), mask == CAUSAL) unless SKIP
    pairs = []
    for j, qc in enumerate(layout.chunks[rank]):
        for i, kc in enumerate(layout.chunks[src]):
            mask = block_mask(qc, kc)
            if mask != SKIP:
                pairs.append((layout.rows(j), layout.rows(i), mask == CAUSAL))
    return pairs
    ### END SOLUTION


### BEGIN CHALLENGE: ring attention, forward and backward, as one component
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
    ### BEGIN SOLUTION
    ### hint 1: lesson 11, "What a rank needs, and two ways to give it": n ring steps; at each,
    ###     this rank holds one rank's keys/values, attends its queries to them, and passes them on
    ### hint 2: stack keys and values into one buffer; at every step but the last, post the hop
    ###     of the block you hold first; then compute the step's blocks, merging each into the
    ###     running state of its query rows; then wait for the incoming block; at the end turn the
    ###     states, in row order, into the output and the log-sum-exp
    ### hint 3: r = cp_rank(); kv = torch.stack([k, v]); a dict of running Partials keyed by
    ###     q_rows.start; per step (src = (r - step) % n): post start_ring_exchange(kv) (unless
    ###     last), block_forward each block_pairs pair (merge_partials into its rows' Partial),
    ###     then kv = hop.wait(); finish() the Partials in row order
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
        ### BEGIN SOLUTION
        ### hint 1: lesson 11, "What travels, and when it hides" (Backward): the blocks go round
        ###     once more; a gradient buffer rides one step behind its block, each rank adding its
        ###     share, and one last hop brings each sum home
        ### hint 2: per step: post the next key/value hop (not at the last step); start a zero
        ###     buffer for your share of the held block's gradients and fill it, and the query
        ###     gradient, from each block's backward; add what the previous rank sent (wait for it
        ###     from the second step on); post the sum on to the next rank; wait for the keys and
        ###     values. After the loop, the last gradient hop received is your own block's
        ### hint 3: layout, r = ctx.layout, cp_rank(); kv = stack([k, v]); dq zeros; per step:
        ###     hop = start_ring_exchange(kv) (unless last); share = zeros_like(kv);
        ###     block_backward each block_pairs pair (dq[q_rows] +=, share[0]/[1][kv_rows] +=);
        ###     share += incoming.wait() from step 1 on; incoming = start_ring_exchange(share);
        ###     kv = hop.wait(); after the loop dkv = incoming.wait(); return dq, dkv[0], dkv[1],
        ###     None
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
    """Ring attention on this rank's positions, [B, h, S/n, d] in and out, differentiable: the
    ring forward with the ring backward behind it (what the attention sublayer and the grader
    call)."""
    return RingAttention.apply(q, k, v, layout)
### END CHALLENGE


# --------------------------------------------------------------------------- the zig-zag split
def zigzag_layout(seq_len: int, n: int) -> Layout:
    """Megatron/NeMo's load-balanced split of the positions over the ranks: a layout (the
    given class, named "zigzag") of 2n equal chunks, two a rank, under which every rank's
    queries do the same causal work; each rank lists its earlier chunk first. Raises a
    ValueError when the positions do not cut into such chunks. Lesson 11, section "The causal
    mask, one block pair at a time"."""
    ### BEGIN SOLUTION
    ### hint 1: lesson 11, "The causal mask, one block pair at a time": pair a chunk from the
    ###     front of the sequence with one from the back, so that light and heavy work add up
    ###     the same on every rank
    ### hint 2: cut into twice as many chunks as ranks; give rank r the r-th chunk from the front
    ###     and the r-th from the back; the given layout class checks the divisibility
    ### hint 3: Layout(seq_len, one (r, 2n - 1 - r) per rank, "zigzag")
    return Layout(seq_len, tuple((r, 2 * n - 1 - r) for r in range(n)), "zigzag")
    ### END SOLUTION


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
    ### BEGIN SOLUTION
    ### hint 1: lesson 11, "Predict your exposed exchange": per hop, the part of its transfer
    ###     that outlasts the attention of the step it travels behind; add up the hops
    ### hint 2: one hop's time is the latency plus its bytes over the bandwidth, the bytes being
    ###     keys and values of the rank's positions at the dtype's size; a step's compute is its
    ###     number of chunk-sized blocks (diagonal ones count whole) times one block's FLOPs over
    ###     the compute rate; the zig-zag split computes three blocks at the first step and two at
    ###     each later one; the last step sends nothing; a hop's send and receive travel at once
    ###     on the full-duplex link, so a hop costs one transfer, not two
    ### hint 3: L = S / 2n; hop_s = lk.latency_s + 2*B*h*(S/n)*d*dtype.itemsize / lk.bandwidth_Bps;
    ###     block_s = 4*B*h*L*L*d / lk.local_flops; sum over steps t < n - 1 of
    ###     max(0, hop_s - (3 if t == 0 else 2) * block_s), in ms
    itemsize = torch.empty((), dtype=dtype).element_size()
    chunk = seq_len // (2 * n)                                     # L: a chunk's positions
    hop_bytes = 2 * batch * heads * (seq_len // n) * head_dim * itemsize   # K and V, one buffer
    hop_s = lk.latency_s + hop_bytes / lk.bandwidth_Bps
    block_s = 4 * batch * heads * chunk * chunk * head_dim / lk.local_flops   # QK^T and PV
    exposed = sum(max(0.0, hop_s - (3 if t == 0 else 2) * block_s) for t in range(n - 1))
    return exposed * 1e3
    ### END SOLUTION


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
