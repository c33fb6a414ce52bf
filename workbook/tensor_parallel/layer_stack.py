"""The functional TP stack Domino schedules: one rank's blocks as plain functions, and vanilla TP.

Domino (Wang et al. 2024, arXiv 2409.15241) does not change the math of a Megatron block; it
changes *when* each piece runs. So the ``domino`` lab takes the pieces as given functions and
writes only the order and the asynchronous collectives. A sublayer of a block computes

    x  ->  x + g( f(norm(x)) A B )          A column-parallel, B row-parallel (Megatron)

* ``compute_A``: ``h A`` on this rank's columns: q/k/v and causal attention on the local heads,
  or fc1 and its activation (GELU; SwiGLU for Llama);
* ``compute_B``: ``a B_r``, this rank's *partial sum* of the output (``cols`` picks output
  features: the column split of B); the sum over ranks is an all-reduce;
* ``finish``: after the all-reduce, the bias (gpt), dropout (the whole batch's mask, this
  chunk's rows) and the residual add.

Work is cut into *stages* (``stages(n_layers)``: attention and MLP of every layer, then the
head: final norm, LM head and the summed cross-entropy) and the batch into chunks
(``even_slices``). ``vanilla_tp_forward`` runs the stack with Megatron's blocking f and g
(Shoeybi et al. 2019, arXiv 1909.08053); ``comm=False`` skips every collective: the same
compute, wrong numbers, the no-communication optimum a perfect overlap would reach.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from workbook.model import ModelConfig, dropout_mask, full_weight, local_weight, parameter_shapes
from workbook.model import ops
from workbook.tensor_parallel.mappings import SUBLAYERS, row_parallel_name

NORM_OF = {"attn": "norm1", "mlp": "norm2"}        # the norm in front of each sublayer


class Stage(NamedTuple):
    """One stage of the stack: ``Stage(layer, "attn" | "mlp")``, or the head ``Stage(None, "head")``."""
    layer: int | None
    sublayer: str

    def __str__(self) -> str:
        return "(head)" if self.layer is None else f"(layer {self.layer}, {self.sublayer})"


HEAD = Stage(None, "head")


def stages(n_layers: int) -> list[Stage]:
    """The stages in forward order: ``(0, attn), (0, mlp), ..., (n_layers - 1, mlp), (head)``."""
    return [Stage(layer, sub) for layer in range(n_layers) for sub in SUBLAYERS] + [HEAD]


def even_slices(length: int, p: int, what: str = "batch rows") -> list[slice]:
    """``p`` equal slices of ``range(length)``: the chunks of a batch, or the pieces of B's columns."""
    if p < 1 or length % p:
        raise ValueError(f"p={p} pieces must divide the {length} {what}")
    n = length // p
    return [slice(k * n, (k + 1) * n) for k in range(p)]


# --------------------------------------------------------------------------- one rank's weights
class TPStack:
    """One rank's share of ``n_layers`` blocks (Megatron layout) plus a replicated final norm
    and LM head. Weights come from ``workbook.model``, so they equal the reference's slices.

    ``m[name]`` is a parameter (a typo is a ``KeyError`` naming it); ``m.optional(name)`` is
    the parameter or ``None`` where this style has none (Llama has no biases)."""

    def __init__(self, cfg: ModelConfig, rank: int, world: int, device=None):
        cfg.validate(tp=world)
        self.cfg, self.rank, self.world = cfg, rank, world
        self.local_heads = cfg.heads // world
        self.params: dict[str, torch.Tensor] = {}
        for name, shape in parameter_shapes(cfg).items():
            if name.startswith("blocks."):
                t = local_weight(cfg, name, rank, world, device)
            elif name.startswith(("norm_f.", "head.")):
                t = full_weight(cfg, name, shape, device)          # replicated in this stack
            else:
                continue
            self.params[name] = t.requires_grad_()
        self.rope = None
        if cfg.style == "llama":
            pos = torch.arange(cfg.seq_len, device=device)
            self.rope = ops.rope_cos_sin(pos, cfg.head_dim, cfg.rope_base, cfg.torch_dtype)
        self._masks: dict = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self.params[name]
        except KeyError:
            near = [n for n in self.params if n.rsplit(".", 1)[0] == name.rsplit(".", 1)[0]]
            raise KeyError(f"no parameter {name!r} in this {self.cfg.style} stack"
                           + (f" (this module has {', '.join(near)})" if near else "")
                           + "; use m.optional(name) for one this style may lack") from None

    def optional(self, name: str) -> torch.Tensor | None:
        """The parameter ``name``, or ``None`` if this style has none (e.g. a Llama bias)."""
        return self.params.get(name)

    def zero_grad(self) -> None:
        for t in self.params.values():
            t.grad = None

    def mask(self, site: str, shape, step: int):
        """The dropout mask of ``site`` for the whole batch ``shape`` at ``step`` (cached)."""
        key = (site, tuple(shape), step)
        if key not in self._masks:
            if len(self._masks) > 16:
                self._masks.clear()
            self._masks[key] = dropout_mask(self.cfg, site, shape, step, self.params["head.weight"].device)
        return self._masks[key]


# --------------------------------------------------------------------------- the pieces of a stage
def norm(m: TPStack, x, name: str):
    """LayerNorm (gpt) or RMSNorm (llama) with the replicated weights ``name.weight``/``.bias``."""
    if m.cfg.style == "gpt":
        return ops.layer_norm(x, m[f"{name}.weight"], m[f"{name}.bias"], m.cfg.norm_eps)
    return ops.rms_norm(x, m[f"{name}.weight"], m.cfg.norm_eps)


def pre_norm(m: TPStack, stage: Stage, x):
    """The norm in front of a sublayer: ``norm1`` before attention, ``norm2`` before the MLP."""
    return norm(m, x, f"blocks.{stage[0]}.{NORM_OF[stage[1]]}")


def compute_A(m: TPStack, layer: int, sub: str, h):
    """The column-parallel half ``h A``: q/k/v and attention on local heads, or fc1 + activation."""
    p = f"blocks.{layer}.{sub}"
    if sub == "attn":
        q, k, v = (ops.linear(h, m[f"{p}.{w}.weight"], m.optional(f"{p}.{w}.bias")) for w in ("wq", "wk", "wv"))
        S = h.shape[1]
        rope = None if m.rope is None else (m.rope[0][:S], m.rope[1][:S])
        return ops.causal_attention(q, k, v, m.local_heads, rope)
    if m.cfg.style == "gpt":
        return ops.gelu(ops.linear(h, m[f"{p}.fc1.weight"], m[f"{p}.fc1.bias"]))
    return ops.silu(ops.linear(h, m[f"{p}.w_gate.weight"])) * ops.linear(h, m[f"{p}.w_up.weight"])


def compute_B(m: TPStack, layer: int, sub: str, a, cols: slice = slice(None)):
    """The row-parallel half ``a B_r``: this rank's partial sum (its bias is added after the
    reduction). ``cols`` picks output features (the column split of B)."""
    return ops.linear(a, m[f"blocks.{layer}.{row_parallel_name(m.cfg, sub)}.weight"][cols])


def finish(m: TPStack, layer: int, sub: str, reduced, x, rows: slice, batch: int, step: int):
    """After the reduction: bias (gpt), dropout (the full batch's mask, this chunk's rows), residual."""
    bias = m.optional(f"blocks.{layer}.{row_parallel_name(m.cfg, sub)}.bias")
    if bias is not None:
        reduced = reduced + bias
    if m.cfg.dropout > 0:
        full = (batch, *reduced.shape[1:])
        reduced = reduced * m.mask(f"blocks.{layer}.{sub}.dropout", full, step)[rows]
    return x + reduced


def head_loss(m: TPStack, x, targets, n_tokens: int):
    """Final norm, LM head and cross-entropy *summed* over these tokens, divided by ``n_tokens``
    (so the chunks' losses add up to the batch's mean)."""
    logits = ops.linear(norm(m, x, "norm_f"), m["head.weight"])
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (torch.logsumexp(logits, dim=-1) - picked).sum() / n_tokens


# --------------------------------------------------------------------------- vanilla TP (f, g)
def blocking_all_reduce(t) -> None:
    """A synchronous all-reduce, marked as a wait in the trace (the rank computes nothing)."""
    with torch.profiler.record_function("link_wait:blocking_all_reduce"):
        dist.all_reduce(t)


class CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward, blocking all-reduce of the gradient backward."""

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
    """Megatron's g: blocking all-reduce forward, identity backward."""

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
    """Vanilla TP on the whole batch, every all-reduce on the critical path; ``comm=False``
    skips every collective (the no-communication optimum). Returns ``(loss, hidden)``."""
    B = x.shape[0]
    for stage in stages(m.cfg.n_layers)[:-1]:
        layer, sub = stage
        h = CopyToTP.apply(pre_norm(m, stage, x), comm)
        y = ReduceFromTP.apply(compute_B(m, layer, sub, compute_A(m, layer, sub, h)), comm)
        x = finish(m, layer, sub, y, x, slice(None), B, step)
    return head_loss(m, x, targets, targets.numel()), x


# --------------------------------------------------------------------------- the ground truth
def reference_step(cfg: ModelConfig, x, targets, step: int = 0):
    """The single-device reference of this stack: ``(loss, hidden, {name: grad}, grad_x)``."""
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
