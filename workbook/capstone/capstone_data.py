"""Where the capstone's global batches come from: the one seam to ``capstone.text_data``.

``text_loader(batch, seq, seed)`` is ``TextLoader(ByteTokenizer().encode(load_corpus()),
batch, seq, seed)`` of ``workbook/capstone/text_data.py`` (the shipped public-domain corpus,
bytes as tokens, ``global_batch(step) -> (tokens [B, S], targets [B, S])`` a pure function of
the seed and the step). Until that module is in the package, a stand-in with the same
interface reads a few public-domain sentences (Jane Austen, *Pride and Prejudice*, 1813).
"""
from __future__ import annotations

import torch

_STAND_IN_TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife. However little known the feelings or views of such a man may be "
    "on his first entering a neighbourhood, this truth is so well fixed in the minds of the "
    "surrounding families, that he is considered the rightful property of some one or other of "
    "their daughters. My dear Mr. Bennet, said his lady to him one day, have you heard that "
    "Netherfield Park is let at last? Mr. Bennet replied that he had not. ")


class _StandInLoader:
    """``TextLoader``'s interface over the stand-in text: ``batch`` windows of ``seq + 1`` bytes
    per step, their starts drawn from a generator seeded by ``(seed, step)``."""

    def __init__(self, tokens: torch.Tensor, batch: int, seq: int, seed: int = 0):
        self.tokens, self.batch, self.seq, self.seed = tokens, batch, seq, seed

    def global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.tokens) - self.seq - 1, (self.batch,), generator=gen)
        windows = torch.stack([self.tokens[s:s + self.seq + 1] for s in starts.tolist()])
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()   # [B, S], [B, S]


def text_loader(batch: int, seq: int, seed: int = 0):
    """The loader of the capstone's text (see the module docstring)."""
    try:
        from workbook.capstone.text_data import ByteTokenizer, TextLoader, load_corpus
    except ImportError:                  # text_data not in this checkout yet: the stand-in
        tokens = torch.tensor(list(_STAND_IN_TEXT.encode("utf-8")), dtype=torch.long)
        return _StandInLoader(tokens, batch, seq, seed)
    return TextLoader(ByteTokenizer().encode(load_corpus()), batch, seq, seed)
