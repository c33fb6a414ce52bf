"""Where the capstone's global batches come from: the one seam to ``capstone.text_data``.

``text_loader(batch, seq, seed)`` is ``TextLoader(ByteTokenizer().encode(load_corpus()),
batch, seq, seed)`` of ``workbook/capstone/text_data.py``: the shipped public-domain corpus
(docs/capstone-data.md), bytes as tokens (vocabulary 256), ``global_batch(step) -> (tokens [B,
S], targets [B, S])`` a pure function of the seed and the step, the same on every rank and on
the single device. The encoded corpus is kept per process (every rank reads it once).
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def _corpus_tokens():
    from workbook.capstone.text_data import ByteTokenizer, load_corpus
    return ByteTokenizer().encode(load_corpus())                      # int64 [N]


def text_loader(batch: int, seq: int, seed: int = 0):
    """The training split's loader of the capstone's text (see the module docstring)."""
    from workbook.capstone.text_data import TextLoader
    return TextLoader(_corpus_tokens(), batch, seq, seed)
