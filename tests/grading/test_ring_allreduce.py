"""Autograder for lab 2, ``ring_allreduce``: the two phases, the whole ring, its messages, the model.

As in the collectives grader, each (world size, function) is one batched run on a warm rank
pool; the numeric test and the message-pattern test of ``ring_all_reduce`` read the same run.
"""
from __future__ import annotations

import math

import pytest
import torch

from workbook.grading.checks import RECVS, SENDS, assert_calls, assert_equal_on_rank, numbers_first
from workbook.grading.engine import on_ranks, world_sizes
from workbook.grading.model_checks import to_cpu

WORLD_SIZES = (1, 2, 3, 4)
DTYPES = (torch.float32, torch.float64, torch.int64)
SHAPES = ((1,), (2,), (5,), (10,), (1003,), (7, 3))     # none divisible by 4; 1, 2 < n
TIMEOUT_S = 60.0
OPS = ("sum", "max", "min")


# --------------------------------------------------------------------------- rank side
def _sample(shape, dtype, seed):
    """A rank's input, on the rank's device (``cuda:N`` on GPU ranks: NCCL takes no CPU tensor)."""
    from workbook.runtime import ranks
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-50, 51, shape, generator=g).to(ranks.device(), dtype)


def _run(what: str) -> list[dict]:
    import torch.distributed as dist
    from workbook.runtime.flight import RECORDER
    from workbook.grading.labs import load_lab
    lab = load_lab("ring_allreduce")
    rank, n = dist.get_rank(), dist.get_world_size()
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    out = []
    for dtype in DTYPES:
        tag = str(dtype).replace("torch.", "")
        for shape in SHAPES:
            x = _sample(shape, dtype, 1000 * rank + sum(shape))
            k = x.numel()
            for op_name, op in ops.items():
                full = x.clone()
                dist.all_reduce(full, op=op)
                label = f"{what}({op_name}) of {tag}{list(shape)}"
                RECORDER.reset()
                extra = {}
                if what == "ring_all_reduce":
                    got = lab.ring_all_reduce(x.clone(), op=op)
                    expected = full
                elif what == "ring_reduce_scatter":
                    chunks = torch.tensor_split(x.clone().view(-1), n)
                    owned = lab.ring_reduce_scatter(chunks, op=op)
                    extra["owned"] = owned
                    idx = (rank + 1) % n
                    got = chunks[idx].clone()
                    expected = torch.tensor_split(full.view(-1), n)[idx].clone()
                    label += f", chunk {idx}"
                else:                                   # ring_all_gather
                    if op_name != "sum":
                        continue
                    mine = torch.full((k,), -7, dtype=dtype, device=x.device)           # junk but the owned chunk
                    idx = (rank + 1) % n
                    torch.tensor_split(mine, n)[idx].copy_(torch.tensor_split(full.view(-1), n)[idx])
                    lab.ring_all_gather(torch.tensor_split(mine, n))
                    got, expected = mine, full.view(-1)
                    label = f"ring_all_gather of {tag}[{k}] starting from chunk {idx}"
                out.append({"label": label, "got": got, "expected": expected, "numel": k,
                            "elsize": x.element_size(), "counts": RECORDER.counts(),
                            "calls": [(c.name, c.peer, c.size_bytes) for c in RECORDER.calls],
                            **extra})
    return to_cpu(out)


# --------------------------------------------------------------------------- test side
def _ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


def _results(what: str, n: int):
    return on_ranks(n, _run, what, timeout=TIMEOUT_S, key=what)


def _check_values(what: str) -> None:
    for n in world_sizes(*WORLD_SIZES):
        for rank, cases in enumerate(_results(what, n)):
            for case in cases:
                if "owned" in case and case["owned"] != (rank + 1) % n:
                    raise AssertionError(f"rank {rank}: {case['label']} on {_ranks(n)} returned "
                                         f"{case['owned']}, but the fully reduced chunk after "
                                         f"phase 1 is (rank + 1) % n = {(rank + 1) % n}")
                assert_equal_on_rank(case["got"], case["expected"], rank=rank,
                                     what=f"{case['label']} on {_ranks(n)}: result")


@pytest.mark.points(4)
@pytest.mark.tasks("ring_reduce_scatter")
def test_ring_reduce_scatter():
    """Phase 1 alone, for every dtype, shape and op: it returns (rank + 1) % n, and that chunk
    holds the reduction of every rank's copy."""
    _check_values("ring_reduce_scatter")


@pytest.mark.points(3)
@pytest.mark.tasks("ring_all_gather")
def test_ring_all_gather():
    """Phase 2 alone: from a tensor where only the owned chunk is filled in, every rank ends
    with the whole reduced tensor (the other chunks start as junk)."""
    _check_values("ring_all_gather")


@pytest.mark.points(4)
@pytest.mark.tasks("ring_all_reduce")
def test_ring_all_reduce_matches_builtin():
    """The whole ring against ``dist.all_reduce``: every dtype and op, and shapes with fewer
    elements than ranks or not divisible by n."""
    _check_values("ring_all_reduce")


@pytest.mark.points(4)
@pytest.mark.tasks("ring_all_reduce")
def test_ring_all_reduce_pattern():
    """Only isend/irecv; exactly 2(n-1) sends per rank, all to the right neighbour, each of
    one chunk (floor or ceil of K/n elements); receives only from the left neighbour.
    Graded only once the results are right."""
    numbers_first(lambda: _check_values("ring_all_reduce"), "ring_all_reduce_matches_builtin")
    for n in world_sizes(*WORLD_SIZES):
        for rank, cases in enumerate(_results("ring_all_reduce", n)):
            left, right = (rank - 1) % n, (rank + 1) % n
            for case in cases:
                label = f"{case['label']} on {_ranks(n)}"
                assert_calls(case["counts"], rank=rank, allowed={"isend", "irecv"}, what=label,
                             exactly={SENDS: 2 * (n - 1), RECVS: 2 * (n - 1)})
                lo, hi = case["numel"] // n, -(-case["numel"] // n)
                for name, peer, size in case["calls"]:
                    want = right if name in SENDS else left
                    if peer != want:
                        raise AssertionError(
                            f"rank {rank}: {label}: {name} with rank {peer}; in a ring rank "
                            f"{rank} sends only to rank {right} and receives only from rank {left}")
                    elements = size // case["elsize"]
                    if name in SENDS and not lo <= elements <= hi:
                        raise AssertionError(
                            f"rank {rank}: {label}: sent {elements} elements in one message; each "
                            f"ring message carries one chunk of K/n = {case['numel']}/{n}, i.e. "
                            f"{lo} or {hi} elements")


@pytest.mark.points(3)
@pytest.mark.tasks("naive_time", "tree_time", "ring_time", "crossover_bytes")
def test_cost_model():
    from workbook.grading.labs import load_lab
    lab = load_lab("ring_allreduce")
    alpha, beta, size = 5e-6, 100e9, 64e6
    for n in (1, 2, 3, 4, 8):
        expected = {
            "naive_time": 2 * (n - 1) * (alpha + size / beta),
            "tree_time": 2 * math.ceil(math.log2(n)) * (alpha + size / beta),
            "ring_time": 2 * (n - 1) * (alpha + size / (n * beta)),
        }
        for name, want in expected.items():
            got = getattr(lab, name)(size, n, alpha, beta)
            assert got == pytest.approx(want, rel=1e-9, abs=1e-15), (
                f"{name}(S={size:g} B, n={n}, alpha={alpha:g} s, beta={beta:g} B/s) returned "
                f"{got!r}, expected {want:.6g} s")
    for n in (4, 8, 16):
        cross = lab.crossover_bytes(n, alpha, beta)
        assert lab.ring_time(cross * 1.01, n, alpha, beta) < lab.tree_time(cross * 1.01, n, alpha, beta) \
            and lab.ring_time(cross * 0.99, n, alpha, beta) > lab.tree_time(cross * 0.99, n, alpha, beta), (
                f"crossover_bytes(n={n}) returned {cross:g}: the ring should be slower just below "
                f"it and faster just above it")
