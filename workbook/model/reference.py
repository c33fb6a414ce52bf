"""The single-device reference model: the ground truth of every parallel lab.

A decoder-only transformer in two styles (see :class:`ModelConfig`):

* gpt: GPT-2 / Megatron-LM (Radford et al. 2019; Shoeybi et al. 2019,
  arXiv 1909.08053): learned positions, pre-LayerNorm blocks with biases,
  GELU MLP fc1 -> gelu -> fc2, dropout on the attention and MLP outputs.
* llama: Llama (Touvron et al. 2023): RMSNorm, no biases, rotary positions
  (RoFormer, Su et al. 2021), SwiGLU MLP (Shazeer 2020), no dropout.

Each block is pre-norm (Vaswani et al. 2017 with the norm moved first):

    x = x + drop(attn(norm1(x)))
    x = x + drop(mlp(norm2(x)))

Every leaf module is built with its full parameter name and fills its tensors
with :func:`workbook.model.init.full_weight`, so ``model.named_parameters()``
gives ``blocks.0.attn.wq.weight`` etc. (the table is in
:func:`workbook.model.init.parameter_shapes`), and a weight's value depends only
on ``(cfg.seed, name)``. q/k/v are separate matrices so that the
tensor-parallel split (:mod:`workbook.model.sharding`) is a plain row cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch
from torch import nn

from . import ops
from .config import ModelConfig
from .init import dropout_mask, full_weight


def _param(cfg: ModelConfig, name: str, *shape: int) -> nn.Parameter:
    return nn.Parameter(full_weight(cfg, name, shape))


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


class Linear(nn.Module):
    """y = x @ W.T + b; ``weight [out, in]``, ``bias [out]`` (gpt style only)."""

    def __init__(self, cfg: ModelConfig, name: str, in_features: int, out_features: int):
        super().__init__()
        self.name = name
        self.weight = _param(cfg, f"{name}.weight", out_features, in_features)
        self.bias = _param(cfg, f"{name}.bias", out_features) if cfg.style == "gpt" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias)      # [..., in] -> [..., out]


class LayerNorm(nn.Module):
    """LayerNorm over the hidden dim: gain ``weight [H]`` and ``bias [H]``."""

    def __init__(self, cfg: ModelConfig, name: str):
        super().__init__()
        self.name, self.eps = name, cfg.norm_eps
        self.weight = _param(cfg, f"{name}.weight", cfg.hidden)
        self.bias = _param(cfg, f"{name}.bias", cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm over the hidden dim: gain ``weight [H]``, no bias."""

    def __init__(self, cfg: ModelConfig, name: str):
        super().__init__()
        self.name, self.eps = name, cfg.norm_eps
        self.weight = _param(cfg, f"{name}.weight", cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


def make_norm(cfg: ModelConfig, name: str) -> nn.Module:
    """LayerNorm for gpt style, RMSNorm for llama style."""
    return LayerNorm(cfg, name) if cfg.style == "gpt" else RMSNorm(cfg, name)


def rope_tables(cfg: ModelConfig, x: torch.Tensor, positions: Optional[torch.Tensor] = None):
    """The RoPE ``(cos, sin)`` pair for the positions of ``x [B, S, H]`` (llama style; gpt
    style has learned positions instead and gets None). ``positions`` default to ``0..S-1``."""
    if cfg.style != "llama":
        return None
    if positions is None:
        positions = torch.arange(x.shape[1], device=x.device)
    return ops.rope_cos_sin(positions, cfg.head_dim, cfg.rope_base, x.dtype)


class Attention(nn.Module):
    """Causal multi-head self-attention with separate ``wq, wk, wv, wo``.

    q = x Wq^T + bq, k = x Wk^T + bk, v = x Wv^T + bv     (each [B, S, H])
    ctx = softmax(q k^T / sqrt(d) + causal mask) v per head (RoPE on q, k for llama)
    out = ctx Wo^T + bo                                    ([B, S, H])

    Head h is rows h*d:(h+1)*d of wq/wk/wv and columns h*d:(h+1)*d of wo,
    which is why Megatron splits wq/wk/wv by rows (column-parallel) and wo by
    columns (row-parallel): each rank then owns whole heads.
    """

    def __init__(self, cfg: ModelConfig, name: str = "blocks.0.attn"):
        super().__init__()
        self.cfg, self.name = cfg, name
        H = cfg.hidden
        self.wq = Linear(cfg, f"{name}.wq", H, H)
        self.wk = Linear(cfg, f"{name}.wk", H, H)
        self.wv = Linear(cfg, f"{name}.wv", H, H)
        self.wo = Linear(cfg, f"{name}.wo", H, H)

    def forward(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        rope = rope_tables(self.cfg, x, positions)
        ctx = ops.causal_attention(self.wq(x), self.wk(x), self.wv(x), self.cfg.heads, rope)  # [B, S, H]
        return self.wo(ctx)                                                              # [B, S, H]


class MLP(nn.Module):
    """The feed-forward half of a block.

    gpt:   out = fc2(gelu(fc1(x)))                       fc1 [F, H], fc2 [H, F]
    llama: out = w_down(silu(w_gate x) * (w_up x))       (SwiGLU, Shazeer 2020)

    The first matrices (fc1, w_gate, w_up) are column-parallel and the last
    (fc2, w_down) row-parallel in Megatron's layout: the elementwise middle
    needs no communication.
    """

    def __init__(self, cfg: ModelConfig, name: str = "blocks.0.mlp"):
        super().__init__()
        self.cfg, self.name = cfg, name
        H, F = cfg.hidden, cfg.ffn_hidden
        if cfg.style == "gpt":
            self.fc1 = Linear(cfg, f"{name}.fc1", H, F)
            self.fc2 = Linear(cfg, f"{name}.fc2", F, H)
        else:
            self.w_gate = Linear(cfg, f"{name}.w_gate", H, F)
            self.w_up = Linear(cfg, f"{name}.w_up", H, F)
            self.w_down = Linear(cfg, f"{name}.w_down", F, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cfg.style == "gpt":
            return self.fc2(ops.gelu(self.fc1(x)))                              # [B,S,H]->[B,S,F]->[B,S,H]
        return self.w_down(ops.silu(self.w_gate(x)) * self.w_up(x))             # [B,S,H]->[B,S,F]->[B,S,H]


class Block(nn.Module):
    """Pre-norm transformer block ``blocks.{layer}``.

    x = x + drop(attn(norm1(x)), site "blocks.{layer}.attn.dropout")
    x = x + drop(mlp(norm2(x)),  site "blocks.{layer}.mlp.dropout")

    Dropout (gpt style, ``cfg.dropout > 0``, module in training mode) multiplies
    by :func:`workbook.model.init.dropout_mask` for the site and ``step``.
    """

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.name = name = f"blocks.{layer}"
        self.norm1 = make_norm(cfg, f"{name}.norm1")
        self.attn = Attention(cfg, f"{name}.attn")
        self.norm2 = make_norm(cfg, f"{name}.norm2")
        self.mlp = MLP(cfg, f"{name}.mlp")

    def dropout(self, x: torch.Tensor, site: str, step: int) -> torch.Tensor:
        if not self.training or self.cfg.dropout == 0.0:
            return x
        return x * dropout_mask(self.cfg, f"{self.name}.{site}.dropout", x.shape, step, x.device)

    def forward(self, x: torch.Tensor, step: int = 0,
                positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.norm1(x), positions), "attn", step)   # [B, S, H]
        x = x + self.dropout(self.mlp(self.norm2(x)), "mlp", step)                # [B, S, H]
        return x


class Embedding(nn.Module):
    """Token embedding ``embed.tok [V, H]`` (+ learned ``embed.pos [S, H]`` for gpt).

    h[b, s] = tok[tokens[b, s]] (+ pos[s]). The token table is vocab-parallel
    in Megatron's layout; llama takes positions in attention (RoPE) instead.
    """

    def __init__(self, cfg: ModelConfig, name: str = "embed"):
        super().__init__()
        self.cfg, self.name = cfg, name
        self.tok = nn.Module()
        self.tok.weight = _param(cfg, f"{name}.tok.weight", cfg.vocab_size, cfg.hidden)
        if cfg.style == "gpt":
            self.pos = nn.Module()
            self.pos.weight = _param(cfg, f"{name}.pos.weight", cfg.seq_len, cfg.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        S = tokens.shape[1]
        if S > self.cfg.seq_len:
            raise ValueError(f"sequence of {S} tokens is longer than ModelConfig.seq_len={self.cfg.seq_len}")
        h = self.tok.weight[tokens]                       # [B, S] -> [B, S, H]
        if self.cfg.style == "gpt":
            h = h + self.pos.weight[:S]                   # + [S, H]
        return h


class LMHead(nn.Module):
    """Final projection to the vocabulary: logits = h @ W.T, ``weight [V, H]``.

    Not tied to the embedding (so the two vocab-parallel tables are separate
    parameters in the labs). :meth:`loss` is the mean cross-entropy.
    """

    def __init__(self, cfg: ModelConfig, name: str = "head"):
        super().__init__()
        self.cfg, self.name = cfg, name
        self.weight = _param(cfg, f"{name}.weight", cfg.vocab_size, cfg.hidden)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return ops.linear(h, self.weight)                 # [B, S, H] -> [B, S, V]

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return ops.cross_entropy(logits, targets)


class ReferenceModel(nn.Module):
    """embed -> blocks.0 .. blocks.{L-1} -> norm_f -> head -> cross-entropy.

    ``forward(tokens, targets, step=0)`` returns the scalar mean loss (the
    logits when ``targets`` is None). ``step`` selects the dropout masks.
    Parameters are created in ``cfg.dtype`` on ``device``.
    """

    def __init__(self, cfg: ModelConfig, device: Optional[torch.device] = None):
        super().__init__()
        cfg.validate(tp=1)
        self.cfg, self.name = cfg, ""
        self.embed = Embedding(cfg, "embed")
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm_f = make_norm(cfg, "norm_f")
        self.head = LMHead(cfg, "head")
        if device is not None:
            self.to(device)

    def hidden_states(self, tokens: torch.Tensor, step: int = 0) -> torch.Tensor:
        """Output of the final norm, ``[B, S, H]``."""
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h, step)
        return self.norm_f(h)

    def logits(self, tokens: torch.Tensor, step: int = 0) -> torch.Tensor:
        """``[B, S] -> [B, S, V]``."""
        return self.head(self.hidden_states(tokens, step))

    def forward(self, tokens: torch.Tensor, targets: Optional[torch.Tensor] = None,
                step: int = 0) -> torch.Tensor:
        logits = self.logits(tokens, step)
        if targets is None:
            return logits
        return LMHead.loss(logits, targets)


# --------------------------------------------------------------------- helpers
def grads_by_name(module: nn.Module) -> Dict[str, torch.Tensor]:
    """Full parameter name -> a copy of its gradient, after ``backward()``.

    Names are global (``blocks.1.mlp.fc1.weight``) even for a lone
    :class:`Block`, :class:`Attention` or :class:`MLP`, using the module's
    ``name``. Raises if a parameter has no gradient yet.
    """
    prefix = getattr(module, "name", "")
    grads: Dict[str, torch.Tensor] = {}
    for local, p in module.named_parameters():
        name = _join(prefix, local)
        if p.grad is None:
            raise RuntimeError(f"parameter {name!r} has no gradient: run loss.backward() first "
                               f"(and check it is used in the forward)")
        grads[name] = p.grad.detach().clone()
    return grads


def params_by_name(module: nn.Module) -> Dict[str, torch.Tensor]:
    """Full parameter name -> a detached copy of its value."""
    prefix = getattr(module, "name", "")
    return {_join(prefix, n): p.detach().clone() for n, p in module.named_parameters()}


@dataclass
class ReferenceResult:
    """What one reference forward + backward produced.

    ``out``: the module's output; ``grad_input``: d(loss)/d(input) (None when
    no ``grad_out`` was given); ``grads``: parameter gradients by full name.
    """

    out: torch.Tensor
    grad_input: Optional[torch.Tensor]
    grads: Dict[str, torch.Tensor]


def run_reference(module: nn.Module, x: torch.Tensor, grad_out: Optional[torch.Tensor] = None,
                  **kwargs) -> ReferenceResult:
    """Run ``module(x, **kwargs)``; if ``grad_out`` is given, backpropagate it.

    The backward computes ``sum(out * grad_out)``'s gradients, i.e. what a
    parallel lab gets when it calls ``out.backward(grad_out)``.
    """
    module.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(grad_out is not None)
    out = module(x, **kwargs)
    if grad_out is None:
        return ReferenceResult(out.detach(), None, {})
    out.backward(grad_out)
    return ReferenceResult(out.detach(), x.grad.detach().clone(), grads_by_name(module))


def block_forward_reference(cfg: ModelConfig, x: torch.Tensor, layer: int = 0, step: int = 0,
                            grad_out: Optional[torch.Tensor] = None,
                            part: str = "block") -> ReferenceResult:
    """Reference output (and gradients) of one block, or of its attn / mlp.

    ``part`` is ``"block"`` (the whole pre-norm block, with dropout at
    ``step``), ``"attn"`` or ``"mlp"`` (the bare sublayer, no norm, no
    residual, no dropout). Weights are ``blocks.{layer}``'s, so they match
    ``ReferenceModel(cfg)`` and :func:`workbook.model.sharding.local_weight`.
    ``x`` is ``[B, S, H]`` in ``cfg.dtype``.
    """
    if part == "block":
        module: nn.Module = Block(cfg, layer)
        kwargs = {"step": step}
    elif part == "attn":
        module, kwargs = Attention(cfg, f"blocks.{layer}.attn"), {}
    elif part == "mlp":
        module, kwargs = MLP(cfg, f"blocks.{layer}.mlp"), {}
    else:
        raise ValueError(f"part={part!r} is unknown: use 'block', 'attn' or 'mlp'")
    module.to(x.device)
    return run_reference(module, x, grad_out, **kwargs)
