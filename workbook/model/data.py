"""Deterministic toy batches for next-token prediction.

``make_batch(cfg, batch, seed)`` draws ``seq_len + 1`` tokens per row and
returns ``tokens = row[:-1]``, ``targets = row[1:]`` (predict the next token).
The draw is a pure function of ``(seed, cfg.vocab_size, batch, seq_len,
pattern)``, made on the CPU, so every rank of a parallel job builds the same
batch without communicating.

Patterns:
* ``"random"``: independent uniform tokens (a model can only memorise them);
* ``"arithmetic"``: each row counts from a random start with a random stride,
  modulo V, so the next token follows from the previous two and the loss can
  fall well below log V.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .config import ModelConfig
from .init import generator_for

PATTERNS = ("random", "arithmetic")


def make_batch(cfg: ModelConfig, batch: int, seed: Optional[int] = None, *,
               seq_len: Optional[int] = None, pattern: str = "random",
               device: Optional[torch.device] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, targets)``, both int64 ``[batch, seq_len]``.

    ``seed`` defaults to ``cfg.seed``; ``seq_len`` to ``cfg.seq_len``.
    """
    seed = cfg.seed if seed is None else seed
    S = cfg.seq_len if seq_len is None else seq_len
    V = cfg.vocab_size
    if batch < 1 or not 1 <= S <= cfg.seq_len:
        raise ValueError(f"need batch >= 1 and 1 <= seq_len <= ModelConfig.seq_len={cfg.seq_len}, "
                         f"got batch={batch}, seq_len={S}")
    if pattern not in PATTERNS:
        raise ValueError(f"pattern={pattern!r} is unknown: use one of {PATTERNS}")
    gen = generator_for(seed, "data", pattern, V, batch, S)
    if pattern == "random":
        rows = torch.randint(0, V, (batch, S + 1), generator=gen, dtype=torch.int64)
    else:
        start = torch.randint(0, V, (batch, 1), generator=gen, dtype=torch.int64)
        stride = torch.randint(1, max(2, min(V, 8)), (batch, 1), generator=gen, dtype=torch.int64)
        rows = (start + stride * torch.arange(S + 1, dtype=torch.int64)) % V
    tokens, targets = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
    return tokens.to(device), targets.to(device)
