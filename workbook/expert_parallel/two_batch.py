"""Two micro-batches through one MoE layer: the actions, their dependencies, and a schedule check.

A given piece of lab ``ep_overlap`` (lesson 13, section 7, "Two micro-batches against each other").
DeepSeek-V3 (arXiv 2412.19437: section 3.4.1 for serving; DualPipe, section 3.2.1, for training)
hides expert parallelism's all-to-alls by running two micro-batches, ``A`` and ``B`` (each half of
a rank's tokens), against each other: while A's tokens travel, B computes, and the other way round.
A schedule is a list of *actions*, each a tuple ``(kind, micro_batch, step)``; ``kind`` is
``"compute"``, ``"start"`` (an all-to-all issued, ``async_op=True``) or ``"wait"`` (its work handle
waited on)::

    forward, per micro-batch X:                 backward, per micro-batch X:
    compute X router     the router (+ the      start   X combine   the combine's backward: the
                         shared expert), the                        output's gradient to the experts
                         counts exchanged       wait    X combine
    start   X dispatch   tokens to the experts  compute X experts   the experts' backward (dgrad)
    wait    X dispatch                          start   X dispatch  the dispatch's backward: the
    compute X experts    the local experts                          rows' gradients home
    start   X combine    results home           compute X wgrad     the experts' weight gradients
    wait    X combine    (un-permuted, weighted)                    (only when deferred)
                                                wait    X dispatch
                                                compute X router    the router's, shared expert's
                                                                    and input's gradients

Each line depends on the one above it (``wgrad`` on ``experts`` only). :func:`check_schedule`
checks that a schedule runs (every action once, dependencies first) and that it *hides*: when
it waits for a transfer, no compute action that was ready was left for after the wait with
nothing computed since the transfer started, and only one transfer per pass is left with
nothing to hide it. It raises ``ScheduleError`` with a one-line message.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

Action = Tuple[str, str, str]                    # (kind, micro-batch, step)
MICRO_BATCHES = ("A", "B")
KINDS = ("compute", "start", "wait")
PHASES = ("forward", "backward")


class ScheduleError(ValueError):
    """A two-micro-batch schedule that does not run, or does not hide its transfers."""


def layer_actions(phase: str, deferred_wgrad: bool = False) -> Dict[Action, Tuple[Action, ...]]:
    """Every action of one micro-batch pair through the layer in ``phase``, with the actions
    each depends on (the table in the module docstring), in one valid order (A's, then B's)."""
    if phase not in PHASES:
        raise ScheduleError(f"phase={phase!r}: use 'forward' or 'backward'")
    deps: Dict[Action, Tuple[Action, ...]] = {}
    for mb in MICRO_BATCHES:
        if phase == "forward":
            chain = [("compute", mb, "router"), ("start", mb, "dispatch"), ("wait", mb, "dispatch"),
                     ("compute", mb, "experts"), ("start", mb, "combine"), ("wait", mb, "combine")]
        else:
            chain = [("start", mb, "combine"), ("wait", mb, "combine"), ("compute", mb, "experts"),
                     ("start", mb, "dispatch"), ("wait", mb, "dispatch"), ("compute", mb, "router")]
        for i, action in enumerate(chain):
            deps[action] = (chain[i - 1],) if i else ()
        if phase == "backward" and deferred_wgrad:
            deps[("compute", mb, "wgrad")] = (("compute", mb, "experts"),)
    return deps


def name(action: Action) -> str:
    """``("wait", "A", "dispatch")`` -> ``"wait A.dispatch"``, the form messages use."""
    kind, mb, step = action
    return f"{kind} {mb}.{step}"


def check_schedule(schedule: Sequence[Action], phase: str, deferred_wgrad: bool = False) -> None:
    """Return quietly when ``schedule`` runs and hides; else raise ``ScheduleError`` (one line).

    Runs: every action of ``layer_actions(phase, deferred_wgrad)`` exactly once, each after the
    actions it depends on. Hides: at each ``wait`` of a transfer started at position ``s``, if
    no compute ran since ``s`` while some compute action was ready (all its dependencies done)
    and not yet run, the wait came too early: that compute should have gone first. And at most
    one transfer per pass travels with no compute between its start and its wait (in one layer,
    the last of the forward and the first of the backward have nothing left to hide behind)."""
    deps = layer_actions(phase, deferred_wgrad)
    if not isinstance(schedule, (list, tuple)):
        raise ScheduleError(f"the {phase} schedule must be a list of (kind, micro_batch, step) "
                            f"tuples, got {type(schedule).__name__}")
    done: List[Action] = []
    started_at: Dict[Tuple[str, str], int] = {}
    for i, action in enumerate(schedule):
        if not isinstance(action, (list, tuple)) or len(action) != 3:
            raise ScheduleError(f"step {i}: {action!r} is not a (kind, micro_batch, step) tuple")
        action = tuple(action)
        if action not in deps:
            raise ScheduleError(f"step {i}: {action!r} is not an action of the {phase} pass "
                                f"(known: {', '.join(name(a) for a in deps)})")
        if action in done:
            raise ScheduleError(f"step {i}: {name(action)} appears twice")
        missing = [d for d in deps[action] if d not in done]
        if missing:
            raise ScheduleError(f"step {i}: {name(action)} before {name(missing[0])}, which it "
                                f"depends on")
        kind, mb, step = action
        if kind == "start":
            started_at[(mb, step)] = i
        elif kind == "wait":
            s = started_at[(mb, step)]
            computed = any(a[0] == "compute" for a in schedule[s + 1:i])
            ready = [a for a in deps if a[0] == "compute" and a not in done
                     and all(d in done for d in deps[a])]
            if not computed and ready:
                raise ScheduleError(
                    f"step {i}: {name(action)} waits for the transfer at once, while "
                    f"{name(ready[0])} was ready and does not need it: run it between "
                    f"start {mb}.{step} and the wait, so {mb}'s tokens travel while "
                    f"{ready[0][1]} computes")
        done.append(action)
    left = [a for a in deps if a not in done]
    if left:
        raise ScheduleError(f"the {phase} schedule never runs {name(left[0])}"
                            + (f" (and {len(left) - 1} more)" if len(left) > 1 else ""))
    exposed = exposed_transfers(schedule)
    if len(exposed) > 1:
        unavoidable = exposed[-1] if phase == "forward" else exposed[0]
        avoidable = [t for t in exposed if t != unavoidable]
        raise ScheduleError(
            f"{len(exposed)} transfers of the {phase} pass travel with nothing computed "
            f"({', '.join(exposed)}); only the {'last' if phase == 'forward' else 'first'} one "
            f"has to: wait for {avoidable[0]} only after the other micro-batch has computed")


def exposed_transfers(schedule: Sequence[Action]) -> List[str]:
    """The transfers (``"A.dispatch"``, ...) with no compute between their start and their wait:
    the ones nothing hides (in a one-layer schedule, the last of the forward and the first of
    the backward can only hide behind the next layer, lesson 13, section 7)."""
    out, started = [], {}
    for i, (kind, mb, step) in enumerate(schedule):
        if kind == "start":
            started[(mb, step)] = i
        elif kind == "wait" and not any(a[0] == "compute"
                                        for a in schedule[started[(mb, step)] + 1:i]):
            out.append(f"{mb}.{step}")
    return out
