"""The given pieces of context parallelism (ring attention), for lab 11 (``labs/cp_ring.py``).

Context parallelism (CP) cuts every activation along the *sequence*: with n ranks, rank r holds
the queries, keys and values of its own positions only, ``[B, h, S/n, d]``, on every layer (the
MLP and the norms are per position and need nothing from other ranks). Attention is the one
place where a position needs the others: query i reads every key j <= i. Ring attention (Liu,
Zaharia & Abbeel 2023, arXiv 2310.01889) passes the K/V blocks around a ring of ranks: at step
t = 0..n-1 rank r holds the block of rank ``(r - t) mod n``, attends its queries to it, and
hands it on to rank r + 1 while it receives the next one from rank r - 1. No rank ever holds the
whole sequence's K/V, and the transfer of the next block travels *during* the attention on the
current one: this is NeMo's CP communication overlap, the all-gather of K/V replaced by n - 1
P2P ring exchanges (Megatron-LM / Transformer Engine ``context_parallel_size``).

The online softmax
------------------
Softmax needs the whole row, but the keys come one block at a time. Keep, per query row, a
*partial* over the keys seen so far (Milakov & Gimelshein 2018, arXiv 1805.02867; FlashAttention,
Dao et al. 2022, arXiv 2205.14135)::

    s_j = q . k_j / sqrt(d)          (the scores of the keys seen)
    m   = max_j s_j                  (running max: keeps exp() from overflowing)
    l   = sum_j exp(s_j - m)         (running sum)
    acc = sum_j exp(s_j - m) v_j     (running *unnormalised* output)

so that at the end ``out = acc / l`` and ``lse = m + log l = log sum_j exp(s_j)``. Two partials
over disjoint key sets merge exactly: how is the lab's first task (lesson 11, "The online
softmax").

The backward pass (FlashAttention's recomputation)
--------------------------------------------------
Per block of keys, with the *final* ``lse`` and ``out`` of the forward pass saved::

    P  = exp(S - lse)            the probabilities of this block (masked entries 0)
    dV = P^T dO                  dP = dO V^T
    D  = rowsum(dO * O)          (one number per query row, the same for every block)
    dS = P * (dP - D)            dQ = dS K / sqrt(d)        dK = dS^T Q / sqrt(d)

so a block's gradients need only its own K, V and the query rows' saved statistics.

Load balance
------------
Under the causal mask, the contiguous split (rank r holds chunk r) is unbalanced: the last rank's
queries see the whole sequence, the first rank's only their own chunk, and every ring step waits
for the slowest rank. Megatron/NeMo's *load-balanced* ("zig-zag") split cuts the sequence into
2n chunks, two a rank, one early and one late, so that every rank does the same causal work (the
lab's zig-zag task; lesson 11, "The causal mask, one block pair at a time"). A ``Layout`` says
which chunks each rank holds; ``causal_work`` counts the unmasked score entries of each rank's
queries.

What is here: ``Layout`` (and ``contiguous_layout``), the ring neighbours and one ring hop
(``start_ring_exchange``), one block's attention forward (``block_forward`` -> ``Partial``) and
backward (``block_backward``), ``finish`` (partials -> out, lse), the single-device reference
(``reference_attention``, built on ``workbook.model.ops.causal_attention``) and the attention
sublayer on this rank's positions (``cp_attention``, RoPE at *global* positions) with the
gradient sum CP needs (``sync_cp_grads``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist

from workbook.model import ops
from workbook.model.reference import rope_tables

SKIP, CAUSAL, FULL = "skip", "causal", "full"     # what a (query chunk, key chunk) pair needs


# --------------------------------------------------------------------------- ranks and the ring
def cp_rank() -> int:
    """This rank's index r in the context-parallel group (0 outside a launched rank)."""
    return dist.get_rank() if dist.is_initialized() else 0


def cp_world_size() -> int:
    """The number n of context-parallel ranks (1 outside a launched rank)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def ring_neighbours(rank: int | None = None, n: int | None = None) -> tuple[int, int]:
    """``(next, previous)`` = ``((r + 1) mod n, (r - 1) mod n)``: where a block goes, where one
    comes from. Step t of the ring holds the block of rank ``(r - t) mod n``."""
    r = cp_rank() if rank is None else rank
    n = cp_world_size() if n is None else n
    return (r + 1) % n, (r - 1) % n


class RingTransfer:
    """One ring hop in flight: this rank's tensor on its way to the next rank, the previous
    rank's tensor on its way here. ``wait()`` returns the received tensor (once it is there)."""

    def __init__(self, works: list, sent: torch.Tensor, received: torch.Tensor):
        self._works, self._sent, self._received = works, sent, received   # keep both alive

    def wait(self) -> torch.Tensor:
        for work in self._works:
            work.wait()
        self._works = []
        return self._received


def start_ring_exchange(send: torch.Tensor) -> RingTransfer:
    """Post one ring hop and return at once: ``isend(send -> r + 1)`` and ``irecv(<- r - 1)``
    into a new buffer shaped like ``send``, in one ``dist.batch_isend_irecv``. On the link this
    is one ``send`` and one ``recv`` of ``send.numel() * send.element_size()`` bytes. The sent
    tensor must not change until ``wait()``; on one rank the hop returns ``send`` itself."""
    if cp_world_size() == 1:
        return RingTransfer([], send, send)
    nxt, prev = ring_neighbours()
    send = send.contiguous()
    recv = torch.empty_like(send)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt),
                                    dist.P2POp(dist.irecv, recv, prev)])
    return RingTransfer(works, send, recv)


# --------------------------------------------------------------------------- the layout
@dataclass(frozen=True)
class Layout:
    """Which positions each rank holds. The sequence of ``seq_len`` positions is cut into
    ``n_chunks`` equal chunks (chunk c = positions ``c*L .. (c+1)*L - 1``, L = ``chunk_len``);
    rank r holds ``chunks[r]`` (chunk ids, in the order its local rows hold them). Every rank
    holds the same number of chunks, so every rank's blocks are ``[B, h, S/n, d]``."""
    seq_len: int
    chunks: tuple[tuple[int, ...], ...]
    name: str = ""

    def __post_init__(self):
        chunks = tuple(tuple(int(c) for c in mine) for mine in self.chunks)
        object.__setattr__(self, "chunks", chunks)
        every = sorted(c for mine in chunks for c in mine)
        if not chunks or every != list(range(len(every))):
            raise ValueError(f"layout {self.name or chunks}: the ranks' chunks must be 0..K-1, "
                             f"each held by one rank once; got {chunks}")
        if len({len(mine) for mine in chunks}) != 1:
            raise ValueError(f"layout {self.name or chunks}: every rank must hold the same number "
                             f"of chunks; got {chunks}")
        if self.seq_len % len(every):
            raise ValueError(f"sequence length {self.seq_len} does not divide into {len(every)} "
                             f"equal chunks ({len(chunks)} ranks x {len(chunks[0])} chunks each)")

    @property
    def n(self) -> int:
        """Ranks."""
        return len(self.chunks)

    @property
    def n_chunks(self) -> int:
        return self.n * len(self.chunks[0])

    @property
    def chunk_len(self) -> int:
        """L = S / n_chunks positions a chunk."""
        return self.seq_len // self.n_chunks

    @property
    def local_len(self) -> int:
        """S / n positions a rank."""
        return self.seq_len // self.n

    def rows(self, j: int) -> slice:
        """The local rows of a rank's j-th chunk: ``j*L .. (j+1)*L``."""
        return slice(j * self.chunk_len, (j + 1) * self.chunk_len)

    def positions(self, rank: int) -> torch.Tensor:
        """The global positions rank ``rank`` holds, in local row order (int64 ``[S/n]``)."""
        L = self.chunk_len
        return torch.cat([torch.arange(c * L, (c + 1) * L) for c in self.chunks[rank]])

    def shard(self, x: torch.Tensor, rank: int, dim: int = 1) -> torch.Tensor:
        """Rank ``rank``'s positions of a whole-sequence tensor (sequence along ``dim``)."""
        return x.index_select(dim, self.positions(rank).to(x.device)).contiguous()

    def unshard(self, pieces: list, dim: int = 1) -> torch.Tensor:
        """Every rank's piece (``pieces[r]``) put back at its positions: the whole sequence."""
        shape = list(pieces[0].shape)
        shape[dim] = self.seq_len
        full = pieces[0].new_empty(shape)
        for r, piece in enumerate(pieces):
            full.index_copy_(dim, self.positions(r).to(full.device), piece)
        return full

    def causal_work(self) -> list[int]:
        """Per rank, the unmasked score entries of its queries over the whole sequence: query
        at position p sees keys 0..p, so rank r's work is ``sum over its positions p of
        (p + 1)``. The ring runs at the pace of the rank with the most."""
        return [int((self.positions(r) + 1).sum()) for r in range(self.n)]


def contiguous_layout(seq_len: int, n: int) -> Layout:
    """The plain split: n chunks, rank r holds chunk r (positions ``r*S/n .. (r+1)*S/n``)."""
    return Layout(seq_len, tuple((r,) for r in range(n)), "contiguous")


# --------------------------------------------------------------------------- one block
class Partial(NamedTuple):
    """The online-softmax state of some query rows over the keys seen so far:
    ``acc [B, h, c, d]`` = sum_j exp(s_j - m) v_j, ``m [B, h, c]`` = max_j s_j,
    ``l [B, h, c]`` = sum_j exp(s_j - m)."""
    acc: torch.Tensor
    m: torch.Tensor
    l: torch.Tensor       # noqa: E741 - the papers' name


def _scores(q: torch.Tensor, k: torch.Tensor, causal: bool) -> torch.Tensor:
    """``q k^T / sqrt(d)`` ``[B, h, cq, ck]``; ``causal``: a diagonal block (the same positions
    on both sides), where key j > query i is masked with -inf."""
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        future = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(future, float("-inf"))
    return s


def block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> Partial:
    """One block's partial: queries ``q [B, h, cq, d]`` over keys/values ``k, v [B, h, ck, d]``
    (``causal``: the diagonal block, see ``_scores``). Every query row sees at least one key."""
    s = _scores(q, k, causal)                                    # [B, h, cq, ck]
    m = s.amax(dim=-1)                                           # [B, h, cq]
    p = torch.exp(s - m.unsqueeze(-1))                           # masked entries: exp(-inf) = 0
    return Partial(p @ v, m, p.sum(dim=-1))                      # [B,h,cq,d], [B,h,cq], [B,h,cq]


def finish(partials: list[Partial]) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention output and log-sum-exp of complete partials (every key seen), joined in
    the order given along the rows: ``out = acc / l`` ``[B, h, S/n, d]``, ``lse = m + log l``
    ``[B, h, S/n]``."""
    out = torch.cat([p.acc / p.l.unsqueeze(-1) for p in partials], dim=2)
    lse = torch.cat([p.m + torch.log(p.l) for p in partials], dim=2)
    return out, lse


def block_backward(q, k, v, out, lse, dout, delta, causal: bool):
    """One block's gradients from the saved statistics (module docstring): query rows ``q,
    out, dout [B, h, cq, d]``, ``lse, delta [B, h, cq]`` (``delta = rowsum(dout * out)``),
    keys/values ``k, v [B, h, ck, d]``. Returns ``(dq [B,h,cq,d], dk, dv [B,h,ck,d])``: this
    block's share of each (the caller adds up the shares of every block)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    p = torch.exp(_scores(q, k, causal) - lse.unsqueeze(-1))     # [B, h, cq, ck]
    dv = p.transpose(-2, -1) @ dout                              # [B, h, ck, d]
    dp = dout @ v.transpose(-2, -1)                              # [B, h, cq, ck]
    ds = p * (dp - delta.unsqueeze(-1))
    return (ds @ k) * scale, (ds.transpose(-2, -1) @ q) * scale, dv


# --------------------------------------------------------------------------- the reference
def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Single-device causal attention on the whole sequence, ``[B, h, S, d] -> [B, h, S, d]``:
    the model's own ``ops.causal_attention`` (heads merged and split again around it)."""
    heads = q.shape[1]
    out = ops.causal_attention(ops.merge_heads(q), ops.merge_heads(k), ops.merge_heads(v), heads)
    return ops.split_heads(out, heads)


def reference_lse(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``log sum_{j <= i} exp(s_ij)`` of every query row of the whole sequence: ``[B, h, S]``."""
    return torch.logsumexp(_scores(q, k, causal=True), dim=-1)


# --------------------------------------------------------------------------- the sublayer
def cp_attention(attn, x: torch.Tensor, layout: Layout, attention) -> torch.Tensor:
    """The attention sublayer on this rank's positions, ``[B, S/n, H] -> [B, S/n, H]``.

    ``attn``: a reference ``workbook.model.Attention`` (its weights, replicated on every rank);
    ``attention(q, k, v, layout)``: ring attention on ``[B, h, S/n, d]`` (the lab's). The
    projections are per position; RoPE (llama) turns q and k by their *global* positions
    (``layout.positions(r)``), or the scores would depend on where a chunk landed. Each rank's
    parameter gradients cover its own positions: add them up with ``sync_cp_grads``."""
    cfg = attn.cfg
    q, k, v = (ops.split_heads(w(x), cfg.heads) for w in (attn.wq, attn.wk, attn.wv))
    rope = rope_tables(cfg, x, layout.positions(cp_rank()).to(x.device))
    if rope is not None:
        q, k = ops.apply_rope(q, *rope), ops.apply_rope(k, *rope)
    return attn.wo(ops.merge_heads(attention(q, k, v, layout)))         # [B, S/n, H]


def sync_cp_grads(module) -> None:
    """After backward: sum every parameter gradient over the CP ranks (each rank's covers only
    its positions; the loss is the sum over all of them). Megatron folds this into the
    data-parallel gradient all-reduce."""
    if cp_world_size() == 1:
        return
    for p in module.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)


class BlockCallTimer:
    """Within the ``with``: every call of a lab's ``block_forward`` and ``block_backward`` (the
    given block compute, looked up in the lab module's namespace, so the lab's ring calls the
    timed ones) noted as ``(start_ns, end_ns)`` in the list the ``with`` yields. What the grader's
    structure check and ``workbook bench cp_ring`` read: was a block computed between a hop's
    post and its wait?"""

    NAMES = ("block_forward", "block_backward")

    def __init__(self, lab):
        self.lab, self.calls, self.saved = lab, [], {}

    def __enter__(self) -> list:
        import time
        self.calls = []
        for name in self.NAMES:
            fn = getattr(self.lab, name, None)
            if fn is None:
                continue
            self.saved[name] = fn

            def timed(*args, _fn=fn, **kwargs):
                start = time.perf_counter_ns()
                out = _fn(*args, **kwargs)
                self.calls.append((start, time.perf_counter_ns()))
                return out
            setattr(self.lab, name, timed)
        return self.calls

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(self.lab, name, fn)
        self.saved = {}
        return False
