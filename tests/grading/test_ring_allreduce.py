"""Autograder for lab 2, ``ring_allreduce``: the two phases, the whole ring, its messages, the model.

As in the collectives grader, each (world size, function) is one batched run on a warm rank
pool; the numeric test and the message-pattern test of ``ring_all_reduce`` read the same run.
The phases are graded on their own, so a wrong whole ring is told which phase is at fault
(``_diagnosis``), whether the learner wrote the tasks one by one or the ring in one go (the
challenge level).
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
        inputs = [(shape, False) for shape in SHAPES]
        if what == "ring_all_reduce":                   # the whole ring: a strided input too
            inputs += [(shape, True) for shape in SHAPES if len(shape) == 2]
        for shape, strided in inputs:
            x = _sample(shape, dtype, 1000 * rank + sum(shape))
            if strided:                                 # the same shape, not contiguous
                x = _sample(shape[::-1], dtype, 1000 * rank + sum(shape)).t()
            k = x.numel()
            for op_name, op in ops.items():
                full = x.clone(memory_format=torch.contiguous_format)
                dist.all_reduce(full, op=op)
                label = f"{what}({op_name}) of {tag}{list(shape)}" + \
                    (" (not contiguous)" if strided else "")
                RECORDER.reset()
                extra = {}
                if what == "ring_all_reduce":
                    given = x.clone()                   # keeps x's strides
                    got = lab.ring_all_reduce(given, op=op)
                    extra.update(in_place=got is given, strided=strided)
                    got, expected = given, full
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
                if case.get("in_place") is False:
                    raise AssertionError(f"rank {rank}: {case['label']} on {_ranks(n)} returned "
                                         f"another tensor than the one it was given: the ring "
                                         f"all-reduces its tensor in place and returns it")
                if "owned" in case and case["owned"] != (rank + 1) % n:
                    raise AssertionError(f"rank {rank}: {case['label']} on {_ranks(n)} returned "
                                         f"{case['owned']}, but the fully reduced chunk after "
                                         f"phase 1 is (rank + 1) % n = {(rank + 1) % n}")
                try:
                    assert_equal_on_rank(case["got"], case["expected"], rank=rank,
                                         what=f"{case['label']} on {_ranks(n)}: result")
                except AssertionError as exc:
                    raise AssertionError(f"{exc}{_diagnosis(what, case, rank, n)}") from None


# --------------------------------------------------------------------------- teaching messages
def _wrong_chunks(case, n: int) -> list[int]:
    """The chunks (``tensor_split`` of the flat tensor in n) where ``got`` differs, or [] when
    the two cannot be compared chunk by chunk (missing, other shape or dtype)."""
    got, expected = case["got"], case["expected"]
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape \
            or got.dtype != expected.dtype:
        return []
    pairs = zip(torch.tensor_split(got.reshape(-1), n),
                torch.tensor_split(expected.reshape(-1), n))
    return [c for c, (g, e) in enumerate(pairs) if not torch.equal(g, e)]


def _phase_verdict(what: str) -> str | None:
    """None when ``what`` (a phase) passes on its own, else a few words on how it fails."""
    from workbook.grading.engine import not_implemented_message
    try:
        _check_values(what)
    except AssertionError:
        return "fails"
    except Exception as exc:                          # noqa: BLE001 - a diagnosis, never a verdict
        return "is not written yet" if not_implemented_message(exc) else "did not run"
    return None


def _diagnosis(what: str, case, rank: int, n: int) -> str:
    """What a wrong result says about the sub-step at fault, in terms of the spec: which chunks
    are wrong and, for the whole ring, which phase (each is graded alone too)."""
    owned = (rank + 1) % n
    if what == "ring_reduce_scatter":
        return (f". After phase 1, chunk {owned} must hold the reduction of all {n} ranks' "
                f"copies of it: over the n - 1 steps every chunk must pass once around the ring, "
                f"combined into the copy on each rank it reaches (lesson 2, \"Step through the "
                f"ring\", the reduce-scatter steps)")
    wrong = _wrong_chunks(case, n)
    if not wrong:
        return ""
    many = len(wrong) > 1
    where = (f". On rank {rank}, chunk{'s' if many else ''} {', '.join(map(str, wrong))} of {n} "
             f"{'are' if many else 'is'} wrong")
    if what == "ring_all_gather":
        if owned in wrong:
            return (f"{where}, among them chunk {owned}, the one this rank finished in phase 1: "
                    f"phase 2 only sends that chunk, a receive must never land in it (lesson 2, "
                    f"\"Step through the ring\", the all-gather steps)")
        return (f"{where}: in phase 2 each rank passes on a finished chunk, the one it finished "
                f"itself first, then the one it received in the step before (lesson 2, \"Step "
                f"through the ring\", the all-gather steps)")
    if case.get("strided"):
        return (f"{where}; the same shape, contiguous, passed before it, so the fault is the "
                f"layout: a tensor that is not contiguous has no flat view of its own memory, so "
                f"what the phases reduce must end up in the tensor given, reduced in place")
    phase1, phase2 = _phase_verdict("ring_reduce_scatter"), _phase_verdict("ring_all_gather")
    if phase1:
        return (f"{where}; phase 1 on its own {phase1} (test_ring_reduce_scatter): fix the "
                f"reduce-scatter first")
    if phase2:
        return (f"{where}; phase 1 on its own passes, phase 2 {phase2} (test_ring_all_gather): "
                f"fix the all-gather")
    return (f"{where}; both phases pass on their own, so the fault lies in the whole: how the "
            f"tensor is cut into its n chunks (views of its memory, the first K mod n one "
            f"element longer), a tensor that is not contiguous, or the phases' order")


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
    """The whole ring against ``dist.all_reduce``: every dtype and op, shapes with fewer
    elements than ranks or not divisible by n, and a tensor that is not contiguous; the tensor
    given is reduced in place and returned. A wrong result names the wrong chunks and which
    phase, checked on its own, is at fault (the same message at every level)."""
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


def _cost_mistake(name: str, got, want: float, size: float, n: int, alpha: float,
                  beta: float) -> str:
    """The classic wrong derivation ``got`` matches, named (or "" when none does)."""
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    whole, chunk = size / beta, size / (n * beta)          # one message's bytes, on the link
    mistakes = {
        "naive_time": {
            "counted one of the two halves only (the reduce or the broadcast)":
                (n - 1) * (alpha + whole),
            "counted n messages per half instead of n - 1": 2 * n * (alpha + whole),
            "left out the latency": 2 * (n - 1) * whole},
        "tree_time": {
            "counted one of the two trees only (the reduce or the broadcast)":
                rounds * (alpha + whole),
            "did not round log2 n up to whole rounds":
                2 * math.log2(n) * (alpha + whole) if n > 1 else 0.0,
            "counted messages (n - 1 per tree) instead of rounds": 2 * (n - 1) * (alpha + whole),
            "left out the latency": 2 * rounds * whole},
        "ring_time": {
            "counted one of the two phases only (the reduce-scatter or the all-gather)":
                (n - 1) * (alpha + chunk),
            "sent the whole tensor in each step instead of one chunk of S / n":
                2 * (n - 1) * (alpha + whole),
            "counted n steps per phase instead of n - 1": 2 * n * (alpha + chunk),
            "left out the latency": 2 * (n - 1) * chunk},
    }[name]
    if not isinstance(got, (int, float)):
        return ""
    for mistake, value in mistakes.items():
        if value != pytest.approx(want, rel=1e-9) and got == pytest.approx(value, rel=1e-9):
            return f": that is the value you get if you {mistake}"
    return ""


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
                f"{got!r}, expected {want:.6g} s"
                f"{_cost_mistake(name, got, want, size, n, alpha, beta)}")
    for n in (4, 8, 16):
        cross = lab.crossover_bytes(n, alpha, beta)
        assert lab.ring_time(cross * 1.01, n, alpha, beta) < lab.tree_time(cross * 1.01, n, alpha, beta) \
            and lab.ring_time(cross * 0.99, n, alpha, beta) > lab.tree_time(cross * 0.99, n, alpha, beta), (
                f"crossover_bytes(n={n}) returned {cross:g}: the ring should be slower just below "
                f"it and faster just above it")
