"""Nodes and the network between them: what one operation costs when its ranks span machines.

A flat link gives every pair of ranks one bandwidth. A real cluster has two fabrics:

* **inside a node**, the GPUs share a switched fabric (DGX-H100: NVLink 4 through NVSwitch,
  900 GB/s bus bandwidth per GPU, about 2 us per operation);
* **between nodes**, each GPU has its own network card on a rail of its own (DGX-H100: eight
  ConnectX-7 at 400 Gb/s, 400 GB/s per node, so 50 GB/s per GPU, about 5 us per operation).

An 18x gap per GPU: that gap is why Megatron-LM and NeMo keep tensor parallelism inside a node
and put data and pipeline parallelism across nodes, and why the Domino paper's multi-node
figures (TP spanning two DGX-H100s, arXiv 2409.15241, section 5) differ from its single-node
ones. This module turns a group of ranks into a cost. Rank ``r`` lives on node
``r // ranks_per_node``, as torchrun numbers ranks. For a group of ``n`` ranks on ``k`` nodes,
at most ``m`` on one node, and a buffer of ``S`` bytes (nccl-tests' size: ``workbook.link``):

``k == 1``, all inside one node: the flat alpha-beta model on the intra-node fabric::

    t = a_in + S * bus_factor(op, n) / B_in

``m == 1``, one rank per node: the same on the network, at one card's bandwidth ``B_net``::

    t = a_net + S * bus_factor(op, n) / B_net

both (``k > 1`` and ``m > 1``): the hierarchical algorithm NCCL uses across nodes. An all-reduce
reduce-scatters inside each node, all-reduces each node's ``S/m`` piece across nodes (the ``m``
ranks of a node do so at once, each on its own card), then all-gathers inside the node::

    t = 2 * (a_in + (m-1)/m * S / B_in)  +  a_net + 2(k-1)/k * (S/m) / B_net

An all-gather is the inter-node all-gather of ``S/m`` then the intra-node one of ``S`` (a
reduce-scatter the same two stages in reverse); a broadcast or reduce crosses the network once
(``S / B_net``) and the node once (``S / B_in``); a barrier pays both latencies. An all-to-all
sends ``(m-1)/n`` of a rank's buffer over the node's fabric while ``(n-m)/n`` leaves through its
card, at the same time, so it costs the slower of the two. A send/receive costs the fabric its
two ranks share. A group with unequal numbers of ranks per node is costed at its fullest node.

An all-to-all with **uneven splits** (a mixture-of-experts dispatch: ``M[s][d]`` bytes from rank
``s`` to rank ``d``, the diagonal staying home) is bound by its busiest rank: every rank drives
its own port, so the exchange is over when the rank with the most bytes to send, or to receive,
is done. On each fabric ``f`` the group spans, over the pairs ``f`` carries (same node: the
node's fabric; different nodes: the network)::

    t_f = a_f + max_r max(sum_{d != r} M[r][d], sum_{s != r} M[s][r]) / B_f
    t   = max_f t_f                       (both fabrics at once, as above)

With even splits (``M[s][d] = S/n``) this is the formula above: ``(n-1)/n S / B`` on one fabric.

The module is pure arithmetic (no torch), so its costs are checked against hand-computed values
(``tests/package/test_topology.py``); ``workbook.link`` charges them to real gloo operations.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

NVLINK, NETWORK = "node", "network"          # the two fabrics an op can occupy


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' factor between algorithm bandwidth (size / time) and bus bandwidth."""
    if n <= 1:
        return 0.0
    if op in ("all_reduce",):
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "send", "recv"):
        return 1.0
    return 0.0                                           # barrier and anything size-free


def busiest_rank_bytes(matrix, carries=lambda src, dst: True) -> float:
    """``max_r max(bytes r sends, bytes r receives)`` over the pairs ``carries(src, dst)`` accepts
    (``matrix[s][d]``: bytes from group rank ``s`` to ``d``; what a rank keeps does not count)."""
    n, busiest = len(matrix), 0
    for r in range(n):
        sent = sum(matrix[r][d] for d in range(n) if d != r and carries(r, d))
        received = sum(matrix[s][r] for s in range(n) if s != r and carries(s, r))
        busiest = max(busiest, sent, received)
    return busiest


@dataclass(frozen=True)
class Fabric:
    """One fabric as a rank sees it: bus bandwidth (bytes/s) and latency per operation (s)."""
    bandwidth_Bps: float
    latency_s: float

    def time(self, op: str, size_bytes: float, n: int) -> float:
        """The flat alpha-beta cost of ``op`` on ``n`` ranks of this fabric."""
        return self.latency_s + size_bytes * bus_factor(op, n) / self.bandwidth_Bps

    def all_to_all_time(self, matrix) -> float:
        """An uneven all-to-all of ``matrix`` (bytes, sender by receiver) on this fabric alone."""
        if len(matrix) <= 1:
            return 0.0
        return self.latency_s + busiest_rank_bytes(matrix) / self.bandwidth_Bps


@dataclass(frozen=True)
class Topology:
    """Ranks in nodes of ``ranks_per_node``: ``node`` inside one, ``network`` between them."""
    ranks_per_node: int
    node: Fabric             # intra-node: NVLink / NVSwitch
    network: Fabric          # inter-node: one rank's network card

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def spread(self, ranks) -> tuple[int, int]:
        """``(k, m)``: how many nodes the group touches, and its most ranks on one node."""
        per_node = Counter(self.node_of(r) for r in ranks)
        return len(per_node), max(per_node.values(), default=0)

    def fabrics(self, op: str, ranks) -> tuple[str, ...]:
        """The fabrics ``op`` on ``ranks`` occupies (a hierarchical op: both, for its whole time)."""
        k, m = self.spread(ranks)
        if k <= 1:
            return (NVLINK,)
        return (NETWORK,) if m == 1 else (NVLINK, NETWORK)

    def time(self, op: str, size_bytes: float, ranks) -> float:
        """Modelled seconds of ``op`` over ``S = size_bytes`` on the group ``ranks`` (global)."""
        ranks = list(ranks)
        n, (k, m) = len(ranks), self.spread(ranks)
        if op in ("send", "recv"):
            return (self.node if k <= 1 else self.network).time(op, size_bytes, 2)
        if n <= 1:
            return 0.0
        if k == 1:
            return self.node.time(op, size_bytes, n)
        if m == 1:
            return self.network.time(op, size_bytes, n)
        inside, across = self.node, self.network
        if op == "all_to_all":                   # both parts at once: the slower one decides
            return max(inside.latency_s + size_bytes * (m - 1) / n / inside.bandwidth_Bps,
                       across.latency_s + size_bytes * (n - m) / n / across.bandwidth_Bps)
        if op == "all_reduce":                   # RS inside, AR of S/m across, AG inside
            return (2 * inside.time("reduce_scatter", size_bytes, m)
                    + across.time("all_reduce", size_bytes / m, k))
        if op in ("all_gather", "reduce_scatter", "gather", "scatter"):
            return inside.time(op, size_bytes, m) + across.time(op, size_bytes / m, k)
        if op in ("broadcast", "reduce"):        # across the network once, inside a node once
            return inside.time(op, size_bytes, m) + across.time(op, size_bytes, k)
        return inside.latency_s + across.latency_s            # barrier: both latencies

    def all_to_all_time(self, matrix, ranks) -> float:
        """An uneven all-to-all (module docstring): ``matrix[s][d]`` bytes from the ``s``-th to
        the ``d``-th of ``ranks`` (global ranks, group order), the slowest fabric deciding."""
        ranks = list(ranks)
        if len(ranks) <= 1:
            return 0.0
        same = [[self.node_of(a) == self.node_of(b) for b in ranks] for a in ranks]
        times = []
        for fabric in self.fabrics("all_to_all", ranks):
            on_node = fabric == NVLINK
            wire = self.node if on_node else self.network
            busiest = busiest_rank_bytes(matrix, lambda s, d: same[s][d] == on_node)
            times.append(wire.latency_s + busiest / wire.bandwidth_Bps)
        return max(times)
