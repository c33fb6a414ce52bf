"""Lab `domino`: hide tensor-parallel all-reduces behind the compute of other batch chunks.

Lesson 6 (``lessons/06_domino.py``) explains why vanilla TP waits on every all-reduce and how
Domino (arXiv 2409.15241) cuts the batch into chunks so that one chunk's all-reduce travels while
another chunk computes, in the forward and in the backward pass. You build:

1. the handle registry: asynchronous all-reduces kept by name until they are waited on;
2. the autograd functions that start and wait for them, in the forward and in the backward pass;
3. ``schedule``: the order of one forward pass's events, a pure function graded at once;
4. the executor's three events, which ``domino_forward`` runs in your schedule's order;
5. ``column_split_forward``: the contrast, B split by output features;
6. ``predict_exposed_ms``: before the run, how much communication your Domino step leaves exposed.

The stack itself (``TPStack``, its sublayers' halves, the head, vanilla TP) is given in
``workbook/tensor_parallel/layer_stack.py``.

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
    """Asynchronous all-reduces by name, from the moment one starts until it is waited on
    (lesson 6, "The handle registry").

    A handle must outlive the code that started it: a forward all-reduce is waited on by a later
    event of the same chunk, a backward one by another autograd node. The registry keeps every
    open handle under its key, in start order, and turns each way of losing one into an error
    that names the key. It is subclassed by the grader and by the benchmarks (which replace how
    an all-reduce is started), so each method does only what its docstring says."""

    def __init__(self):
        self._open: dict[str, object] = {}

    def put(self, key: str, work) -> None:
        """Keep a work handle (an object whose wait method blocks until its collective is done)
        open under a key.

        Starting a key that is still open would lose the first handle: raise ``RuntimeError``
        naming the key, and keep the first one."""
        ### BEGIN SOLUTION
        ### hint 1: the registry is a dictionary of open handles; lesson 6, "The handle registry",
        ###     lists the three mistakes it turns into errors.
        ### hint 2: refuse a key that is already open (an error that names it), else remember the
        ###     handle under its key.
        ### hint 3: an open key must not be overwritten: raise a RuntimeError that names it;
        ###     else self._open[key] = work
        if key in self._open:
            raise RuntimeError(f"handle {key!r} started twice: the first one was never waited on")
        self._open[key] = work
        ### END SOLUTION

    def start(self, key: str, tensor: torch.Tensor) -> None:
        """Start the in-place all-reduce (sum over the default group) of a tensor and return
        without waiting for it; its handle stays open under the key. The given last line files
        it: subclasses change how a handle is filed, and must see every one."""
        ### BEGIN SOLUTION
        ### hint 1: a collective can return at once with a handle instead of blocking (lesson 3,
        ###     "The same step, asynchronous").
        ### hint 2: start the all-reduce so that it returns at once, and keep what it returns for
        ###     the line below.
        ### hint 3: torch.distributed returns a work handle instead of blocking when asked to:
        ###     work = dist.all_reduce(tensor, async_op=True)
        work = dist.all_reduce(tensor, async_op=True)
        ### END SOLUTION
        self.put(key, work)

    def wait(self, key: str) -> None:
        """Block until the all-reduce under the key is done, and forget it; a key that is not
        open (never started, or already waited on) is a ``RuntimeError`` naming the key. The
        given last line blocks on the handle you took out."""
        with torch.profiler.record_function(f"link_wait:{key}"):     # the trace names each wait
            ### BEGIN SOLUTION
            ### hint 1: waiting closes a handle: it leaves the registry, and a second wait on the
            ###     same key is a mistake the registry names (lesson 6, "The handle registry").
            ### hint 2: take the handle out of the registry, under the name the given line below
            ###     waits on; no handle under that key is an error naming the key.
            ### hint 3: take the work out of the registry (unknown key: a RuntimeError naming
            ###     it); the given line below waits on it
            work = self._open.pop(key, None)
            if work is None:
                raise RuntimeError(f"no open handle {key!r} to wait on (never started, or waited twice)")
            ### END SOLUTION
            work.wait()

    def pending(self) -> list[str]:
        """The keys started and not yet waited on, in start order."""
        return list(self._open)

    def check_empty(self, where: str = "the end of the step") -> None:
        """Return quietly when every handle has been waited on; else raise ``RuntimeError`` with
        a message that says where the check ran and names every key still open."""
        ### BEGIN SOLUTION
        ### hint 1: a handle left open at the end of a step is a sum that may never have arrived
        ###     (lesson 6, "The handle registry").
        ### hint 2: if anything is still open, raise an error whose message holds the place
        ###     given and every open key.
        ### hint 3: a RuntimeError that says where and lists every pending key
        if self._open:
            raise RuntimeError(f"{len(self._open)} handle(s) never waited on at {where}: "
                               + ", ".join(self._open))
        ### END SOLUTION


# --------------------------------------------------------------------------- start and wait
### BEGIN CHALLENGE: a Domino layer, whole: the start and wait functions, the schedule and its executor
class StartAllReduce(torch.autograd.Function):
    """The forward half of Megatron's g, asynchronous (lesson 6, "The row split").

    Applied to a partial sum, a registry and a key: starts the sum over ranks of that tensor *in
    place*, through the registry under the key, and returns the same tensor without waiting; it
    holds the sum only once the registry has waited on that key. Its backward passes the gradient
    through unchanged (g's backward is the identity)."""

    @staticmethod
    def forward(ctx, x, registry, key):
        ### BEGIN SOLUTION
        ### hint 1: an autograd function whose forward changes its input in place must say so, or
        ###     autograd may hand a stale tensor to the backward (lesson 6, "The row split").
        ### hint 2: declare the input modified in place, start its all-reduce through the
        ###     registry, and return the same tensor.
        ### hint 3: x is changed in place after this returns: tell autograd (ctx.mark_dirty),
        ###     registry.start(key, x), return x
        ctx.mark_dirty(x)
        registry.start(key, x)
        return x
        ### END SOLUTION

    @staticmethod
    def backward(ctx, g):
        return g, None, None


class _KeyedIdentity(torch.autograd.Function):
    """Identity forward (a new view of the input) that keeps the registry and the key for its
    backward: the base of the two functions below."""

    @staticmethod
    def forward(ctx, x, registry, key):
        ctx.registry, ctx.key = registry, key
        return x.view_as(x)


class AsyncCopyToTP(_KeyedIdentity):
    """Domino's f, asynchronous (lesson 6, "The backward pass: steering autograd").

    Applied to a tensor, a registry and a key: identity in the forward pass. In the backward pass
    the incoming gradient is a partial sum; *start* its all-reduce through the registry under the
    key and pass it on unreduced, without waiting (the no-op below, under the same key, waits for
    it later)."""

    @staticmethod
    def backward(ctx, g):
        ### BEGIN SOLUTION
        ### hint 1: the backward half of Megatron's f is an all-reduce of the input gradient;
        ###     Domino only starts it here (lesson 6, "The backward pass: steering autograd").
        ### hint 2: make sure the gradient can be communicated in place, start its all-reduce
        ###     under the key this node kept, and return it (the registry's wait comes later).
        ### hint 3: an all-reduce needs a contiguous tensor: g = g.contiguous();
        ###     ctx.registry.start(ctx.key, g); return g, None, None
        g = g.contiguous()
        ctx.registry.start(ctx.key, g)
        return g, None, None
        ### END SOLUTION


class WaitInBackward(_KeyedIdentity):
    """The paper's no-op module (lesson 6, "The backward pass: steering autograd").

    Applied to a tensor, a registry and a key: identity in the forward pass; in the backward pass
    it waits, through the registry, for the all-reduce started under the key before the gradient
    flows on, so what flows on is the full sum."""

    @staticmethod
    def backward(ctx, g):
        ### BEGIN SOLUTION
        ### hint 1: the gradient that reaches the norm must be the whole sum, so the wait for the
        ###     asynchronous f sits here (lesson 6, "The backward pass: steering autograd").
        ### hint 2: wait, through the registry, for the key this node kept, then pass the
        ###     gradient on unchanged.
        ### hint 3: the gradient is whole only once its all-reduce (this key) is done:
        ###     ctx.registry.wait(ctx.key); return g, None, None
        ctx.registry.wait(ctx.key)
        return g, None, None
        ### END SOLUTION


# --------------------------------------------------------------------------- the schedule
def schedule(stages: list[Stage], p: int, lookahead: int = 1, inter_layer: bool = True) -> list[tuple]:
    """The order of one Domino forward pass: a list of events, each a tuple of a kind, a stage
    and a chunk.

    A pure function: no tensors, no ranks; it reads the stages (forward order, the head last) and
    never changes them, and gives the same list every call. A *unit* is one stage of one batch
    chunk (``0 <= chunk < p``); units go in stage order, chunks in increasing order within a
    stage. Each unit has exactly one ``"prepare"`` (its input made ready) and, later, exactly one
    ``"compute"`` (its matmuls, its all-reduce started); lesson 6, "The schedule", defines them.

    ``lookahead`` (``0 <= lookahead < p``) is how many units the prepares run ahead of the
    computes; the order must be the one of lesson 6, "The backward pass: steering autograd", so
    that autograd, running the forward's nodes in reverse, hides each backward all-reduce too.
    ``inter_layer=True``: all stages form one run of units, and nothing waits at a layer
    boundary. ``inter_layer=False``: each layer is a run of its own, closed by one ``"wait"``
    event per chunk (chunk order) for its last all-reduces (lesson 6, "The row split"); the head
    forms a run of its own without waits. Default: lookahead 1, inter-layer overlap."""
    ### BEGIN SOLUTION
    ### hint 1: a unit's prepare, in the backward, waits for its gradient's all-reduce; whatever
    ###     the forward creates between that prepare and the compute it feeds runs, in the
    ###     backward, while the all-reduce travels (lesson 6, "The backward pass: steering
    ###     autograd"). So prepares run a fixed number of units ahead of the computes.
    ### hint 2: cut the stages into runs (one run of everything, or one per layer); list each
    ###     run's units; emit prepares from the first unit on and computes starting `lookahead`
    ###     units later, one of each per step, until every unit has both; then close a layer's
    ###     run with a wait per chunk.
    ### hint 3: cut the stages into runs (all of them, or one per stage.layer); walk each run's
    ###     units with two cursors, prepare running `lookahead` units ahead of compute; close a
    ###     layer's run with its waits
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
    """What the executor keeps between events for one forward pass of one rank.

    Made from the stack, the batch's inputs x (``[batch, seq, hidden]``) and targets, the chunk
    count p (which must divide the batch), the registry and the step number (dropout masks
    depend on it). It holds per chunk k: the rows of the batch it owns and its hidden state, the
    normed input a prepare hands to its compute (keyed by unit), the partial sum whose forward
    all-reduce is in flight (with its stage), and the chunks' shares of the loss."""

    def __init__(self, m: TPStack, x, targets, p: int, registry: HandleRegistry, step: int):
        self.m, self.targets, self.registry, self.step = m, targets, registry, step
        self.batch, self.rows = x.shape[0], even_slices(x.shape[0], p, "batch rows")
        self.xs = [x[r] for r in self.rows]
        self.ready: dict[tuple, torch.Tensor] = {}
        self.inflight: dict[int, tuple] = {}
        self.losses: list[torch.Tensor] = []


def settle(c: Chunks, k: int) -> None:
    """The wait event of chunk k: bring the chunk's hidden state up to date.

    If the chunk has a forward all-reduce in flight (under its stage's forward key), wait for it
    and complete that sublayer for the chunk with the stack's given completion step (bias,
    dropout, residual; lesson 6, "The row split"). Nothing in flight: nothing to do."""
    ### BEGIN SOLUTION
    ### hint 1: a chunk's sublayer is only complete once its sum has arrived; lesson 6, "The row
    ###     split": the residual add needs the whole sum.
    ### hint 2: if the chunk has an all-reduce in flight, take it (and its stage) out of the
    ###     in-flight record, wait for its key, then run the given completion of the sublayer and
    ###     store the result as the chunk's new hidden state.
    ### hint 3: nothing to do unless chunk k has one in flight; after the wait, finish() adds
    ###     bias, dropout and the residual onto c.xs[k]
    if k in c.inflight:
        (layer, sub), y = c.inflight.pop(k)
        c.registry.wait(handle_key(layer, sub, k, "fwd"))
        c.xs[k] = finish(c.m, layer, sub, y, c.xs[k], c.rows[k], c.batch, c.step)
    ### END SOLUTION


def prepare(c: Chunks, stage: Stage, k: int) -> None:
    """The prepare event of a unit (a stage, chunk k): its input, made ready for its compute.

    Bring the chunk up to date (the wait event above); then, unless the stage is the head, its
    pre-norm, passed through the backward's no-op (the class above) under the unit's backward
    key, kept for the unit's compute (lesson 6, "The backward pass: steering autograd")."""
    ### BEGIN SOLUTION
    ### hint 1: the prepare is where the backward will wait, so the no-op belongs to it (lesson 6,
    ###     "The backward pass: steering autograd").
    ### hint 2: settle the chunk; for a sublayer, normalise its hidden state, put the result
    ###     through the no-op keyed like this unit's backward all-reduce, and keep it for the
    ###     compute of the same unit.
    ### hint 3: the no-op goes on the normed input, keyed like the f of the same unit:
    ###     c.ready[stage, k] = WaitInBackward.apply(pre_norm(...), c.registry,
    ###     handle_key(*stage, k, "bwd"))
    settle(c, k)
    if stage != HEAD:
        h = pre_norm(c.m, stage, c.xs[k])
        c.ready[stage, k] = WaitInBackward.apply(h, c.registry, handle_key(*stage, k, "bwd"))
    ### END SOLUTION


def compute(c: Chunks, stage: Stage, k: int) -> None:
    """The compute event of a unit (a stage, chunk k): its matmuls, its all-reduce started.

    At the head: the chunk's share of the loss (over the batch's token count, so that the shares
    add up to the batch's mean), kept with the losses. At a sublayer: the input the unit's
    prepare left, through the asynchronous f (the unit's backward key), the two given halves of
    the sublayer, then the forward start of the partial sum's all-reduce (the unit's forward
    key), left in flight for the chunk (lesson 6, "The row split"). Keys: the given naming, with
    phase fwd or bwd, e.g. layer0.mlp.chunk3.fwd."""
    ### BEGIN SOLUTION
    ### hint 1: a unit's compute is Megatron's f, A, B, g for one chunk, with g only started
    ###     (lesson 6, "The row split"); the head computes the chunk's loss.
    ### hint 2: at the head, add the loss of this chunk's rows, divided by every target's count;
    ###     else take the ready input, run it through the asynchronous f, the two halves, and start
    ###     the all-reduce of the result, remembering it (with the stage) as chunk k's in-flight
    ###     sum.
    ### hint 3: use the input prepare left in c.ready; the loss divides by every target's count,
    ###     not the chunk's; c.inflight[k] = (stage, StartAllReduce.apply(y, ...))
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
    """Row-split Domino, the executor: this rank's forward pass of the stack on x
    (``[batch, seq, hidden]``) and targets, with the batch cut into p chunks, run as the events
    of ``schedule`` (lookahead and inter_layer passed on) through the three event functions
    above. A lookahead outside ``0 <= lookahead < p`` is a ``ValueError``.

    Returns ``(loss, hidden)``: the batch's mean loss and the final hidden states, the chunks
    joined in batch order, equal to ``vanilla_tp_forward``'s; after the backward of the loss every
    started all-reduce has been waited on."""
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
### END CHALLENGE


# --------------------------------------------------------------------------- column split of B
def column_split_forward(m: TPStack, x, targets, p: int, registry: HandleRegistry, *, step: int = 0):
    """The contrast, forward only: B split by output features instead of the batch by rows.

    Lesson 6, "The contrast: splitting B by columns". Every sublayer computes its
    column-parallel half on the whole batch, then its row-parallel half in p pieces of B's output
    features; each piece's all-reduce (the given key naming with phase col, e.g.
    layer0.mlp.chunk2.col for piece 2) must travel while the later pieces are computed, and the
    sublayer completes (bias, dropout, residual) once every piece has arrived. Returns
    ``(loss, hidden)``, equal to vanilla TP's; call it under ``torch.no_grad()``; the registry
    ends empty."""
    B, cols = x.shape[0], even_slices(m.cfg.hidden, p, "output features of B")
    for stage in stages(m.cfg.n_layers)[:-1]:
        layer, sub = stage
        a = compute_A(m, layer, sub, pre_norm(m, stage, x))
        ### BEGIN SOLUTION
        ### hint 1: the next norm needs every feature of every token, so the pieces meet at the
        ###     end of the sublayer (lesson 6, "The contrast: splitting B by columns").
        ### hint 2: for each piece of the output features: compute that part of B's product and
        ###     start its all-reduce; only after the last piece started, wait for all of them; join
        ###     them along the feature dimension and complete the sublayer on the whole batch.
        ### hint 3: start every piece's all-reduce before waiting for any (compute_B(..., cols=c)
        ###     made contiguous); join the pieces along the features, then finish()
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


# --------------------------------------------------------------------------- the prediction
def predict_exposed_ms(link, model: dict, batch: int, p: int, ranks: int,
                       inter_layer: bool = True) -> float:
    """Predict, before running it, the exposed communication (ms) of one step of your Domino.

    Exposed: the link time during which the rank computes nothing, over one training step,
    forward and backward, lookahead 1 (lesson 6, "Predict before you run").

    The step: the stack of ``model["n_layers"]`` blocks and the head, TP over ``ranks`` ranks,
    a batch of ``batch`` sequences of ``model["seq_len"]`` tokens cut into ``p`` chunks, messages
    fp32, inter-layer overlap or not; ``model`` also holds ``hidden``, ``ffn_hidden``,
    ``vocab_size`` and ``heads``. ``link`` is a ``workbook.link.Link``: its latency per operation
    (s) and bus bandwidth (bytes/s) are the alpha-beta figures, its ``local_flops`` the matmul
    rate the machine measured; it carries one operation at a time, in issue order.

    The settings graded are compute-bound, with ``p >= 3``: every chunk's forward compute of a
    stage, the head's included, takes longer than one chunk's all-reduce. Return a float (ms).
    The grader compares it with the lesson's planner of the same schedule for several links,
    rank counts and shapes, and names the term of a known wrong derivation; the report puts your
    number beside the model and the measured run."""
    ### BEGIN SOLUTION
    ### hint 1: an all-reduce is exposed when nothing computes between its start and its wait;
    ###     lesson 6, "The backward pass: steering autograd" counts the units between them in
    ###     each pass, and "Predict before you run" prices one (vanilla) all-reduce: a chunk's
    ###     is priced the same way, with the chunk's share of the message.
    ### hint 2: price one chunk's all-reduce (latency, plus the chunk's fp32 activations times
    ###     the ring's bus factor over the bandwidth); then count the all-reduces with no compute
    ###     left to hide behind: with inter-layer overlap only the very last one of the backward
    ###     pass; without it, the last one of every layer, in both passes.
    ### hint 3: one = link.latency_s + 4 * batch * seq_len / p * hidden * 2 * (ranks - 1) /
    ###     ranks / link.bandwidth_Bps; exposed = one if inter_layer else 2 * n_layers * one
    ###     (in ms)
    chunk_bytes = 4.0 * batch * model["seq_len"] / p * model["hidden"]
    one = link.latency_s + chunk_bytes / link.bandwidth_Bps     # WRONG: payload, not bus bytes
    exposed = one if inter_layer else 2 * model["n_layers"] * one
    return exposed * 1e3
    ### END SOLUTION


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
