"""Reusable checks for the grading tests, each failing with a message that teaches.

A grading test collects, on every rank, what the learner's code produced and which
``torch.distributed`` calls it made (``workbook.runtime.flight.RECORDER``), and hands both to these
functions. Every message starts with the rank, names what was being checked, and says what
was expected and what was found::

    rank 2: all_reduce(sum) result differs from the built-in at index 5: expected 6.0,
    got 3.0 (float32, 7 elements)

* ``assert_equal_on_rank``: a tensor against its reference (exact by default);
* ``how_far``: how a tensor differs from its reference, in words (``"off by up to 0.02"``);
* ``assert_calls``: the communication pattern, from ``RECORDER.counts()``;
* ``count_rounds``: how many communication rounds a run took, from every rank's calls;
* ``P2P``: the point-to-point calls, the only ones a "build it yourself" lab may make.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

P2P = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})
SENDS = ("send", "isend")
RECVS = ("recv", "irecv")


def _fmt(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return f"{value:.1f}"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def assert_equal_on_rank(got, expected, *, rank: int, what: str, atol: float = 0.0,
                         rtol: float = 0.0, against: str = "the built-in") -> None:
    """Fail unless ``got`` matches ``expected`` (shape, dtype, then values within tolerances).

    ``what`` names the result, e.g. ``"all_reduce(sum) result"``; ``against`` names where the
    expected value comes from. The message points at the first element that differs."""
    prefix = f"rank {rank}: {what}"
    if got is None and expected is not None:
        raise AssertionError(f"{prefix} is missing: got None, expected a tensor of shape "
                             f"{tuple(expected.shape)}")
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{prefix}: expected a tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(expected.shape):
        raise AssertionError(f"{prefix} has shape {tuple(got.shape)}, expected "
                             f"{tuple(expected.shape)}")
    if got.dtype != expected.dtype:
        raise AssertionError(f"{prefix} has dtype {str(got.dtype).replace('torch.', '')}, "
                             f"expected {str(expected.dtype).replace('torch.', '')}")
    g, e = got.detach().cpu().reshape(-1), expected.detach().cpu().reshape(-1)
    if g.is_floating_point() or e.is_floating_point():
        close = torch.isclose(g.double(), e.double(), rtol=rtol, atol=atol, equal_nan=True)
    else:
        close = g == e
    if bool(close.all()):
        return
    bad = (~close).nonzero().reshape(-1)
    i = int(bad[0])
    dtype = str(e.dtype).replace("torch.", "")
    more = f"; {len(bad)} of {e.numel()} elements differ" if len(bad) > 1 else ""
    if rtol or atol:
        worst = float((g.double() - e.double()).abs().max())
        more += f"; max |diff| {worst:.3g}, tolerance rtol={rtol:g} atol={atol:g}"
    raise AssertionError(f"{prefix} differs from {against} at index {i}: expected "
                         f"{_fmt(e[i].item())}, got {_fmt(g[i].item())} ({dtype}, "
                         f"{e.numel()} element{'s' if e.numel() != 1 else ''}{more})")


def how_far(got, expected, **tol) -> str | None:
    """None when ``got`` is close to ``expected`` (``torch.allclose`` with ``tol``), else how it
    differs, in words for a message: ``"missing"`` (None) or ``"off by up to 0.0123"``."""
    if got is not None and torch.allclose(got, expected, **tol):
        return None
    return "missing" if got is None else f"off by up to {(got - expected).abs().max().item():.3g}"


def _total(counts: Mapping, names) -> int:
    names = (names,) if isinstance(names, str) else tuple(names)
    return sum(counts.get(n, {}).get("count", 0) for n in names)


def assert_calls(counts: Mapping[str, Mapping[str, int]], *, rank: int,
                 allowed: Iterable[str] | None = None, forbidden: Iterable[str] = (),
                 exactly: Mapping | None = None, what: str = "") -> None:
    """Check the calls one rank made (``RECORDER.counts()``: ``{name: {"count", "bytes"}}``).

    ``allowed``: the only call names permitted (None: any); ``forbidden``: names that must
    not appear; ``exactly``: ``{name or tuple of names: count}`` required totals, e.g.
    ``{("send", "isend"): 6}``. ``what`` names the code being checked in the message."""
    where = f" in {what}" if what else ""
    used = {name: c.get("count", 0) for name, c in counts.items() if c.get("count", 0)}
    for name in forbidden:
        if used.get(name):
            raise AssertionError(f"rank {rank}: called dist.{name} {used[name]} time(s){where}, "
                                 f"which this check forbids: build the result yourself")
    if allowed is not None:
        allowed = set(allowed)
        extra = sorted(set(used) - allowed)
        if extra:
            listed = ", ".join(f"dist.{n} ({used[n]}x)" for n in extra)
            raise AssertionError(f"rank {rank}: called {listed}{where}; only "
                                 f"{', '.join(sorted(allowed))} are allowed here")
    for names, want in (exactly or {}).items():
        got = _total(counts, names)
        if got != want:
            label = names if isinstance(names, str) else "/".join(names)
            raise AssertionError(f"rank {rank}: expected exactly {want} {label} call(s){where}, "
                                 f"got {got}")


def count_rounds(calls_by_rank: list[list[tuple[str, int | None]]]) -> int:
    """Communication rounds of a run, from each rank's ``(name, peer)`` calls in order.

    Model: a rank does one send or receive per round, in program order, and a message is
    delivered in one round, so a send and its matching receive (the k-th send from a to b
    matches the k-th receive on b from a) happen in the same round. The answer is the
    latest round of any message: n-1 for a root sending to every rank in turn, ceil(log2 n)
    for a binomial tree. Collectives and unmatched calls are ignored."""
    ops = []                                   # per rank: [(kind, peer, key)]
    for rank, calls in enumerate(calls_by_rank):
        seen: dict = {}
        mine = []
        for name, peer in calls:
            if peer is None or name not in SENDS + RECVS:
                continue
            kind = "s" if name in SENDS else "r"
            pair = (rank, peer) if kind == "s" else (peer, rank)
            seen[(kind, pair)] = seen.get((kind, pair), 0) + 1
            mine.append((pair, seen[(kind, pair)]))
        ops.append(mine)
    ends = {}                                  # message key -> round
    position = [0] * len(ops)                  # next op per rank
    last = [0] * len(ops)                      # round of the previous op per rank
    progress = True
    while progress:                            # schedule every message as early as allowed
        progress = False
        for rank, mine in enumerate(ops):
            while position[rank] < len(mine):
                key = mine[position[rank]]
                a, b = key[0]
                other = b if rank == a else a
                if key not in ends:
                    ready = [r for r in (a, b) if r < len(ops) and position[r] < len(ops[r])
                             and ops[r][position[r]] == key]
                    if len(ready) < 2 and other < len(ops) and key in ops[other]:
                        break                  # the peer has not reached this message yet
                    ends[key] = max(last[r] for r in (a, b) if r < len(ops)) + 1
                last[rank] = ends[key]
                position[rank] += 1
                progress = True
    return max(ends.values(), default=0)


def numbers_first(check_numbers, name: str, *, once=None) -> None:
    """A pattern earns points only for a correct result: run ``check_numbers`` (the numbers
    test of the same build) first, and fail, pointing at it, while it fails. The same holds for
    the traffic of a step and the share of it hidden behind compute: ``name`` is then the
    numerics check of the same variant. A numbers check that cannot run here (``Skipped``: a
    torchrun job of another size) holds nothing back; reading a run another test already made
    (``on_ranks(key=...)``) costs only the comparison.

    ``once``: a key (the lab and variant) under which a numbers check that did not fail is
    remembered for the rest of this grading of this implementation (the runs it reads are
    cached, so its verdict cannot change): later checks of the same variant skip it."""
    import os

    from workbook.grading.engine import STATE, Skipped
    from workbook.grading.labs import ENV_IMPL
    memo = None if once is None else ("numbers not wrong", once, os.environ.get(ENV_IMPL))
    if memo is not None and memo in STATE.cache:
        return
    try:
        check_numbers()
    except AssertionError:
        raise AssertionError(f"not graded until the numbers are right: fix {name} first "
                             f"(a message pattern, traffic or overlap earns points only for a "
                             f"correct result)") from None
    except Skipped:
        pass
    if memo is not None:
        STATE.cache[memo] = (True, None)
