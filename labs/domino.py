# Generated from solutions/domino.py by `workbook assign`: this is your file to edit.
# Replace each `raise NotImplementedError` with your code, then grade it with
#     workbook grade --lab domino
"""Lab `domino`: hide tensor-parallel all-reduces behind the compute of other batch chunks.

Why tensor parallelism waits
----------------------------
A Megatron TP sublayer computes ``Y = X A B``: ``A`` is column-parallel (q/k/v and the attention
core, or fc1 and its activation), ``B`` is row-parallel (``wo`` or ``fc2``), and each rank holds
only a partial sum of ``Y`` until an all-reduce adds the partials. The residual add and the next
norm need the whole sum, so in vanilla TP every all-reduce sits on the critical path: two per
block in the forward pass, two in the backward pass. The Domino paper (Wang et al., 2024,
arXiv 2409.15241) measured that share at up to 43-47% of a GPT-3 13B iteration on 1-4 DGX-H100
nodes.

Domino cuts that dependency by slicing the work into independent pieces:

* **row split of X** (what this lab builds). Cut the batch into ``p`` chunks. Chunk k's result
  does not depend on chunk j's, so chunk k's all-reduce can travel while chunk k+1 computes
  (*intra-layer* overlap), and the last chunk's all-reduce of one sublayer can travel while the
  first chunk computes the next sublayer (*inter-layer* overlap): no collective is left on the
  critical path at layer boundaries. The paper reports Domino up to 1.3x faster than Megatron-LM
  for GPT models, near the no-communication optimum in several settings; the nanotron port
  (PR #286) showed over 99% forward overlap on one node.
* **column split of B** (``column_split_forward``, the contrast). Cut B's output features into
  ``p`` pieces: piece j's all-reduce travels while piece j+1 of ``X A B`` is computed. But the
  next layer's norm needs *every* feature of every token, so all pieces must arrive at the
  layer boundary: the overlap stays inside one GEMM, and only part of the communication hides
  (the paper's contrast: up to 100% with the batch split, roughly 50-70% with the column split).

The backward pass, without hand-written autograd for the layer
--------------------------------------------------------------
Autograd builds the backward graph; two tiny functions steer it:

* ``AsyncCopyToTP`` (the f of Megatron, made asynchronous): identity forward; its backward
  *starts* the all-reduce of the input gradient and registers the handle by name;
* ``WaitInBackward`` (the no-op module of the paper): identity forward, inserted on the same
  path just before f; its backward *waits* for that named handle, right before the norm's
  backward needs the reduced gradient.

Autograd on CPU runs ready nodes latest-created first, so the backward order is the reverse of
the order in which the forward *created* nodes. Whatever the forward creates between the no-op
and f runs, in the backward, between the start of the all-reduce and its wait. A plain loop
("prepare chunk k, compute chunk k") creates nothing there: the backward then waits right after
starting (the weak backward overlap the nanotron thread points out; the authors note that the
best forward and backward orders conflict). Here the forward *prepares one unit ahead*
(``lookahead=1``): it waits for chunk k+1's input, normalises it and inserts its no-op, and only
then computes chunk k. In the backward, chunk k's compute then hides chunk k+1's all-reduce. The
cost is paid in the forward: an all-reduce is hidden behind ``p - 1 - lookahead`` later chunk
computations instead of ``p - 1``, so use ``p >= 3`` (``p = 4`` by default); a final per-chunk
norm + LM head stage gives the last all-reduces something to hide behind.

The handles live in a ``HandleRegistry`` keyed by readable names such as
``layer1.mlp.chunk3.bwd``; it must be empty at the end of every step, and a leak names its key.

On a GPU (NCCL)
---------------
NCCL runs collectives on its own stream: ``dist.all_reduce(t, async_op=True)`` makes that stream
wait (an event) for the kernels that produced ``t``, and ``work.wait()`` makes the *compute*
stream wait for the collective; neither blocks the host, and no ``torch.cuda.synchronize()`` is
needed anywhere. ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (set below before CUDA starts) gives the GPU
one hardware work queue, so kernels start in the order the host launched them: the all-reduce
launched after chunk k's GEMM is scheduled before chunk k+1's GEMMs instead of queueing behind
them, which is what the schedule assumes (Megatron sets it for the same reason). On the
simulated link (CPU, gloo) the link carries one operation at a time in issue order.

Run it: ``workbook run domino`` (the grader's checks, then hidden % and the speed-up over vanilla
TP on the simulated dgx-h100 link), ``python labs/domino.py --trace-dir runs/domino`` or
``torchrun --nproc_per_node=2 labs/domino.py``; grade it with ``workbook grade --lab domino``;
compare variants with ``workbook bench domino``.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from workbook.model import ModelConfig, dropout_mask, full_weight, local_weight, parameter_shapes
from workbook.model import ops as model_ops     # (named so: cloudpickle mistakes `ops` for torch.ops)

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")     # before CUDA initialises (see above)
SUBLAYERS = ("attn", "mlp")


# --------------------------------------------------------------------------- handle registry
def handle_key(layer, sublayer: str, chunk: int, phase: str) -> str:
    """The readable name of one collective, e.g. ``layer1.mlp.chunk3.bwd``."""
    return f"layer{layer}.{sublayer}.chunk{chunk}.{phase}"


class HandleRegistry:
    """Async work handles by name, from the moment a collective starts until it is waited on."""

    def __init__(self):
        self._open: dict[str, object] = {}

    def put(self, key: str, work) -> None:
        """Keep ``work`` under ``key``; a key still open is an error (its handle would be lost)."""
        # TODO: refuse a key already open (name it in the error), else store the work
        raise NotImplementedError("not implemented yet: domino.HandleRegistry.put")

    def wait(self, key: str) -> None:
        """Wait for the work under ``key`` and forget it; an unknown key is an error."""
        with torch.profiler.record_function(f"link_wait:{key}"):     # the trace names each wait
            # TODO: pop the work (unknown key -> a RuntimeError naming it), then work.wait()
            raise NotImplementedError("not implemented yet: domino.HandleRegistry.wait")

    def pending(self) -> list[str]:
        """The keys started and not yet waited on, in start order."""
        return list(self._open)

    def check_empty(self, where: str = "the end of the step") -> None:
        """Raise, naming every open key, unless every handle has been waited on."""
        # TODO: raise a RuntimeError listing self.pending() when it is not empty
        raise NotImplementedError("not implemented yet: domino.HandleRegistry.check_empty")


# --------------------------------------------------------------------------- the model pieces
class TPStack:
    """One rank's share of ``n_layers`` blocks (Megatron layout) plus a replicated final norm
    and LM head. Weights come from ``workbook.model`` so they equal the reference's slices."""

    def __init__(self, cfg: ModelConfig, rank: int, world: int, device=None):
        cfg.validate(tp=world)
        self.cfg, self.rank, self.world = cfg, rank, world
        self.local_heads = cfg.heads // world
        self.params: dict[str, torch.Tensor] = {}
        for name, shape in parameter_shapes(cfg).items():
            if name.startswith("blocks."):
                t = local_weight(cfg, name, rank, world, device)
            elif name.startswith(("norm_f.", "head.")):
                t = full_weight(cfg, name, shape, device)          # replicated in this lab
            else:
                continue
            self.params[name] = t.requires_grad_()
        self.rope = None
        if cfg.style == "llama":
            pos = torch.arange(cfg.seq_len, device=device)
            self.rope = model_ops.rope_cos_sin(pos, cfg.head_dim, cfg.rope_base, cfg.torch_dtype)
        self._masks: dict = {}

    def __getitem__(self, name: str):
        return self.params.get(name)

    def zero_grad(self) -> None:
        for t in self.params.values():
            t.grad = None

    def mask(self, site: str, shape, step: int):
        key = (site, tuple(shape), step)
        if key not in self._masks:
            if len(self._masks) > 16:
                self._masks.clear()
            self._masks[key] = dropout_mask(self.cfg, site, shape, step, self.params["head.weight"].device)
        return self._masks[key]


def norm(m: TPStack, x, name: str):
    if m.cfg.style == "gpt":
        return model_ops.layer_norm(x, m[f"{name}.weight"], m[f"{name}.bias"], m.cfg.norm_eps)
    return model_ops.rms_norm(x, m[f"{name}.weight"], m.cfg.norm_eps)


def compute_A(m: TPStack, layer: int, sub: str, h):
    """The column-parallel half ``h A``: q/k/v and attention on local heads, or fc1 + activation."""
    p = f"blocks.{layer}.{sub}"
    if sub == "attn":
        q, k, v = (model_ops.linear(h, m[f"{p}.{w}.weight"], m[f"{p}.{w}.bias"]) for w in ("wq", "wk", "wv"))
        S = h.shape[1]
        rope = None if m.rope is None else (m.rope[0][:S], m.rope[1][:S])
        return model_ops.causal_attention(q, k, v, m.local_heads, rope)
    if m.cfg.style == "gpt":
        return model_ops.gelu(model_ops.linear(h, m[f"{p}.fc1.weight"], m[f"{p}.fc1.bias"]))
    return model_ops.silu(model_ops.linear(h, m[f"{p}.w_gate.weight"])) * model_ops.linear(h, m[f"{p}.w_up.weight"])


def compute_B(m: TPStack, layer: int, sub: str, a, cols: slice = slice(None)):
    """The row-parallel half ``a B`` (a partial sum; its bias is added after the reduction).
    ``cols`` picks output features (the column split of B)."""
    name = {"attn": "attn.wo", "mlp": "mlp.fc2" if m.cfg.style == "gpt" else "mlp.w_down"}[sub]
    return model_ops.linear(a, m[f"blocks.{layer}.{name}.weight"][cols])


def finish(m: TPStack, layer: int, sub: str, reduced, x, rows: slice, batch: int, step: int):
    """After the reduction: bias (gpt), dropout (the full batch's mask, this chunk's rows), residual."""
    name = {"attn": "attn.wo", "mlp": "mlp.fc2" if m.cfg.style == "gpt" else "mlp.w_down"}[sub]
    bias = m[f"blocks.{layer}.{name}.bias"]
    if bias is not None:
        reduced = reduced + bias
    if m.cfg.dropout > 0:
        full = (batch, *reduced.shape[1:])
        reduced = reduced * m.mask(f"blocks.{layer}.{sub}.dropout", full, step)[rows]
    return x + reduced


def head_loss(m: TPStack, x, targets, n_tokens: int):
    """Final norm, LM head and cross-entropy *summed* over these tokens, divided by ``n_tokens``."""
    logits = model_ops.linear(norm(m, x, "norm_f"), m["head.weight"])
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (torch.logsumexp(logits, dim=-1) - picked).sum() / n_tokens


def chunk_rows(batch: int, p: int) -> list[slice]:
    if p < 1 or batch % p:
        raise ValueError(f"p={p} chunks must divide the batch of {batch} rows")
    n = batch // p
    return [slice(k * n, (k + 1) * n) for k in range(p)]


# --------------------------------------------------------------------------- vanilla TP (f, g)
def blocking_all_reduce(t) -> None:
    """A synchronous all-reduce, marked as a wait in the trace (the rank computes nothing)."""
    with torch.profiler.record_function("link_wait:blocking_all_reduce"):
        dist.all_reduce(t)


class CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, comm=True):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        if ctx.comm:
            blocking_all_reduce(g)
        return g, None


class ReduceFromTP(torch.autograd.Function):
    """Megatron's g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, comm=True):
        ctx.mark_dirty(x)
        if comm:
            blocking_all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


def vanilla_tp_forward(m: TPStack, x, targets, step: int = 0, comm: bool = True):
    """Vanilla TP on the whole batch; ``comm=False`` skips every collective (the no-communication
    optimum of the benchmark: same compute, wrong numbers). Returns ``(loss, hidden)``."""
    B, rows = x.shape[0], slice(None)
    for layer in range(m.cfg.n_layers):
        for sub, nm in zip(SUBLAYERS, ("norm1", "norm2")):
            h = CopyToTP.apply(norm(m, x, f"blocks.{layer}.{nm}"), comm)
            y = ReduceFromTP.apply(compute_B(m, layer, sub, compute_A(m, layer, sub, h)), comm)
            x = finish(m, layer, sub, y, x, rows, B, step)
    return head_loss(m, x, targets, targets.numel()), x


# --------------------------------------------------------------------------- Domino's functions
class StartAllReduce(torch.autograd.Function):
    """Forward: start the all-reduce of a partial sum and register its handle; identity backward.
    The returned tensor holds the sum only after ``registry.wait(key)``."""

    @staticmethod
    def forward(ctx, x, registry, key):
        # TODO: ctx.mark_dirty(x); start dist.all_reduce(x, async_op=True); registry.put(key, work); return x
        raise NotImplementedError("not implemented yet: domino.StartAllReduce.forward")

    @staticmethod
    def backward(ctx, g):
        return g, None, None


class AsyncCopyToTP(torch.autograd.Function):
    """Domino's f: identity forward; backward *starts* the all-reduce of the input gradient and
    registers it under ``key`` (``WaitInBackward`` waits for it later)."""

    @staticmethod
    def forward(ctx, x, registry, key):
        ctx.registry, ctx.key = registry, key
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        # TODO: make g contiguous, start its all-reduce with async_op=True, put the work under ctx.key, return g (not yet reduced)
        raise NotImplementedError("not implemented yet: domino.AsyncCopyToTP.backward")


class WaitInBackward(torch.autograd.Function):
    """The no-op: identity forward; backward waits for the handle ``key`` before passing on."""

    @staticmethod
    def forward(ctx, x, registry, key):
        ctx.registry, ctx.key = registry, key
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        # TODO: wait for ctx.key in the registry, then return g
        raise NotImplementedError("not implemented yet: domino.WaitInBackward.backward")


# --------------------------------------------------------------------------- Domino forward
def domino_forward(m: TPStack, x, targets, p: int, registry: HandleRegistry, *, step: int = 0,
                   inter_layer: bool = True, lookahead: int = 1):
    """Row-split Domino: returns ``(loss, hidden)`` equal to ``vanilla_tp_forward``.

    The work is a list of *units* (stage, chunk): stages are ``(layer, "attn")``,
    ``(layer, "mlp")`` for every layer, then ``"head"`` (final norm, LM head, loss); chunk k is
    ``x[chunk_rows(B, p)[k]]``. Each unit has two parts:

    * ``prepare``: wait for the chunk's previous all-reduce (``registry.wait``), ``finish`` it
      (bias, dropout, residual), then norm and ``WaitInBackward`` (key ``...bwd``);
    * ``compute``: ``AsyncCopyToTP`` (same ``...bwd`` key), ``compute_A``, ``compute_B`` and
      ``StartAllReduce`` (key ``...fwd``); for the head stage, the chunk's loss.

    Run ``prepare`` of unit n + ``lookahead`` before ``compute`` of unit n (see the module
    docstring). ``inter_layer=False`` treats each layer as its own list of units and waits for
    every chunk's last all-reduce at the end of the layer (the intra-layer-only variant).
    The hidden states returned are the chunks joined in batch order."""
    if not 0 <= lookahead < p:
        raise ValueError(f"lookahead={lookahead} must be at least 0 and smaller than p={p}: a chunk "
                         "can only be prepared once its previous all-reduce has started")
    B, L = x.shape[0], m.cfg.n_layers
    rows = chunk_rows(B, p)
    n_tokens = targets.numel()
    # TODO: keep per chunk its hidden state and the (layer, sublayer, tensor) of its in-flight all-reduce; write prepare(stage, k) and compute(stage, k, h), then interleave them with the lookahead
    raise NotImplementedError("not implemented yet: domino.domino_forward")


# --------------------------------------------------------------------------- column split of B
def column_split_forward(m: TPStack, x, targets, p: int, registry: HandleRegistry, *, step: int = 0):
    """The contrast, forward only: split B's output features into ``p`` pieces. Piece j's
    all-reduce (key ``layer{i}.{sub}.chunk{j}.col``) travels while piece j+1 is computed; all
    pieces are waited for and joined before the residual add, because the next norm needs every
    feature. Returns ``(loss, hidden)``; use it under ``torch.no_grad()``."""
    B, H = x.shape[0], m.cfg.hidden
    cols = chunk_rows(H, p)
    for layer in range(m.cfg.n_layers):
        for sub, nm in zip(SUBLAYERS, ("norm1", "norm2")):
            a = compute_A(m, layer, sub, norm(m, x, f"blocks.{layer}.{nm}"))
            # TODO: for each column piece: compute_B(..., cols=piece), start its all-reduce (registry.put); then wait for every piece, torch.cat them on the last dim and finish()
            raise NotImplementedError("not implemented yet: domino.column_split_forward")
    return head_loss(m, x, targets, targets.numel()), x


# --------------------------------------------------------------------------- one training step
def train_step(m: TPStack, x, targets, *, variant: str = "domino", p: int = 4, step: int = 0,
               registry: HandleRegistry | None = None, comm: bool = True):
    """Forward (``record_function("forward")``) and backward (``"backward"``) of one variant:
    ``vanilla_tp``, ``no_comm``, ``domino_intra`` or ``domino``. Returns the loss; the registry
    is checked empty at the end."""
    registry = registry if registry is not None else HandleRegistry()
    with torch.profiler.record_function("forward"):
        if variant in ("vanilla_tp", "no_comm"):
            loss, _ = vanilla_tp_forward(m, x, targets, step, comm=variant == "vanilla_tp")
        else:
            loss, _ = domino_forward(m, x, targets, p, registry, step=step,
                                     inter_layer=variant == "domino")
    with torch.profiler.record_function("backward"):
        loss.backward()
    registry.check_empty(f"the end of step {step}")
    return loss.detach()


# --------------------------------------------------------------------------- the reference
def reference_step(cfg: ModelConfig, x, targets, step: int = 0):
    """The single-device ground truth: ``(loss, hidden, {name: grad}, grad_x)``."""
    from workbook.model import Block, LMHead, grads_by_name
    from workbook.model.reference import make_norm
    blocks = [Block(cfg, i) for i in range(cfg.n_layers)]
    norm_f, head = make_norm(cfg, "norm_f"), LMHead(cfg, "head")
    x = x.detach().clone().requires_grad_()
    h = x
    for b in blocks:
        h = b(h, step)
    loss = LMHead.loss(head(norm_f(h)), targets)
    loss.backward()
    grads = {}
    for mod in (*blocks, norm_f, head):
        grads.update(grads_by_name(mod))
    return loss.detach(), h.detach(), grads, x.grad


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
