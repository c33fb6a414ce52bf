# Corpus: Ambrose Bierce, The Devil's Dictionary (1911), public domain; Debian dict-devil 1.0-13.1.
"""Real text for the capstone: a small corpus, a byte-level tokenizer, and a deterministic loader.

**The corpus.** ``load_corpus()`` returns Ambrose Bierce's *The Devil's Dictionary* (1911; its
copyright has expired), about 383 KB of plain ASCII English shipped inside the package
(``workbook/capstone/data/devils_dictionary.txt``; docs/capstone-data.md says where it came from
and how it was trimmed). Small enough to live in the repository, large enough that a small model
trained for a few thousand steps sees text, not a memorised page.

**The tokenizer.** ``ByteTokenizer`` maps text to its UTF-8 bytes: token ``t`` is a byte,
``0 <= t < 256``, so ``vocab_size = 256`` and nothing is ever out of vocabulary (the byte-level
fallback of GPT-2's BPE, Radford et al. 2019, without the merges). A uniform guess costs
``ln 256 = 5.55`` nats per token; this text's byte frequencies alone (a unigram model) cost
3.09 nats, and the previous byte (a bigram model) brings it to 2.49, so a loss falling below
2.5 means the model has learned more than letter pairs.

**The loader.** Language modelling predicts each token from the ones before it. A training
example is a window of ``S + 1`` consecutive tokens ``w``: the input is ``w[:-1]``, the target
``w[1:]`` (the same window shifted by one), so ``targets[b, s] = tokens[b, s + 1]`` for
``s < S - 1``. ``TextLoader.global_batch(step)`` returns ``B`` such windows, their starts drawn
uniformly (with replacement, as nanoGPT does) by a ``torch.Generator`` seeded from
``(seed, split, step)`` alone. So:

* every rank, and the single-device reference, builds the **same** global batch for a step,
  with no communication and no shared state;
* any step can be made directly, without replaying the steps before it (a restarted run
  resumes at step ``k`` with exactly the batches it would have seen).

Which rows of the global batch a data-parallel rank trains on is *not* decided here: that is
the shard of the capstone lab's task (``dp_shard``). The windows of ``split="val"`` come from
the last ``VAL_FRACTION`` of the tokens and those of ``split="train"`` from the rest, so a
validation loss measures text the model never trained on.
"""
from __future__ import annotations

import operator
from importlib import resources

import torch

from workbook.model.init import generator_for

CORPUS = "devils_dictionary.txt"      # under workbook/capstone/data/
VAL_FRACTION = 0.05                   # the last 5 % of the tokens are held out
SPLITS = ("train", "val")


def load_corpus() -> str:
    """The shipped corpus as one string (ASCII, lines ending in ``\\n``, about 383 000
    characters). Read through ``importlib.resources``, so it is found in a checkout, an
    installed wheel and a student release alike."""
    path = resources.files("workbook.capstone").joinpath("data").joinpath(CORPUS)
    return path.read_text(encoding="utf-8")


class ByteTokenizer:
    """Text <-> bytes: ``encode`` gives the UTF-8 bytes as int64 tokens, ``decode`` inverts it.

    ASCII text is one token per character; any other character is 2-4 tokens (its UTF-8
    bytes), so every string round-trips: ``decode(encode(s)) == s``.
    """

    vocab_size = 256

    def encode(self, text: str) -> torch.Tensor:
        """``text`` -> int64 tensor ``[N]`` of its UTF-8 bytes, each in ``0 .. 255``."""
        if not isinstance(text, str):
            raise ValueError(f"encode takes a str, got {type(text).__name__}: "
                             f"decode bytes first (bytes.decode('utf-8'))")
        data = bytearray(text.encode("utf-8"))
        if not data:
            return torch.zeros(0, dtype=torch.int64)
        return torch.frombuffer(data, dtype=torch.uint8).to(torch.int64)

    def decode(self, tokens) -> str:
        """Tokens (a tensor of any shape, read in order, or a list of ints) -> text. A window
        cut in the middle of a multi-byte character shows the cut bytes as U+FFFD."""
        values = torch.as_tensor(tokens).reshape(-1).tolist()
        bad = [v for v in values if not (isinstance(v, int) and 0 <= v < self.vocab_size)]
        if bad:
            raise ValueError(f"decode takes byte tokens 0..255, got {bad[0]!r}: pass the "
                             f"output of ByteTokenizer.encode (or the model's argmax)")
        return bytes(values).decode("utf-8", errors="replace")


def _count(name: str, value, least: int = 1) -> int:
    """``value`` as an int >= ``least``, or a one-line error naming ``name``."""
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be a whole number >= {least}, got {value!r}") from None
    if number < least:
        raise ValueError(f"{name} must be >= {least}, got {number}")
    return number


class TextLoader:
    """Global batches of ``batch`` windows of ``seq`` tokens from ``tokens``, a pure function
    of ``(seed, split, step)``.

    Args:
        tokens: int64 ``[N]``, e.g. ``ByteTokenizer().encode(load_corpus())``.
        batch: ``B``, the rows of the *global* batch (every DP rank's rows together).
        seq: ``S``, tokens per row; a window reads ``S + 1`` tokens.
        seed: the run's seed; another seed draws other windows.
        split: ``"train"`` (the first 95 % of the tokens) or ``"val"`` (the last 5 %).
    """

    def __init__(self, tokens: torch.Tensor, batch: int, seq: int, seed: int = 0,
                 split: str = "train"):
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1 or \
                tokens.dtype.is_floating_point or tokens.dtype.is_complex or \
                tokens.dtype == torch.bool:
            raise ValueError("tokens must be a 1-D integer tensor: pass "
                             "ByteTokenizer().encode(load_corpus())")
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is unknown: use one of {SPLITS}")
        self.batch = _count("batch", batch)
        self.seq = _count("seq", seq)
        try:
            self.seed = operator.index(seed)
        except TypeError:
            raise ValueError(f"seed must be a whole number, got {seed!r}") from None
        self.split = split
        cut = len(tokens) - int(len(tokens) * VAL_FRACTION)      # first token of "val"
        self.tokens = (tokens[:cut] if split == "train" else tokens[cut:]).to(torch.int64)
        if self.seq >= len(self.tokens):
            raise ValueError(f"seq={self.seq} needs seq + 1 tokens, but the {split} split has "
                             f"{len(self.tokens)} (of {len(tokens)}): use a shorter seq or "
                             f"more text")
        self._offsets = torch.arange(self.seq + 1)                # [S + 1]

    @property
    def windows(self) -> int:
        """How many distinct windows the split holds: each start ``0 .. len - S - 1``."""
        return len(self.tokens) - self.seq

    def starts(self, step: int) -> torch.Tensor:
        """int64 ``[B]``: where each row of step ``step``'s batch starts in ``self.tokens``."""
        step = _count("step", step, least=0)
        gen = generator_for(self.seed, "capstone-text", self.split, step)
        return torch.randint(0, self.windows, (self.batch,), generator=gen, dtype=torch.int64)

    def global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens, targets)``, both int64 ``[B, S]`` on the CPU, the same on every rank:
        row ``b`` is the window at ``starts(step)[b]``, ``targets`` the same window one token
        later. Move them with ``.to(device)``."""
        rows = self.tokens[self.starts(step)[:, None] + self._offsets]   # [B, S + 1]
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()       # [B, S], [B, S]

    def __repr__(self) -> str:
        return (f"TextLoader(batch={self.batch}, seq={self.seq}, seed={self.seed}, "
                f"split={self.split!r}, {len(self.tokens)} tokens)")
