"""The model's shape and style, in one small dataclass.

Every lab builds its parallel model from the same :class:`ModelConfig` as the
single-device reference, so the two can be compared weight for weight.
:meth:`ModelConfig.validate` says, in one line, which field to change when a
shape cannot be split over ``tp`` tensor-parallel ranks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Union

import torch

STYLES = ("gpt", "llama")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class ModelConfig:
    """Shape of a decoder-only transformer.

    Fields:
        vocab_size: number of tokens V (the embedding and LM head have V rows).
        hidden: model width H.
        heads: attention heads n_h; each head has width H / n_h.
        ffn_hidden: MLP inner width F (4H for GPT, often ~8H/3 for Llama).
        n_layers: number of transformer blocks L.
        seq_len: longest sequence S (the number of learned positions for gpt).
        style: ``"gpt"`` (LayerNorm, biases, GELU MLP, learned positions,
            dropout) or ``"llama"`` (RMSNorm, no biases, SwiGLU MLP, rotary
            positions, no dropout).
        dropout: probability p of zeroing an activation (gpt style only).
        rope_base: base of the rotary frequencies (llama style).
        norm_eps: epsilon inside LayerNorm / RMSNorm.
        dtype: ``"float32"`` or ``"float64"`` (a ``torch.dtype`` is accepted).
        seed: the one seed from which every weight and dropout mask is made.

    The defaults are small: forward + backward of a batch of 4 takes a few
    tens of milliseconds on one CPU core.
    """

    vocab_size: int = 256
    hidden: int = 64
    heads: int = 4
    ffn_hidden: int = 256
    n_layers: int = 2
    seq_len: int = 16
    style: str = "gpt"
    dropout: float = 0.0
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    dtype: Union[str, torch.dtype] = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.dtype, torch.dtype):
            names = {v: k for k, v in DTYPES.items()}
            if self.dtype not in names:
                raise ValueError(
                    f"ModelConfig.dtype={self.dtype} is not supported: use one of {sorted(DTYPES)}"
                )
            self.dtype = names[self.dtype]
        self.validate(tp=1)

    # ----------------------------------------------------------------- derived
    @property
    def head_dim(self) -> int:
        """Width of one attention head, d_h = H / n_h."""
        return self.hidden // self.heads

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype as a ``torch.dtype``."""
        return DTYPES[self.dtype]

    def replace(self, **changes) -> "ModelConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def odd_shapes(cls, **changes) -> "ModelConfig":
        """A config whose sizes are not powers of two.

        hidden 96, heads 6, ffn 384, seq 12, vocab 300: splits over tp = 1, 2
        and 3 (not 4, since 4 does not divide 6 heads).
        """
        base = dict(vocab_size=300, hidden=96, heads=6, ffn_hidden=384, seq_len=12)
        base.update(changes)
        return cls(**base)

    # -------------------------------------------------------------- validation
    def validate(self, tp: int = 1, sequence_parallel: bool = False) -> "ModelConfig":
        """Check the config can be built, and split over ``tp`` ranks.

        Raises a one-line ``ValueError`` naming the field to change. With
        ``sequence_parallel=True`` the sequence length must also divide by
        ``tp`` (each rank holds S / tp positions between the blocks' halves).
        Returns ``self`` so calls can be chained.
        """
        def fail(msg: str) -> None:
            raise ValueError(msg)

        if self.style not in STYLES:
            fail(f"ModelConfig.style={self.style!r} is unknown: use one of {STYLES}")
        if self.dtype not in DTYPES:
            fail(f"ModelConfig.dtype={self.dtype!r} is not supported: use one of {sorted(DTYPES)}")
        for field in ("vocab_size", "hidden", "heads", "ffn_hidden", "n_layers", "seq_len"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                fail(f"ModelConfig.{field}={value!r} must be a positive integer")
        if not isinstance(tp, int) or tp < 1:
            fail(f"tp={tp!r} must be a positive integer")
        if not 0.0 <= self.dropout < 1.0:
            fail(f"ModelConfig.dropout={self.dropout} must be in [0, 1)")
        if self.style == "llama" and self.dropout != 0.0:
            fail(f"ModelConfig.dropout={self.dropout} must be 0 for style='llama' (Llama uses no dropout)")
        if self.norm_eps <= 0:
            fail(f"ModelConfig.norm_eps={self.norm_eps} must be positive")
        if self.hidden % self.heads:
            fail(f"ModelConfig.heads={self.heads} does not divide hidden={self.hidden}: "
                 f"choose heads so that hidden / heads is a whole number")
        if self.style == "llama" and self.head_dim % 2:
            fail(f"ModelConfig.hidden={self.hidden} gives an odd head width {self.head_dim}: "
                 f"rotary embeddings need hidden / heads to be even")
        if self.style == "llama" and self.rope_base <= 1:
            fail(f"ModelConfig.rope_base={self.rope_base} must be greater than 1")
        # Tensor parallelism splits heads (attention), ffn (MLP) and vocab
        # (embedding / LM head) into tp equal contiguous pieces.
        for field in ("heads", "hidden", "ffn_hidden", "vocab_size"):
            value = getattr(self, field)
            if value % tp:
                fail(f"ModelConfig.{field}={value} is not divisible by tp={tp}: "
                     f"choose {field} as a multiple of {tp} (or use another tp)")
        if sequence_parallel and self.seq_len % tp:
            fail(f"ModelConfig.seq_len={self.seq_len} is not divisible by tp={tp}: "
                 f"sequence parallelism splits the sequence into tp equal shards")
        return self
