# Generated from solutions/ring_allreduce.py by `workbook assign`: this is your file to edit.
# Replace each `raise NotImplementedError` with your code, then grade it with
#     workbook grade --lab ring_allreduce
"""Lab 2 — ring all-reduce: reduce-scatter around a ring, then all-gather around it.

The ranks stand in a circle; rank r only ever sends to its right neighbour r+1 and receives
from its left neighbour r-1 (mod n). The K elements of the tensor are cut into n chunks with
``torch.tensor_split`` (the first K % n chunks are one element longer), and the algorithm
moves one chunk per rank per step (Patarasuk & Yuan, "Bandwidth optimal all-reduce
algorithms for clusters of workstations", JPDC 2009):

1. reduce-scatter, n-1 steps. In step s rank r sends chunk (r - s) and receives chunk
   (r - s - 1), which it combines into its own copy. Each chunk travels n-1 hops, picking up
   one rank's contribution per hop, so afterwards rank r holds chunk (r + 1) fully reduced.
2. all-gather, n-1 steps. In step s rank r sends chunk (r + 1 - s) and receives chunk (r - s),
   overwriting its copy: the reduced chunks travel once more around the ring.

Per rank: 2(n-1) messages of about K/n elements, so 2(n-1)/n * S bytes out and the same in
for a tensor of S bytes, whatever n is. That is the lower bound for all-reduce, which is why
nccl-tests reports all-reduce "bus bandwidth" as busbw = (S / t) * 2(n-1)/n: a perfect ring
runs every link at busbw.

The alpha-beta cost model (alpha = seconds per message, beta = bytes per second of a link,
every rank sends and receives at the same time) gives for an all-reduce of S bytes:

=====================================  ==================================
naive: reduce at a root, broadcast it  2 (n-1) (alpha + S / beta)
binomial tree reduce + tree broadcast  2 ceil(log2 n) (alpha + S / beta)
ring (this lab)                        2 (n-1) (alpha + S / (n beta))
=====================================  ==================================

The ring pays the most latency terms and the fewest bytes: it wins for large S, the tree for
small S (``crossover_bytes``). NCCL picks between them by size for this reason.

Run it: ``torchrun --nproc_per_node=4 solutions/ring_allreduce.py`` or
``python solutions/ring_allreduce.py --nproc 3 [--link dgx-h100]``.
"""
from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

SUM, MAX, MIN = dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN


# --------------------------------------------------------------------------- helpers (given)
def combine(acc: torch.Tensor, other: torch.Tensor, op=SUM) -> torch.Tensor:
    """``acc <- acc (op) other`` elementwise, in place."""
    if op == SUM:
        return acc.add_(other)
    if op == MAX:
        return torch.maximum(acc, other, out=acc)
    if op == MIN:
        return torch.minimum(acc, other, out=acc)
    raise ValueError(f"unsupported reduce op {op}: use dist.ReduceOp.SUM, MAX or MIN")


def neighbours() -> tuple[int, int]:
    """``(left, right)``: the rank this one receives from and the rank it sends to."""
    rank, n = dist.get_rank(), dist.get_world_size()
    return (rank - 1) % n, (rank + 1) % n


# --------------------------------------------------------------------------- the two phases
def ring_reduce_scatter(chunks, op=SUM) -> int:
    """Phase 1 on ``chunks`` (n views of the tensor, changed in place); return the index of
    the chunk this rank now holds fully reduced, (rank + 1) % n.

    Use ``dist.isend`` / ``dist.irecv`` (the grader counts them): n-1 sends per rank.
    Receive into one preallocated scratch buffer (sized like ``chunks[0]``, the largest),
    then combine it into the chunk it belongs to."""
    rank, n = dist.get_rank(), dist.get_world_size()
    left, right = neighbours()
    # TODO: step s sends chunk (rank - s) % n, receives and combines (rank - s - 1) % n
    raise NotImplementedError("not implemented yet: ring_allreduce.ring_reduce_scatter")


def ring_all_gather(chunks) -> None:
    """Phase 2: starting from chunk (rank + 1) % n, pass the finished chunks around the ring
    so that every rank ends with all n. n-1 isends per rank; receive straight into the
    chunk views (the tensor itself), no scratch buffer needed."""
    rank, n = dist.get_rank(), dist.get_world_size()
    left, right = neighbours()
    # TODO: step s sends chunk (rank + 1 - s) % n and receives chunk (rank - s) % n
    raise NotImplementedError("not implemented yet: ring_allreduce.ring_all_gather")


def ring_all_reduce(tensor: torch.Tensor, op=SUM) -> torch.Tensor:
    """All-reduce ``tensor`` in place (any shape, any number of elements); return it."""
    n = dist.get_world_size()
    # TODO: flat contiguous view, tensor_split into n chunks, phase 1, phase 2
    raise NotImplementedError("not implemented yet: ring_allreduce.ring_all_reduce")
    return tensor


# --------------------------------------------------------------------------- the cost model
def naive_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """Seconds for reduce-to-root then broadcast-from-root, the root handling one message at
    a time: 2(n-1) messages of the whole tensor."""
    raise NotImplementedError("not implemented yet: ring_allreduce.naive_time")


def tree_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """Seconds for a binomial tree reduce plus tree broadcast: 2 ceil(log2 n) rounds of the
    whole tensor."""
    raise NotImplementedError("not implemented yet: ring_allreduce.tree_time")


def ring_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """Seconds for the ring: 2(n-1) steps, each moving one chunk of size_bytes / n."""
    raise NotImplementedError("not implemented yet: ring_allreduce.ring_time")


def crossover_bytes(n: int, alpha: float, beta: float) -> float:
    """The size above which the ring beats the tree (0: always; inf: never)."""
    # TODO: set ring_time == tree_time and solve for the size
    raise NotImplementedError("not implemented yet: ring_allreduce.crossover_bytes")


def bus_bandwidth(size_bytes: float, seconds: float, n: int) -> float:
    """nccl-tests' all-reduce bus bandwidth (bytes/s): (S / t) * 2(n-1)/n."""
    return size_bytes / seconds * 2 * (n - 1) / n if n > 1 else 0.0


# --------------------------------------------------------------------------- self-check
def _timed(fn, tensor, iters=5):
    fn(tensor.clone())                                     # warm-up (and connection set-up)
    best = math.inf
    for _ in range(iters):
        t = tensor.clone()
        dist.barrier()
        start = time.perf_counter()
        fn(t)
        best = min(best, time.perf_counter() - start)
    return best


def self_check(sizes=(1, 10, 1003)) -> dict:
    """On every rank: the ring against the built-in (sum, max, min; awkward sizes), then one
    timing of each at 1 MB. With a simulated link, the model's prediction is added."""
    rank, n = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
        else torch.device("cpu")
    status = "ok"
    try:
        for k in sizes:
            for op in (SUM, MAX, MIN):
                g = torch.Generator().manual_seed(1000 * rank + k)
                x = torch.randint(-20, 21, (k,), generator=g).float().to(device)
                expected = x.clone()
                dist.all_reduce(expected, op=op)
                if not torch.equal(ring_all_reduce(x, op), expected):
                    status = f"differs from the built-in ({op}, {k} elements)"
    except NotImplementedError as exc:
        return {"rank": rank, "world_size": n, "status": str(exc)}
    size = 1 << 20
    x = torch.ones(size // 4, device=device)
    ring_s, builtin_s = _timed(ring_all_reduce, x), _timed(dist.all_reduce, x)
    out = {"rank": rank, "world_size": n, "status": status, "size_bytes": size,
           "ring_us": ring_s * 1e6, "builtin_us": builtin_s * 1e6}
    from workbook import link                             # None unless --link was given
    sim = link.current_link()
    if sim is not None and n > 1:
        out["link"] = sim.label
        out["model_ring_us"] = ring_time(size, n, sim.latency_s, sim.bandwidth_Bps) * 1e6
        out["model_tree_us"] = tree_time(size, n, sim.latency_s, sim.bandwidth_Bps) * 1e6
    return out


def describe(results: list[dict]) -> str:
    first, n = results[0], len(results)
    states = {r["status"] for r in results}
    summary = f"{states.pop()} on every rank" if len(states) == 1 else "; ".join(
        f"rank {r['rank']}: {r['status']}" for r in results)
    lines = [f"ring all-reduce lab, {n} rank(s): {summary}"]
    if "ring_us" in first:
        slowest = {k: max(r[k] for r in results) for k in ("ring_us", "builtin_us")}
        lines.append(f"{'1 MB all-reduce':<22}{'time (us)':>12}{'busbw (GB/s)':>14}")
        for name, key in (("ring (yours)", "ring_us"), ("built-in", "builtin_us")):
            bw = bus_bandwidth(first["size_bytes"], slowest[key] / 1e6, n) / 1e9
            lines.append(f"{name:<22}{slowest[key]:>12.0f}{bw:>14.2f}")
        if "model_ring_us" in first:
            lines.append(f"{'model: ring':<22}{first['model_ring_us']:>12.0f}")
            lines.append(f"{'model: tree':<22}{first['model_tree_us']:>12.0f}")
            lines.append(first["link"])
    return "\n".join(lines)


if __name__ == "__main__":
    from workbook.launch import main
    main(self_check, describe=describe)
