"""Virtual stages and the split backward, on paper: the given pieces of lab ``pp_schedules``.

Lab ``pp_overlap`` gave each rank one *stage* (a run of consecutive layers). With ``p`` ranks and
``m`` micro-batches, 1F1B leaves every rank idle for ``p - 1`` forward-and-backward times out of
``m + p - 1`` (``pipeline_parallel.bubble_fraction``). Two ideas shrink that bubble.

**Virtual stages** (interleaved 1F1B, Narayanan et al. 2021, arXiv 2104.04473, section 2.2). Cut
the model into ``p * v`` stages instead of ``p``; rank r holds ``v`` *chunks*, and under the
``interleaved`` placement chunk c of rank r is stage ``c * p + r``: a micro-batch goes round the
ranks v times. Count in chunk actions costing ``t_F`` and ``t_B`` (a whole stage's, divided by v).
Every rank is busy ``v m (t_F + t_B)``. The first micro-batch reaches rank p - 1 after ``p - 1``
chunk forwards and the last gradient reaches rank 0 ``p - 1`` chunk backwards after rank p - 1
sent it; with Megatron's warm-up no rank waits in between (``simulate_chunked`` shows it), so
with no transfer time::

    step = (v m + p - 1)(t_F + t_B),   idle per rank = (p - 1)(t_F + t_B),
    bubble = (p - 1) / (v m + p - 1)     for any ratio t_B / t_F (v = 1: lab 10's 1F1B)

The fill and the drain are as many steps as in 1F1B, each v times shorter; the price is v times
more point-to-point messages. Megatron-LM's order takes micro-batches through the chunks in
groups of p, so it needs ``m % p == 0`` (``check_interleaved_shape``).

**The split backward** (zero bubble, Qi et al. 2023, arXiv 2401.10241). A linear layer
``y = x A`` has two backward products: ``dx = dy A^T`` (**B**, the input gradient, which the
previous stage is waiting for) and ``dA = x^T dy`` (**W**, the weight gradient, which nobody
waits for until the optimizer step). Sending B's result upstream at once and deferring W lets W
fill the idle time. ZB-H1 idles ``(p - 1)(t_F + t_B - t_W)`` per rank instead of 1F1B's
``(p - 1)(t_F + t_B + t_W)`` (a third when ``t_F = t_B = t_W``) and holds p micro-batches in
flight on every rank, 1F1B's peak (its rank 0). ZBV puts two chunks per rank in a V (``v``
placement: chunk 0 of rank r is stage r, going down the pipe; chunk 1 is stage ``2p - 1 - r``,
coming back up), so the last rank turns a micro-batch round without a transfer and rank 0
computes the loss; with equal chunk costs and ``m >= 2p`` every rank idles only ``(p - 1) t_F``,
the least any schedule can (rank p - 1 cannot start before p - 1 forwards have run), and holds
at most ``2p`` chunk-activations (p whole stages, 1F1B's peak again).

**Actions.** ``(kind, micro_batch, chunk)`` triples (``ChunkAction`` names the fields; plain
tuples compare equal): ``F`` forward, ``B`` backward, ``W`` weight gradient; a schedule is one list
per rank. A schedule with no ``W`` anywhere is *unsplit*: each ``B`` is the full backward
(input and weight gradients, lab 10's B, torch's ``FULL_BACKWARD``). A schedule with any ``W`` is
*split*: every ``B`` is the input gradient only (torch's ``BACKWARD_INPUT``, "I") and needs its
own ``W`` after it, on the same rank. One rule for the whole schedule, so a forgotten W is an
error, never a silent fusion.

**Activations in flight.** A forward adds one micro-batch's activations *for one chunk* (1/v of
a whole stage's); its ``W`` frees them (an unsplit ``B`` frees them too). Why at W: ``dA = x^T dy``
reads the layer inputs x that the forward saved, so they live until W. (B could free the rest
early; counting to W is the bound the ZB paper states its memory in.)

Everything here is pure Python on lists; nothing starts a rank.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from workbook.pipeline_parallel.pipeline_parallel import B, F, ScheduleError, Timeline

W = "W"
INTERLEAVED, V_SHAPE = "interleaved", "v"
PLACEMENTS = (INTERLEAVED, V_SHAPE)


class ChunkAction(NamedTuple):
    """One action of a rank: ``kind`` (``F``, ``B`` or ``W``) for ``micro_batch`` on the rank's
    model chunk ``chunk``. ``str`` reads ``F(3, chunk 1)``."""
    kind: str
    micro_batch: int
    chunk: int

    def __str__(self) -> str:
        return f"{self.kind}({self.micro_batch}, chunk {self.chunk})"


# --------------------------------------------------------------------------- placement
def stage_index(rank: int, chunk: int, p: int, placement: str = INTERLEAVED) -> int:
    """Which of the ``p * v`` stages (model order, 0 = embedding side) chunk ``chunk`` of rank
    ``rank`` holds. ``interleaved``: ``chunk * p + rank`` (Megatron, torch's "loop"). ``v``: even
    chunks run down the ranks, odd chunks back up: ``chunk * p + rank`` for even chunks,
    ``chunk * p + p - 1 - rank`` for odd ones (v = 2: stages r and 2p - 1 - r, torch's "v")."""
    if placement not in PLACEMENTS:
        raise ScheduleError(f"placement {placement!r} is not one of {PLACEMENTS}")
    return chunk * p + (p - 1 - rank if placement == V_SHAPE and chunk % 2 else rank)


def rank_and_chunk(stage: int, p: int, placement: str = INTERLEAVED) -> tuple[int, int]:
    """The inverse of ``stage_index``: ``(rank, chunk)`` holding stage ``stage``."""
    chunk, offset = divmod(stage, p)
    return (p - 1 - offset if placement == V_SHAPE and chunk % 2 else offset), chunk


def check_interleaved_shape(p: int, v: int, m: int) -> None:
    """Megatron-LM's rule for interleaved 1F1B: with ``v > 1`` chunks per rank, ``m`` must be a
    multiple of ``p`` (micro-batches go through each chunk in groups of p)."""
    if v > 1 and m % p:
        raise ScheduleError(
            f"interleaved 1F1B needs m a multiple of p (Megatron-LM's rule: micro-batches go "
            f"through the chunks in groups of p), got m={m}, p={p}: use m={m + p - m % p}")


def _check_sizes(schedules, p: int, v: int, m: int, placement: str) -> None:
    if placement not in PLACEMENTS:
        raise ScheduleError(f"placement {placement!r} is not one of {PLACEMENTS}")
    if min(p, v, m) < 1:
        raise ScheduleError(f"p={p}, v={v}, m={m}: each must be at least 1")
    if placement == V_SHAPE and v % 2:
        raise ScheduleError(f"a V placement needs an even number of chunks per rank, got v={v}")
    if len(schedules) != p:
        raise ScheduleError(f"{len(schedules)} lists of actions for p={p} ranks: give one per rank")


# --------------------------------------------------------------------------- the checker
def check_chunked_schedule(schedules, p: int, v: int, m: int,
                           placement: str = INTERLEAVED) -> None:
    """Raise ``ScheduleError`` (one line, naming the rank and the action) unless the ``p`` ranks'
    lists of ``(kind, micro_batch, chunk)`` actions together

    * hold each ``F(i, c)`` and ``B(i, c)`` exactly once for every micro-batch ``i < m`` and
      chunk ``c < v``, and ``W(i, c)`` too if the schedule is split (any ``W`` anywhere);
    * run, on each rank, ``F(i, c)`` before its ``B(i, c)`` and ``B(i, c)`` before its ``W(i, c)``;
    * cannot deadlock (``simulate_chunked`` plays them to the end, see there);

    and, for ``interleaved`` with ``v > 1``, ``m`` is a multiple of ``p`` (Megatron's rule)."""
    _check_sizes(schedules, p, v, m, placement)
    if placement == INTERLEAVED:
        check_interleaved_shape(p, v, m)
    split = any(isinstance(a, tuple) and len(a) == 3 and a[0] == W
                for acts in schedules for a in acts)
    kinds = (F, B, W) if split else (F, B)
    want = Counter(ChunkAction(k, i, c) for k in kinds for i in range(m) for c in range(v))
    for r, acts in enumerate(schedules):
        bad = [a for a in acts if not (isinstance(a, tuple) and len(a) == 3)]
        if bad:
            raise ScheduleError(f"rank {r}: action {bad[0]!r} is not a tuple (kind, micro_batch, "
                                f"chunk) such as ('F', 0, 1)")
        got = Counter(ChunkAction(*a) for a in acts)
        missing, extra = want - got, got - want
        if missing or extra:
            what = "F, B and W" if split else "F and B"
            raise ScheduleError(
                f"rank {r} of {p}: a rank runs {what} once per micro-batch (m={m}) and chunk "
                f"(v={v}); " + "; ".join(f"{name} {_names(found)}" for name, found
                                         in (("missing", missing), ("extra", extra)) if found))
        done = set()
        for a in map(ChunkAction._make, acts):
            need = {B: F, W: B}.get(a.kind)
            if need and (need, a.micro_batch, a.chunk) not in done:
                why = ("a backward needs the activations of its forward" if a.kind == B else
                       "W (x^T dy) needs the gradients dy its B carries back through the chunk")
                raise ScheduleError(f"rank {r}: {a} comes before "
                                    f"{ChunkAction(need, a.micro_batch, a.chunk)}: {why}")
            done.add(a)
    simulate_chunked(schedules, p, v, placement)


def _names(actions: Counter, most: int = 4) -> str:
    names = sorted(actions.elements(), key=lambda a: (a.chunk, a.micro_batch, a.kind))
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(map(str, names[:most])) + more


# --------------------------------------------------------------------------- playing on paper
@dataclass
class ChunkedTimeline(Timeline):
    """A chunked schedule played on paper: ``spans[r]`` holds rank r's ``(start, end,
    ChunkAction)``; ``step`` is the last end; ``peak_in_flight[r]`` the most chunk-activations
    rank r holds at once (see the module docstring). ``bubble`` (inherited) is the idle share of
    all ranks together."""
    peak_in_flight: list[int] = field(default_factory=list)

    def idle(self, rank: int) -> float:
        """Rank ``rank``'s idle time: ``step - busy(rank)``."""
        return self.step - self.busy(rank)

    def bubble_of(self, rank: int) -> float:
        """Rank ``rank``'s idle share of the step: ``1 - busy(rank) / step``."""
        return self.idle(rank) / self.step if self.step else 0.0

    @property
    def bubbles(self) -> list[float]:
        """Every rank's ``bubble_of``, rank 0 first."""
        return [self.bubble_of(r) for r in range(len(self.spans))]


def simulate_chunked(schedules, p: int, v: int, placement: str = INTERLEAVED, t_f: float = 1.0,
                     t_b: float = 1.0, t_w: float = 1.0, t_p2p: float = 0.0) -> ChunkedTimeline:
    """Play the ranks' lists of actions and time them.

    Each rank runs its actions in order, each as soon as the rank is free and its input is
    there. With ``s = stage_index(rank, chunk)`` and ``S = p * v`` stages, ``F(i)`` of stage
    ``s > 0`` needs ``F(i)`` of stage ``s - 1`` done, ``B(i)`` of stage ``s < S - 1`` needs
    ``B(i)`` of stage ``s + 1`` done, and the input arrives ``t_p2p`` later if that stage is on
    another rank (no transfer within a rank: the turn of a V). Sends never block (they are
    posted asynchronously, as lab 10's executors do), so only receives wait. ``W`` waits for
    nothing but its rank. Costs are per chunk action: ``t_f`` for F, ``t_b`` for a split B,
    ``t_w`` for W, ``t_b + t_w`` for an unsplit B (default 1, 1, 1: lab 10's backward = 2 x the
    forward). To compare with a one-chunk pipeline on the same model, divide the costs by v.

    Raises ``ScheduleError`` when no rank can move (a deadlock), naming what each stuck rank
    waits for and on which rank."""
    _check_sizes(schedules, p, v, 1, placement)
    acts = [[ChunkAction(*a) for a in rank_acts] for rank_acts in schedules]
    split = any(a.kind == W for rank_acts in acts for a in rank_acts)
    cost = {F: t_f, B: t_b if split else t_b + t_w, W: t_w}
    last = p * v - 1
    end: dict = {}                                     # (stage, kind, i) -> end time
    nxt, free = [0] * p, [0.0] * p
    line = ChunkedTimeline([[] for _ in range(p)], peak_in_flight=[_peak(a, split) for a in acts])
    while any(nxt[r] < len(acts[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while nxt[r] < len(acts[r]):
                a = acts[r][nxt[r]]
                s = stage_index(r, a.chunk, p, placement)
                dep = _dependency(a, s, last)
                if dep is not None and dep not in end:
                    break                              # its input is not made yet
                ready = 0.0
                if dep is not None:
                    remote = rank_and_chunk(dep[0], p, placement)[0] != r
                    ready = end[dep] + (t_p2p if remote else 0.0)
                start = max(free[r], ready)
                free[r] = end[(s, a.kind, a.micro_batch)] = start + cost[a.kind]
                line.spans[r].append((start, free[r], a))
                nxt[r] += 1
                moved = True
        if not moved:
            raise ScheduleError("deadlock: " + "; ".join(
                _waits(r, acts[r][nxt[r]], p, placement, last)
                for r in range(p) if nxt[r] < len(acts[r]))
                + " -- no rank can move, so these ranks would hang for ever")
    line.step = max(free)
    return line


def _dependency(a: ChunkAction, s: int, last: int):
    """The ``(stage, kind, micro_batch)`` on another stage that action ``a`` of stage ``s``
    receives its input from, or None."""
    if a.kind == F and s > 0:
        return (s - 1, F, a.micro_batch)
    if a.kind == B and s < last:
        return (s + 1, B, a.micro_batch)
    return None


def _waits(r: int, a: ChunkAction, p: int, placement: str, last: int) -> str:
    s = stage_index(r, a.chunk, p, placement)
    src, kind, i = _dependency(a, s, last)
    owner, chunk = rank_and_chunk(src, p, placement)
    what = "activation" if kind == F else "gradient"
    return (f"rank {r} waits at {a} (stage {s}) for {ChunkAction(kind, i, chunk)} on rank "
            f"{owner} (stage {src}'s {what})")


def _peak(actions: list[ChunkAction], split: bool) -> int:
    """The most chunk-activations alive at once on a rank: +1 at F, -1 at W (or unsplit B)."""
    live = peak = 0
    for a in actions:
        live += 1 if a.kind == F else -1 if a.kind == (W if split else B) else 0
        peak = max(peak, live)
    return peak


def interleaved_bubble_fraction(p: int, v: int, m: int) -> float:
    """The textbook bubble of interleaved 1F1B, ``(p - 1) / (v m + p - 1)`` (v = 1: 1F1B's)."""
    return (p - 1) / (v * m + p - 1)
