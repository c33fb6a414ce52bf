"""The given pieces of pipeline parallelism, for lab ``pp_overlap``.

Pipeline parallelism (PP) cuts the model by depth: rank s holds *stage* s, a run of consecutive
layers, and the batch is cut into ``m`` micro-batches that flow through the stages like cars on
an assembly line (GPipe, Huang et al. 2019, arXiv 1811.06965). A stage sends its output
activation ``[b, S, H]`` to stage s + 1 and, in the backward pass, the gradient of its input
back to stage s - 1: point-to-point traffic only, ``b*S*H`` elements per micro-batch per hop.

A stage idles while the pipeline fills and drains. With ``p`` stages, ``m`` micro-batches and a
backward that takes a fixed multiple of the forward, every stage is busy for ``m`` units of
work out of ``m + p - 1``, so the *bubble* is::

    bubble = (p - 1) / (m + p - 1)                      (Narayanan et al. 2021, arXiv 2104.04473)

for GPipe (all forwards, then all backwards) and for 1F1B (one forward, one backward in the
steady state, PipeDream-Flush) alike; 1F1B keeps at most ``p - s`` micro-batches' activations
alive on stage s instead of ``m``. The sends and receives of the steady state can travel while
the stage computes another micro-batch (NeMo overlaps them by default); those of the fill and
the drain cannot.

What the lab builds on, written once here:

* ``stage_units`` / ``PipelineStage``: stage s's layers of the reference model, with the
  reference weights (weights are made by name), and the loss of a micro-batch;
* ``micro_batches``: the batch cut into ``m`` equal micro-batches;
* schedules as data: one list of actions per stage, ``("F", i)`` or ``("B", i)`` for micro-batch
  i; ``check_schedule`` proves a set of them complete and free of deadlock *before any rank
  runs*, and ``simulate`` plays them on paper (bubble, step time, activations in flight);
* ``StageExecutor``: runs one stage's actions in order, each inside a ``record_function``
  range named after its phase (``warmup``, ``steady``, ``cooldown``) and the action (``F3``),
  so the trace shows the schedule; the lab writes the executors' steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function

from workbook.model import Block, Embedding, LMHead, ModelConfig
from workbook.model.reference import make_norm

F, B = "F", "B"
Action = tuple            # ("F", i) or ("B", i)


# --------------------------------------------------------------------------- stages of the model
def stage_units(n_layers: int, p: int) -> list[list[str]]:
    """Which units each of ``p`` stages holds: the blocks split as evenly as possible (earlier
    stages take the extra ones), the embedding on the first stage, the final norm and the head
    on the last. ``stage_units(4, 2) == [["embed", "blocks.0", "blocks.1"], ["blocks.2",
    "blocks.3", "norm_f", "head"]]``."""
    if not 1 <= p <= n_layers:
        raise ValueError(f"{p} pipeline stages need 1 to n_layers={n_layers} blocks to hold: use "
                         f"a model with at least {p} layers, or fewer ranks")
    per, extra = divmod(n_layers, p)
    out, first = [], 0
    for s in range(p):
        count = per + (s < extra)
        out.append([f"blocks.{i}" for i in range(first, first + count)])
        first += count
    out[0].insert(0, "embed")
    out[-1] += ["norm_f", "head"]
    return out


class PipelineStage(nn.Module):
    """Stage ``stage`` of ``p``: its layers of ``ReferenceModel(cfg)``, the same weights.

    ``forward(x)``: tokens ``[b, S]`` on the first stage, an activation ``[b, S, H]`` elsewhere;
    returns the activation ``[b, S, H]`` for the next stage, or the logits ``[b, S, V]`` on the
    last. ``loss(logits, targets, m)`` is the micro-batch's mean cross-entropy over ``m``: the
    ``m`` micro-batches' losses then add up to the whole batch's mean loss, and so do their
    gradients."""

    def __init__(self, cfg: ModelConfig, stage: int, p: int, device=None):
        super().__init__()
        self.cfg, self.stage, self.p = cfg, stage, p
        self.is_first, self.is_last = stage == 0, stage == p - 1
        self.unit_names = stage_units(cfg.n_layers, p)[stage]
        self.embed = Embedding(cfg, "embed") if self.is_first else None
        self.blocks = nn.ModuleList(Block(cfg, int(u.split(".")[1]))
                                    for u in self.unit_names if u.startswith("blocks."))
        self.norm_f = make_norm(cfg, "norm_f") if self.is_last else None
        self.head = LMHead(cfg, "head") if self.is_last else None
        if device is not None:
            self.to(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.is_first else x                # [b, S] -> [b, S, H]
        for block in self.blocks:
            h = block(h)                                         # [b, S, H]
        return self.head(self.norm_f(h)) if self.is_last else h  # [b, S, V] | [b, S, H]

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, m: int) -> torch.Tensor:
        return LMHead.loss(logits, targets) / m

    def named_grads(self) -> dict:
        """Each parameter's gradient by its name in the reference model."""
        out = {}
        for module in (self.embed, *self.blocks, self.norm_f, self.head):
            if module is not None:
                for local, prm in module.named_parameters():
                    out[f"{module.name}.{local}"] = None if prm.grad is None else prm.grad.detach().clone()
        return out


def micro_batches(tokens: torch.Tensor, targets: torch.Tensor, m: int) -> list[tuple]:
    """``m`` equal micro-batches ``(tokens [b, S], targets [b, S])`` of a ``[m*b, S]`` batch."""
    if tokens.shape[0] % m:
        raise ValueError(f"a batch of {tokens.shape[0]} rows does not cut into {m} equal "
                         f"micro-batches: use a multiple of {m} rows")
    return list(zip(tokens.chunk(m), targets.chunk(m)))


def activation_shape(cfg: ModelConfig, rows: int) -> tuple:
    """The ``[b, S, H]`` tensor that crosses every stage boundary, both ways."""
    return (rows, cfg.seq_len, cfg.hidden)


# --------------------------------------------------------------------------- schedules on paper
class ScheduleError(ValueError):
    """A set of per-stage schedules that is incomplete, out of order, or would deadlock."""


def check_schedule(schedules: list[list[Action]], m: int) -> None:
    """Raise ``ScheduleError`` (one line, naming the stage and the action) unless every stage
    runs ``F(i)`` and ``B(i)`` exactly once for each of the ``m`` micro-batches, each ``F(i)``
    before its ``B(i)``, and the stages together cannot deadlock (``simulate`` finishes)."""
    p = len(schedules)
    for s, acts in enumerate(schedules):
        want = sorted((k, i) for k in (F, B) for i in range(m))
        if sorted(map(tuple, acts)) != want:
            missing = sorted(set(want) - set(map(tuple, acts)))
            extra = [a for a in acts if tuple(a) not in want or list(acts).count(a) > 1]
            raise ScheduleError(
                f"stage {s} of {p}: a schedule runs F(i) and B(i) once for each of the {m} "
                f"micro-batches; " + (f"missing {_names(missing)}" if missing else "")
                + ("; " if missing and extra else "") + (f"extra {_names(extra)}" if extra else ""))
        done = set()
        for kind, i in acts:
            if kind == B and (F, i) not in done:
                raise ScheduleError(f"stage {s} of {p}: B({i}) comes before F({i}): a micro-batch's "
                                    f"backward needs the activations of its forward")
            done.add((kind, i))
    simulate(schedules)


def _names(actions) -> str:
    return ", ".join(f"{k}({i})" for k, i in actions)


@dataclass
class Timeline:
    """A schedule played on paper: per stage, ``(start, end, "F3")`` spans in units of time."""
    spans: list[list[tuple]] = field(default_factory=list)
    step: float = 0.0

    def busy(self, stage: int) -> float:
        return sum(e - s for s, e, _ in self.spans[stage])

    @property
    def bubble(self) -> float:
        """Share of the stage-time the stages sit idle: ``1 - sum(busy) / (p * step)``."""
        p = len(self.spans)
        return 1.0 - sum(self.busy(s) for s in range(p)) / (p * self.step) if self.step else 0.0


def simulate(schedules: list[list[Action]], t_fwd: float = 1.0, t_bwd: float = 2.0,
             t_p2p: float = 0.0) -> Timeline:
    """Play the schedules: each stage runs its actions in order, an action as soon as the stage
    is free and its input has arrived (``F(i)`` on stage s needs stage s - 1's ``F(i)``, ``B(i)``
    needs stage s + 1's ``B(i)``, each ``t_p2p`` after it ended). Sends never block (they are
    posted asynchronously), so the only waits are for data. Raises ``ScheduleError`` naming
    what each stuck stage waits for if no stage can move: a deadlock."""
    p = len(schedules)
    t = {F: t_fwd, B: t_bwd}
    end: dict = {}                                   # (stage, kind, i) -> end time
    nxt, free = [0] * p, [0.0] * p
    line = Timeline([[] for _ in range(p)])
    while any(nxt[s] < len(schedules[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while nxt[s] < len(schedules[s]):
                kind, i = schedules[s][nxt[s]]
                src = s - 1 if kind == F else s + 1
                if 0 <= src < p and (src, kind, i) not in end:
                    break                            # its input is not made yet
                ready = end[(src, kind, i)] + t_p2p if 0 <= src < p else 0.0
                start = max(free[s], ready)
                free[s] = end[(s, kind, i)] = start + t[kind]
                line.spans[s].append((start, free[s], f"{kind}{i}"))
                nxt[s] += 1
                moved = True
        if not moved:
            stuck = []
            for s in range(p):
                if nxt[s] < len(schedules[s]):
                    kind, i = schedules[s][nxt[s]]
                    src = s - 1 if kind == F else s + 1
                    what = "activation" if kind == F else "gradient"
                    stuck.append(f"stage {s} waits at {kind}({i}) for stage {src}'s {what}")
            raise ScheduleError("deadlock: " + "; ".join(stuck)
                                + " -- no stage can move, so these ranks would hang for ever")
    line.step = max(free)
    return line


def bubble_fraction(p: int, m: int) -> float:
    """The textbook bubble, ``(p - 1) / (m + p - 1)``."""
    return (p - 1) / (m + p - 1)


def peak_in_flight(actions: list[Action]) -> int:
    """The most micro-batches whose forward has run and backward not yet, on one stage: the
    activations it must keep (GPipe: ``m``; 1F1B: at most ``p - s``)."""
    live = peak = 0
    for kind, _ in actions:
        live += 1 if kind == F else -1
        peak = max(peak, live)
    return peak


def phases(actions: list[Action]) -> list[str]:
    """``warmup`` (the forwards before the first backward), ``cooldown`` (the backwards after
    the last forward), ``steady`` in between, for each action."""
    kinds = [k for k, _ in actions]
    first_b = kinds.index(B) if B in kinds else len(kinds)
    last_f = len(kinds) - 1 - kinds[::-1].index(F) if F in kinds else -1
    return ["warmup" if k < first_b else "cooldown" if k > last_f else "steady"
            for k in range(len(actions))]


# --------------------------------------------------------------------------- one stage on its rank
class StageExecutor:
    """Runs stage ``dist.get_rank()``'s actions, in order, on its rank.

    ``step(tokens, targets, actions)`` cuts the batch into micro-batches, then calls
    ``forward_step(i)`` / ``backward_step(i)`` for each action inside ``record_function``
    ranges (``warmup`` / ``steady`` / ``cooldown``, then ``F3``), then ``finish()``; returns the
    sum of the micro-batch losses on the last stage (the batch's mean loss), else None.
    ``self.prev`` / ``self.next`` are the neighbouring ranks (None at the ends)."""

    def __init__(self, cfg: ModelConfig, m: int, device=None):
        self.cfg, self.m, self.device = cfg, m, device
        self.rank, self.p = dist.get_rank(), dist.get_world_size()
        self.stage = PipelineStage(cfg, self.rank, self.p, device)
        self.prev = self.rank - 1 if self.rank > 0 else None
        self.next = self.rank + 1 if self.rank < self.p - 1 else None

    def empty_activation(self) -> torch.Tensor:
        """A buffer for one micro-batch's activation or its gradient, ``[b, S, H]``."""
        return torch.empty(activation_shape(self.cfg, self.rows), dtype=self.cfg.torch_dtype,
                           device=self.device)

    def receive_for(self, k: int):
        """``(peer, buffer)`` for the tensor action ``k`` receives, or None: a forward takes
        the activation from ``self.prev``, a backward the gradient of its output from
        ``self.next`` (the first and last stages have none; ``k`` past the end has none)."""
        if not 0 <= k < len(self.actions):
            return None
        peer = self.prev if self.actions[k][0] == F else self.next
        return None if peer is None else (peer, self.empty_activation())

    def step(self, tokens: torch.Tensor, targets: torch.Tensor, actions: list[Action]):
        self.batches = micro_batches(tokens, targets, self.m)
        self.rows = self.batches[0][0].shape[0]
        self.actions, self.losses = list(actions), []
        self.inputs: dict = {}                   # micro-batch -> this stage's input (kept for B)
        self.outputs: dict = {}                  # micro-batch -> this stage's output (or loss)
        self.stage.zero_grad(set_to_none=True)
        for k, ((kind, i), phase) in enumerate(zip(self.actions, phases(self.actions))):
            self.position = k                    # the action running now
            with record_function(phase), record_function(f"{kind}{i}"):
                (self.forward_step if kind == F else self.backward_step)(i)
        self.finish()
        return sum(self.losses) if self.stage.is_last else None

    def forward_step(self, i: int) -> None:
        raise NotImplementedError

    def backward_step(self, i: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Runs after the last action (wait for what is still in flight)."""
