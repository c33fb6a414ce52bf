"""Autograder for lab 1, ``collectives``: each build against the built-in, and its messages.

Every function runs once per world size (1, 2, 3, 4) on a warm rank pool, with all its cases
(dtypes float32/float64/int64, sizes not divisible by the world size, every root, every
reduce op) batched into that one run. The run records, per case, the result, the built-in's
result and the calls the build made (the flight recorder); the two tests of a function read
the same run: ``..._matches_builtin`` checks the numbers, ``..._pattern`` the messages.
"""
from __future__ import annotations

import math
import time

import pytest
import torch

from workbook.grading.checks import P2P, RECVS, SENDS, assert_calls, assert_equal_on_rank, \
    count_rounds, numbers_first
from workbook.grading.engine import on_ranks, world_sizes
from workbook.grading.model_checks import to_cpu

WORLD_SIZES = (1, 2, 3, 4)
DTYPES = (torch.float32, torch.float64, torch.int64)
SIZES = (1, 7, 10, 1003)                 # 7, 10, 1003: not divisible by 2, 3 or 4
TIMEOUT_S = 60.0


# --------------------------------------------------------------------------- rank side
def _sample(numel, dtype, seed):
    """A rank's input, on the rank's device (``cuda:N`` on GPU ranks: NCCL takes no CPU tensor)."""
    from workbook.runtime import ranks
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-50, 51, (numel,), generator=g).to(ranks.device(), dtype)


def _run_cases(name: str) -> list[dict]:
    """On every rank: run build ``name`` of the lab under test on all its cases."""
    import torch.distributed as dist
    from workbook.runtime.flight import RECORDER
    from workbook.runtime import ranks
    from workbook.grading.labs import load_lab
    lab = load_lab("collectives")
    rank, n, dev = dist.get_rank(), dist.get_world_size(), ranks.device()
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    out = []

    def record(label, got, expected, **extra):
        out.append({"label": label, "got": got, "expected": expected, "counts": RECORDER.counts(),
                    "calls": [(c.name, c.peer, c.size_bytes) for c in RECORDER.calls], **extra})

    for dtype in DTYPES:
        tag = str(dtype).replace("torch.", "")
        for k in SIZES:
            x = _sample(k, dtype, 1000 * rank + k)
            own = torch.tensor_split(x, n)[rank].clone()          # this rank's chunk of K
            for root in range(n):
                if name in ("broadcast", "tree_broadcast"):
                    ref = x.clone()
                    dist.broadcast(ref, src=root)
                    RECORDER.reset()
                    got = getattr(lab, name)(x.clone(), src=root)
                    record(f"{name}(src={root}) of {tag}[{k}]", got, ref, root=root)
                elif name in ("reduce", "tree_reduce"):
                    for op_name, op in ops.items():
                        ref = x.clone()
                        dist.reduce(ref, dst=root, op=op)
                        mine = x.clone()
                        RECORDER.reset()
                        getattr(lab, name)(mine, dst=root, op=op)
                        record(f"{name}(dst={root}, {op_name}) of {tag}[{k}]",
                               mine if rank == root else None,
                               ref if rank == root else None, root=root)
                elif name == "gather":
                    ref = [torch.empty(k, dtype=dtype, device=dev) for _ in range(n)] if rank == root else None
                    dist.gather(x, ref, dst=root)
                    mine = [torch.full((k,), -1, dtype=dtype, device=dev) for _ in range(n)] \
                        if rank == root else None
                    RECORDER.reset()
                    lab.gather(x.clone(), mine, dst=root)
                    record(f"gather(dst={root}) of {tag}[{k}]",
                           torch.cat(mine) if rank == root else None,
                           torch.cat(ref) if rank == root else None, root=root)
                elif name == "scatter":
                    parts = [_sample(k, dtype, 7 * j + k) for j in range(n)]
                    ref = torch.empty(k, dtype=dtype, device=dev)
                    dist.scatter(ref, parts if rank == root else None, src=root)
                    RECORDER.reset()
                    got = lab.scatter(torch.full((k,), -1, dtype=dtype, device=dev),
                                      parts if rank == root else None, src=root)
                    record(f"scatter(src={root}) of {tag}[{k}] per rank", got, ref, root=root)
            if name == "all_reduce":
                for op_name, op in ops.items():
                    ref = x.clone()
                    dist.all_reduce(ref, op=op)
                    RECORDER.reset()
                    got = lab.all_reduce(x.clone(), op=op)
                    record(f"all_reduce({op_name}) of {tag}[{k}]", got, ref)
            elif name == "all_gather":
                ref = torch.zeros(k, dtype=dtype, device=dev)           # built-in answer, uneven chunks:
                torch.tensor_split(ref, n)[rank].copy_(own)   # own chunk in zeros, summed
                dist.all_reduce(ref)
                RECORDER.reset()
                got = lab.all_gather(torch.full((k,), -1, dtype=dtype, device=dev), own.clone())
                record(f"all_gather of {tag}[{k}] (chunk of {own.numel()})", got, ref)
            elif name == "reduce_scatter":
                for op_name, op in ops.items():
                    full = x.clone()
                    dist.all_reduce(full, op=op)
                    ref = torch.tensor_split(full, n)[rank].clone()
                    RECORDER.reset()
                    got = lab.reduce_scatter(torch.full_like(own, -1), x.clone(), op=op)
                    record(f"reduce_scatter({op_name}) of {tag}[{k}] (chunk of {own.numel()})",
                           got, ref)
    return to_cpu(out)


def _run_barrier() -> list[dict]:
    """Each rank in turn arrives late; every rank notes when it entered and left barrier()."""
    import torch.distributed as dist
    from workbook.runtime.flight import RECORDER
    from workbook.grading.labs import load_lab
    lab = load_lab("collectives")
    rank, n = dist.get_rank(), dist.get_world_size()
    out = []
    for late in range(n):
        dist.barrier()
        if rank == late:
            time.sleep(0.1)
        RECORDER.reset()
        entered = time.time()
        lab.barrier()
        left = time.time()
        out.append({"label": f"barrier() with rank {late} arriving late", "late": late,
                    "entered": entered, "left": left, "counts": RECORDER.counts(),
                    "calls": [(c.name, c.peer, c.size_bytes) for c in RECORDER.calls]})
    return out


def _run_use_builtins() -> dict:
    import torch.distributed as dist
    from workbook.runtime.flight import RECORDER
    from workbook.grading.labs import load_lab
    lab = load_lab("collectives")
    RECORDER.reset()
    values = lab.use_builtins(root=dist.get_world_size() - 1)
    return {"values": values, "counts": RECORDER.counts()}


# --------------------------------------------------------------------------- test side
def _ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


def _results(what: str, n: int):
    """Per-rank results of one batched run (a function's two tests share it)."""
    fn, args = {"barrier": (_run_barrier, ()), "use_builtins": (_run_use_builtins, ())}.get(
        what, (_run_cases, (what,)))
    return on_ranks(n, fn, *args, timeout=TIMEOUT_S, key=what)


def _check_values(name: str) -> None:
    for n in world_sizes(*WORLD_SIZES):
        per_rank = _results(name, n)
        for rank, cases in enumerate(per_rank):
            for index, case in enumerate(cases):
                if case["expected"] is None:
                    continue
                try:
                    assert_equal_on_rank(case["got"], case["expected"], rank=rank,
                                         what=f"{case['label']} on {_ranks(n)}: result")
                except AssertionError as exc:
                    if name != "all_reduce":
                        raise
                    why = _all_reduce_diagnosis(per_rank, index)
                    raise AssertionError(f"{exc}{why}") from None


def _all_reduce_diagnosis(per_rank, index: int) -> str:
    """Which half of an all-reduce (a reduce to one rank, then a broadcast from it) went wrong,
    read from what every rank holds after one case: the same wrong value everywhere means the
    reduction, values that differ between ranks mean the sharing."""
    got = [cases[index]["got"] for cases in per_rank]
    if len(got) < 2 or not all(isinstance(g, torch.Tensor) and g.shape == got[0].shape
                               and g.dtype == got[0].dtype for g in got):
        return ""
    if all(torch.equal(g, got[0]) for g in got):
        return (". Every rank holds the same wrong result, so the reduction went wrong before it "
                "was shared: the reduce half (tree_reduce_matches_builtin tests that build "
                "alone; lesson 1, \"Trees: ⌈log2 n⌉ rounds\")")
    right = [r for r, cases in enumerate(per_rank)
             if torch.equal(got[r], cases[index]["expected"])]
    many = len(right) > 1
    held = f"only rank{'s' if many else ''} {', '.join(map(str, right))} " \
        f"hold{'' if many else 's'}" if right else "no rank holds"
    return (f". The ranks disagree ({held} the right result), so the reduced result did not "
            f"reach every rank: the broadcast half (tree_broadcast_matches_builtin tests that "
            f"build alone; lesson 1, \"Trees: ⌈log2 n⌉ rounds\")")


def _sends(case):
    return [(name, peer, size) for name, peer, size in case["calls"] if name in SENDS]


def _recvs(case):
    return [(name, peer, size) for name, peer, size in case["calls"] if name in RECVS]


def _check_pattern(name: str, *, rooted: str | None = None, tree: bool = False) -> None:
    """Only point-to-point calls; rooted builds: n-1 messages, each non-root in one message
    with the root (naive) or at most ceil(log2 n) rounds (tree). Graded only once the
    results are right."""
    numbers_first(lambda: _check_values(name), f"{name}_matches_builtin")
    for n in world_sizes(*WORLD_SIZES, needs=(4,) if tree else ()):   # log2 rounds: 4 ranks
        per_rank = _results(name, n)
        for index in range(len(per_rank[0])):
            cases = [per_rank[r][index] for r in range(n)]
            label = f"{cases[0]['label']} on {_ranks(n)}"
            for rank, case in enumerate(cases):
                assert_calls(case["counts"], rank=rank, allowed=P2P, what=label)
            if rooted is None:
                continue
            root = cases[0]["root"]
            total = sum(len(_sends(c)) for c in cases)
            if total != n - 1:
                raise AssertionError(f"rank {root} (the root): {label} sent {total} messages in "
                                     f"all, expected n-1 = {n - 1} (one per non-root rank)")
            for rank, case in enumerate(cases):
                mine = _sends(case) if rooted == "to_root" else _recvs(case)
                if rank != root and len(mine) != 1:
                    verb = "sent" if rooted == "to_root" else "received"
                    raise AssertionError(f"rank {rank}: {label} {verb} {len(mine)} messages, "
                                         f"expected exactly 1")
                if not tree and rank != root and mine[0][1] != root:
                    raise AssertionError(f"rank {rank}: {label} exchanged its message with rank "
                                         f"{mine[0][1]}; the naive version talks to the root "
                                         f"(rank {root}) only")
            if tree:
                rounds = count_rounds([[(nm, peer) for nm, peer, _ in c["calls"]] for c in cases])
                best = math.ceil(math.log2(n)) if n > 1 else 0
                root_msgs = len(_sends(cases[root]) if rooted == "from_root" else _recvs(cases[root]))
                if rounds > best or root_msgs > best:
                    raise AssertionError(f"rank {root} (the root): {label} took {rounds} rounds, "
                                         f"with {root_msgs} message(s) at the root; a binomial "
                                         f"tree needs at most ceil(log2 {n}) = {best}")


@pytest.mark.points(2)
@pytest.mark.tasks("use_builtins")
def test_use_builtins():
    for n in world_sizes(*WORLD_SIZES):
        root = n - 1
        chunk = torch.arange(3.0)
        for rank, result in enumerate(_results("use_builtins", n)):
            values = result["values"]
            expected = {
                "broadcast": [float(root + 1)] * 3,
                "all_reduce": [float(n)] * 3,
                "all_gather": [[float(j + 1)] * 3 for j in range(n)],
                "scatter": [10.0 * rank] * 3,
                "reduce_scatter": (n * (chunk + 3 * rank) + n * (n - 1) / 2).tolist(),
                "barrier": True,
            }
            if rank == root:
                expected["reduce"] = [n * (n + 1) / 2] * 3
                expected["gather"] = [[float(j + 1)] * 3 for j in range(n)]
            for key, want in expected.items():
                assert values.get(key) == want, (
                    f"rank {rank}: use_builtins()[{key!r}] with {_ranks(n)} (root {root}) is "
                    f"{values.get(key)!r}, expected {want!r}")
            for group in (("broadcast",), ("reduce",), ("all_reduce",), ("gather",),
                          ("all_gather", "all_gather_into_tensor"), ("scatter",),
                          ("reduce_scatter", "reduce_scatter_tensor"), ("barrier",)):
                if not any(result["counts"].get(g, {}).get("count") for g in group):
                    raise AssertionError(f"rank {rank}: use_builtins() never called dist.{group[0]}"
                                         f"; this part is about using each built-in once")


def _build_test(check, build: str, points: float, **options):
    """The test ``test_<build>_matches_builtin`` (``check`` is ``_check_values``: the build's
    results equal the built-in's on every case) or ``test_<build>_pattern`` (``_check_pattern``:
    its messages, graded only once the results are right) of one part-2 build."""
    @pytest.mark.points(points)
    @pytest.mark.tasks(build)
    def test():
        check(build, **options)
    suffix = "pattern" if check is _check_pattern else "matches_builtin"
    test.__name__ = test.__qualname__ = f"test_{build}_{suffix}"
    return test


test_broadcast_matches_builtin = _build_test(_check_values, "broadcast", 2)
test_broadcast_pattern = _build_test(_check_pattern, "broadcast", 2, rooted="from_root")
test_tree_broadcast_matches_builtin = _build_test(_check_values, "tree_broadcast", 2)
test_tree_broadcast_pattern = _build_test(_check_pattern, "tree_broadcast", 3, rooted="from_root",
                                          tree=True)
test_reduce_matches_builtin = _build_test(_check_values, "reduce", 2)
test_reduce_pattern = _build_test(_check_pattern, "reduce", 2, rooted="to_root")
test_tree_reduce_matches_builtin = _build_test(_check_values, "tree_reduce", 2)
test_tree_reduce_pattern = _build_test(_check_pattern, "tree_reduce", 3, rooted="to_root",
                                       tree=True)
test_all_reduce_matches_builtin = _build_test(_check_values, "all_reduce", 2)
test_all_reduce_pattern = _build_test(_check_pattern, "all_reduce", 1)
test_gather_matches_builtin = _build_test(_check_values, "gather", 2)
test_gather_pattern = _build_test(_check_pattern, "gather", 1, rooted="to_root")
test_scatter_matches_builtin = _build_test(_check_values, "scatter", 2)
test_scatter_pattern = _build_test(_check_pattern, "scatter", 1, rooted="from_root")
test_all_gather_matches_builtin = _build_test(_check_values, "all_gather", 2)
test_all_gather_pattern = _build_test(_check_pattern, "all_gather", 1)
test_reduce_scatter_matches_builtin = _build_test(_check_values, "reduce_scatter", 2)
test_reduce_scatter_pattern = _build_test(_check_pattern, "reduce_scatter", 1)


@pytest.mark.points(2)
@pytest.mark.tasks("barrier")
def test_barrier_waits_for_everyone():
    for n in world_sizes(*WORLD_SIZES):
        per_rank = _results("barrier", n)
        for trial in range(n):
            last_in = max(per_rank[r][trial]["entered"] for r in range(n))
            for rank in range(n):
                case = per_rank[rank][trial]
                early = last_in - case["left"]
                if early > 0:
                    raise AssertionError(
                        f"rank {rank}: {case['label']} on {_ranks(n)}: left {early * 1e3:.0f} ms "
                        f"before rank {case['late']} entered it; a barrier returns only after "
                        f"every rank has entered")


@pytest.mark.points(1)
@pytest.mark.tasks("barrier")
def test_barrier_pattern():
    numbers_first(test_barrier_waits_for_everyone, "barrier_waits_for_everyone")
    for n in world_sizes(*WORLD_SIZES):
        for rank, cases in enumerate(_results("barrier", n)):
            for case in cases:
                assert_calls(case["counts"], rank=rank, allowed=P2P,
                             what=f"{case['label']} on {_ranks(n)}")
                if n > 1 and not _sends(case):
                    raise AssertionError(f"rank {rank}: {case['label']} on {_ranks(n)} sent no "
                                         f"message, so no other rank can know it arrived")
