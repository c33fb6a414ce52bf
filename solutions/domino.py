"""Lab `domino`: hide tensor-parallel all-reduces behind the compute of other batch chunks.

Lesson 6 (``lessons/06_domino.py``) explains why vanilla TP waits and how Domino (arXiv
2409.15241) cuts the batch into ``p`` chunks so that one chunk's all-reduce travels while
another chunk computes, forward and backward. You write the handle registry, the autograd
functions that start and wait, ``schedule`` (the order of events: a pure function, graded at
once without ranks), the executor's events (``settle``, ``prepare``, ``compute``) and the column
split of B. The stack itself (``TPStack``, ``compute_A``, ``compute_B``, ``finish``,
``head_loss``, vanilla TP) is given in ``workbook/tp_stack.py``.

Run it: ``workbook run domino``, ``python labs/domino.py`` or ``torchrun --nproc_per_node=2
labs/domino.py``; grade it: ``workbook grade --lab domino``; compare: ``workbook bench domino``.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from workbook.tensor_parallel.layer_stack import (HEAD, Stage, TPStack, compute_A, compute_B, even_slices, finish,
                               head_loss, pre_norm, stages, vanilla_tp_forward)

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")     # kernels start in launch order (lesson 6)


# --------------------------------------------------------------------------- handle registry
def handle_key(layer, sublayer: str, chunk: int, phase: str) -> str:
    """The readable name of one collective, e.g. ``layer1.mlp.chunk3.bwd``."""
    return f"layer{layer}.{sublayer}.chunk{chunk}.{phase}"


class HandleRegistry:
    """Async all-reduces by name, from the moment one starts until it is waited on."""

    def __init__(self):
        self._open: dict[str, object] = {}

    def put(self, key: str, work) -> None:
        """Keep ``work`` under ``key``; a key still open is an error (its handle would be lost)."""
        ### BEGIN SOLUTION hint: an open key must not be overwritten: raise a RuntimeError that names it
        if key in self._open:
            raise RuntimeError(f"handle {key!r} started twice: the first one was never waited on")
        self._open[key] = work
        ### END SOLUTION

    def start(self, key: str, tensor: torch.Tensor) -> None:
        """Start the in-place all-reduce (sum) of ``tensor`` without waiting; keep it under ``key``."""
        ### BEGIN SOLUTION hint: torch.distributed returns a work handle instead of blocking when asked to
        self.put(key, dist.all_reduce(tensor, async_op=True))
        ### END SOLUTION

    def wait(self, key: str) -> None:
        """Wait for the work under ``key`` and forget it; an unknown key is an error."""
        with torch.profiler.record_function(f"link_wait:{key}"):     # the trace names each wait
            ### BEGIN SOLUTION hint: take the work out of the registry (unknown key: a RuntimeError naming it), then wait on it
            work = self._open.pop(key, None)
            if work is None:
                raise RuntimeError(f"no open handle {key!r} to wait on (never started, or waited twice)")
            work.wait()
            ### END SOLUTION

    def pending(self) -> list[str]:
        """The keys started and not yet waited on, in start order."""
        return list(self._open)

    def check_empty(self, where: str = "the end of the step") -> None:
        """Raise, naming every open key, unless every handle has been waited on."""
        ### BEGIN SOLUTION hint: a RuntimeError that says where and lists every pending key
        if self._open:
            raise RuntimeError(f"{len(self._open)} handle(s) never waited on at {where}: "
                               + ", ".join(self._open))
        ### END SOLUTION


# --------------------------------------------------------------------------- start and wait
class StartAllReduce(torch.autograd.Function):
    """Forward: start the all-reduce of a partial sum in place (``registry.start``); identity
    backward. The returned tensor holds the sum only after ``registry.wait(key)``."""

    @staticmethod
    def forward(ctx, x, registry, key):
        ### BEGIN SOLUTION hint: x is changed in place after this returns: tell autograd (ctx.mark_dirty), start, return x
        ctx.mark_dirty(x)
        registry.start(key, x)
        return x
        ### END SOLUTION

    @staticmethod
    def backward(ctx, g):
        return g, None, None


class _KeyedIdentity(torch.autograd.Function):
    """Identity forward that keeps the registry and the key for its backward."""

    @staticmethod
    def forward(ctx, x, registry, key):
        ctx.registry, ctx.key = registry, key
        return x.view_as(x)


class AsyncCopyToTP(_KeyedIdentity):
    """Domino's f: identity forward; backward *starts* the all-reduce of the input gradient
    under ``key`` and passes it on unreduced (``WaitInBackward`` waits for it later)."""

    @staticmethod
    def backward(ctx, g):
        ### BEGIN SOLUTION hint: an all-reduce needs a contiguous tensor; start it, do not wait
        g = g.contiguous()
        ctx.registry.start(ctx.key, g)
        return g, None, None
        ### END SOLUTION


class WaitInBackward(_KeyedIdentity):
    """The paper's no-op: identity forward; backward waits for the handle ``key`` first."""

    @staticmethod
    def backward(ctx, g):
        ### BEGIN SOLUTION hint: the gradient is whole only once its all-reduce (this key) is done
        ctx.registry.wait(ctx.key)
        return g, None, None
        ### END SOLUTION


# --------------------------------------------------------------------------- the schedule
def schedule(stages: list[Stage], p: int, lookahead: int = 1, inter_layer: bool = True) -> list[tuple]:
    """The order of one forward pass, events ``(kind, stage, chunk)`` that hide each all-reduce.

    A pure function of its arguments (no tensors, no ranks). A *unit* is ``(stage, k)``: units
    go stage by stage, chunks 0..p-1 within a stage. Each unit has a ``"prepare"`` (wait for
    chunk k's previous all-reduce, norm) and a ``"compute"`` (A, B, start the all-reduce). Unit
    n + ``lookahead`` is prepared right before unit n computes (``0 <= lookahead < p``), so that
    in the backward, which autograd runs in reverse, unit n's compute lies between the start and
    the wait of unit n + lookahead's all-reduce.
    ``inter_layer=False``: each layer (and the head) is its own run of units, and a layer's run
    ends with a ``("wait", its last stage, k)`` per chunk k: no all-reduce crosses a layer.
    """
    ### BEGIN SOLUTION hint: cut the stages into runs (all of them, or one per stage.layer); walk each run's units with two cursors, prepare running `lookahead` units ahead of compute; close a layer's run with its waits
    runs = [stages] if inter_layer else \
        [[s for s in stages if s.layer == layer] for layer in dict.fromkeys(s.layer for s in stages)]
    events = []
    for run in runs:
        units = [(stage, k) for stage in run for k in range(p)]
        for n in range(len(units) + lookahead):
            if n < len(units):
                events.append(("prepare", *units[n]))
            if n >= lookahead:
                events.append(("compute", *units[n - lookahead]))
        if not inter_layer and run[-1] != HEAD:
            events += [("wait", run[-1], k) for k in range(p)]
    return events
    ### END SOLUTION


# --------------------------------------------------------------------------- the executor
class Chunks:
    """What the executor keeps between events: per chunk k its hidden state ``xs[k]`` (rows
    ``rows[k]`` of the batch), the normed input a prepare hands to its compute (``ready``), the
    partial sum whose all-reduce is in flight (``inflight[k] = (stage, tensor)``), the losses."""

    def __init__(self, m: TPStack, x, targets, p: int, registry: HandleRegistry, step: int):
        self.m, self.targets, self.registry, self.step = m, targets, registry, step
        self.batch, self.rows = x.shape[0], even_slices(x.shape[0], p, "batch rows")
        self.xs = [x[r] for r in self.rows]
        self.ready: dict[tuple, torch.Tensor] = {}
        self.inflight: dict[int, tuple] = {}
        self.losses: list[torch.Tensor] = []


def settle(c: Chunks, k: int) -> None:
    """Wait for chunk k's all-reduce in flight, if any (key ``...fwd``), and ``finish`` it."""
    ### BEGIN SOLUTION hint: nothing to do unless chunk k has one in flight; after the wait, finish() adds bias, dropout and the residual onto c.xs[k]
    if k in c.inflight:
        (layer, sub), y = c.inflight.pop(k)
        c.registry.wait(handle_key(layer, sub, k, "fwd"))
        c.xs[k] = finish(c.m, layer, sub, y, c.xs[k], c.rows[k], c.batch, c.step)
    ### END SOLUTION


def prepare(c: Chunks, stage: Stage, k: int) -> None:
    """Chunk k's input to ``stage``: settle the chunk; then (not for the head) its pre-norm,
    through ``WaitInBackward`` (key ``...bwd``), into ``c.ready[stage, k]``."""
    ### BEGIN SOLUTION hint: the no-op goes on the normed input, keyed like the f of the same unit
    settle(c, k)
    if stage != HEAD:
        h = pre_norm(c.m, stage, c.xs[k])
        c.ready[stage, k] = WaitInBackward.apply(h, c.registry, handle_key(*stage, k, "bwd"))
    ### END SOLUTION


def compute(c: Chunks, stage: Stage, k: int) -> None:
    """Chunk k's stage: its share of the loss at the head; else f, A, B and the started all-reduce.

    A sublayer runs ``AsyncCopyToTP`` (key ``...bwd``), ``compute_A``, ``compute_B``, then
    ``StartAllReduce`` (key ``...fwd``), left in flight in ``c.inflight[k]``; the head adds
    ``head_loss`` of the chunk (over all tokens) to ``c.losses``."""
    ### BEGIN SOLUTION hint: use the input prepare left in c.ready; the loss divides by every target's count, not the chunk's
    if stage == HEAD:
        c.losses.append(head_loss(c.m, c.xs[k], c.targets[c.rows[k]], c.targets.numel()))
        return
    layer, sub = stage
    h = AsyncCopyToTP.apply(c.ready.pop((stage, k)), c.registry, handle_key(layer, sub, k, "bwd"))
    y = compute_B(c.m, layer, sub, compute_A(c.m, layer, sub, h))
    c.inflight[k] = (stage, StartAllReduce.apply(y, c.registry, handle_key(layer, sub, k, "fwd")))
    ### END SOLUTION


def domino_forward(m: TPStack, x, targets, p: int, registry: HandleRegistry, *, step: int = 0,
                   inter_layer: bool = True, lookahead: int = 1):
    """Row-split Domino, the executor: run ``schedule``'s events on this rank (a ``"wait"`` is a
    ``settle``). Returns ``(loss, hidden)``, equal to ``vanilla_tp_forward`` (hidden: the chunks
    joined in batch order)."""
    if not 0 <= lookahead < p:
        raise ValueError(f"lookahead={lookahead} must be at least 0 and smaller than p={p}: a chunk "
                         "can only be prepared once its previous all-reduce has started")
    c = Chunks(m, x, targets, p, registry, step)
    for kind, stage, k in schedule(stages(m.cfg.n_layers), p, lookahead, inter_layer):
        if kind == "prepare":
            prepare(c, stage, k)
        elif kind == "compute":
            compute(c, stage, k)
        else:
            settle(c, k)
    return sum(c.losses), torch.cat(c.xs, dim=0)


# --------------------------------------------------------------------------- column split of B
def column_split_forward(m: TPStack, x, targets, p: int, registry: HandleRegistry, *, step: int = 0):
    """The contrast, forward only: split B's output features into ``p`` pieces. Piece j's
    all-reduce (key ``layer{i}.{sub}.chunk{j}.col``) travels while piece j+1 is computed; all
    pieces are waited for and joined before the residual add, because the next norm needs every
    feature. Returns ``(loss, hidden)``; use it under ``torch.no_grad()``."""
    B, cols = x.shape[0], even_slices(m.cfg.hidden, p, "output features of B")
    for stage in stages(m.cfg.n_layers)[:-1]:
        layer, sub = stage
        a = compute_A(m, layer, sub, pre_norm(m, stage, x))
        ### BEGIN SOLUTION hint: start every piece's all-reduce before waiting for any; join the pieces along the features, then finish()
        pieces = []
        for j, c in enumerate(cols):
            y = compute_B(m, layer, sub, a, cols=c).contiguous()
            registry.start(handle_key(layer, sub, j, "col"), y)
            pieces.append(y)
        for j in range(p):
            registry.wait(handle_key(layer, sub, j, "col"))
        x = finish(m, layer, sub, torch.cat(pieces, dim=-1), x, slice(None), B, step)
        ### END SOLUTION
    return head_loss(m, x, targets, targets.numel()), x


# --------------------------------------------------------------------------- one training step
def train_step(m: TPStack, x, targets, *, variant: str = "domino", p: int = 4, step: int = 0,
               registry: HandleRegistry | None = None, lookahead: int = 1):
    """Forward (``record_function("forward")``) and backward (``"backward"``) of one variant:
    ``vanilla_tp``, ``no_comm``, ``domino_intra`` or ``domino``. Returns the loss; the registry
    is checked empty at the end."""
    registry = registry if registry is not None else HandleRegistry()
    with torch.profiler.record_function("forward"):
        if variant in ("vanilla_tp", "no_comm"):
            loss, _ = vanilla_tp_forward(m, x, targets, step, comm=variant == "vanilla_tp")
        else:
            loss, _ = domino_forward(m, x, targets, p, registry, step=step,
                                     inter_layer=variant == "domino", lookahead=lookahead)
    with torch.profiler.record_function("backward"):
        loss.backward()
    registry.check_empty(f"the end of step {step}")
    return loss.detach()


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
