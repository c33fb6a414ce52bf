"""The math of the reference model as plain functions on tensors.

Written out explicitly (no ``torch.nn.functional`` shortcuts) so a learner can
read every step, and so the tensor-parallel labs can reuse exactly the same
math on their local pieces: e.g. :func:`causal_attention` on a rank's
``heads / tp`` heads, or :func:`linear` with a column slice of a weight.

Shapes: B batch, S sequence, H hidden, n heads, d = H / n head width,
V vocab. Activations are ``[B, S, H]`` throughout.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """y = x @ W.T + b with W ``[out, in]``: ``[..., in] -> [..., out]``."""
    y = x @ weight.T
    if bias is not None:
        y = y + bias
    return y


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last dim (Ba, Kiros & Hinton 2016).

    y = (x - mean(x)) / sqrt(var(x) + eps) * w + b, with the biased variance.
    """
    mean = x.mean(dim=-1, keepdim=True)                    # [..., 1]
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)     # [..., 1]
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019): y = x / sqrt(mean(x^2) + eps) * w."""
    ms = (x * x).mean(dim=-1, keepdim=True)                # [..., 1]
    return x / torch.sqrt(ms + eps) * weight


def gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact GELU (Hendrycks & Gimpel 2016): x * Phi(x) = x/2 (1 + erf(x/sqrt 2))."""
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU / swish: x * sigmoid(x)."""
    return x * torch.sigmoid(x)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, base: float,
                 dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of rotary embeddings (Su et al. 2021, RoFormer).

    Frequencies theta_i = base^(-2i/d) for i < d/2; position m turns pair i
    by angle m * theta_i. Returns two ``[S, d]`` tables (the d/2 angles
    repeated twice, to match :func:`apply_rope`'s half-split pairing),
    computed in float64 then cast to ``dtype``.
    """
    half = head_dim // 2
    inv_freq = base ** (-torch.arange(half, dtype=torch.float64) * 2.0 / head_dim)   # [d/2]
    angles = positions.to(torch.float64).cpu()[:, None] * inv_freq[None, :]           # [S, d/2]
    angles = torch.cat([angles, angles], dim=-1)                                       # [S, d]
    device = positions.device
    return angles.cos().to(dtype=dtype, device=device), angles.sin().to(dtype=dtype, device=device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each head's features by position: ``[B, n, S, d] -> [B, n, S, d]``.

    Pairs feature i with feature i + d/2 (the GPT-NeoX / Hugging Face
    "rotate half" layout; Meta's Llama pairs neighbours 2i, 2i+1 instead,
    which is the same rotation after permuting each head's features):

        (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)

    Since the rotation stays inside a head, splitting heads over ranks (tensor
    parallelism) needs no change here.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated * sin


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``[B, S, n*d] -> [B, n, S, d]``: head h is features h*d:(h+1)*d."""
    B, S, D = x.shape
    return x.view(B, S, n_heads, D // n_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``[B, n, S, d] -> [B, S, n*d]`` (inverse of :func:`split_heads`)."""
    B, n, S, d = x.shape
    return x.transpose(1, 2).reshape(B, S, n * d)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_heads: int,
                     rope: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """Causal scaled dot-product attention (Vaswani et al. 2017, eq. 1).

    ``q, k, v``: ``[B, S, n*d]`` (already projected) -> context ``[B, S, n*d]``.
    Per head: softmax(q k^T / sqrt(d) + M) v, with M[i, j] = -inf for j > i
    (a position sees only itself and earlier positions). ``rope`` is the
    ``(cos, sin)`` pair from :func:`rope_cos_sin`, applied to q and k.
    Works for any number of heads, e.g. one rank's ``heads / tp``.
    """
    q, k, v = (split_heads(t, n_heads) for t in (q, k, v))          # [B, n, S, d]
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    S, d = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(d)                # [B, n, S, S]
    future = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    probs = torch.softmax(scores, dim=-1)                            # [B, n, S, S]
    return merge_heads(probs @ v)                                    # [B, S, n*d]


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss: mean over tokens of logsumexp(z) - z[target].

    ``logits [B, S, V]``, ``targets [B, S]`` (int64) -> scalar.
    """
    lse = torch.logsumexp(logits, dim=-1)                                    # [B, S]
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)            # [B, S]
    return (lse - picked).mean()
