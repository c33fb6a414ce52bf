"""The capstone's real text (``workbook.capstone.text_data``): the corpus ships and is small, the
byte tokenizer round-trips, and the loader's global batch is a pure function of (seed, split,
step): the same in another process, different for another step, its targets the tokens shifted
by one, its train and val windows apart; bad input is one line that says what to fix.

No ranks: the whole file runs in a few seconds.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import torch

import workbook
from workbook.capstone.text_data import (CORPUS, VAL_FRACTION, ByteTokenizer, TextLoader,
                                         load_corpus)

ROOT = Path(workbook.__file__).resolve().parents[1]
TOK = ByteTokenizer()


@pytest.fixture(scope="module")
def corpus_tokens() -> torch.Tensor:
    return TOK.encode(load_corpus())


# ------------------------------------------------------------------------------------ the corpus
def test_the_corpus_ships_inside_the_package_and_is_small():
    path = resources.files("workbook.capstone").joinpath("data").joinpath(CORPUS)
    data = path.read_bytes()
    assert 200_000 <= len(data) <= 1_000_000, f"the corpus is {len(data)} bytes"
    assert load_corpus() == data.decode("utf-8")
    text = data.decode("ascii")                        # plain ASCII: one token per character
    assert text.startswith("_The Devil's Dictionary_ was begun in a weekly paper in 1881")
    assert text.endswith("the domestic cow sheds its horn every two years.\n")
    assert "Wiretap" not in text and "\r" not in text and "\t" not in text   # no header, plain
    assert text.count("\nZOOLOGY, n.") == 1 and text.count("\nABASEMENT, n.") == 1


def test_an_installed_wheel_and_a_student_release_carry_the_corpus():
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "data/*.txt" in config["tool"]["setuptools"]["package-data"]["workbook.capstone"]
    from workbook.instructor.release import _tree         # what `workbook release` copies
    assert f"workbook/capstone/data/{CORPUS}" in _tree(ROOT, "workbook/capstone")


# --------------------------------------------------------------------------------- the tokenizer
@pytest.mark.parametrize("text", ["", "Hello, world.\n", "naïve café — 語 🙂", load_corpus()[:5000]])
def test_encode_then_decode_gives_the_text_back(text):
    tokens = TOK.encode(text)
    assert tokens.dtype == torch.int64 and tokens.dim() == 1
    assert tokens.tolist() == list(text.encode("utf-8"))       # the UTF-8 bytes, in order
    assert TOK.decode(tokens) == text and TOK.decode(tokens.tolist()) == text
    assert TOK.vocab_size == 256


def test_every_token_of_the_corpus_is_a_byte(corpus_tokens):
    assert len(corpus_tokens) == len(load_corpus())            # ASCII: a token per character
    assert 0 <= int(corpus_tokens.min()) and int(corpus_tokens.max()) < TOK.vocab_size


@pytest.mark.parametrize("call, match", [
    (lambda: TOK.encode(b"bytes"), "encode takes a str, got bytes"),
    (lambda: TOK.decode([72, 256]), "decode takes byte tokens 0..255, got 256"),
    (lambda: TOK.decode(torch.tensor([-1])), "got -1"),
])
def test_the_tokenizer_refuses_what_is_not_text_or_bytes(call, match):
    with pytest.raises(ValueError, match=match) as err:
        call()
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------------ the loader
def test_a_batch_is_windows_of_the_text_and_targets_are_them_shifted_by_one(corpus_tokens):
    loader = TextLoader(corpus_tokens, batch=6, seq=48, seed=3)
    tokens, targets = loader.global_batch(7)
    assert tokens.shape == targets.shape == (6, 48)
    assert tokens.dtype == targets.dtype == torch.int64
    assert torch.equal(targets[:, :-1], tokens[:, 1:])         # the shift by one
    for b, start in enumerate(loader.starts(7).tolist()):
        assert torch.equal(tokens[b], corpus_tokens[start:start + 48])
        assert torch.equal(targets[b], corpus_tokens[start + 1:start + 49])
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 256


def test_the_same_step_gives_the_same_batch_in_any_order_and_any_loader(corpus_tokens):
    first = TextLoader(corpus_tokens, batch=4, seq=32, seed=1)
    again = TextLoader(corpus_tokens, batch=4, seq=32, seed=1)
    late = first.global_batch(1000)                # made directly, no earlier step replayed
    for step in (0, 1, 2):
        first.global_batch(step)
    for a, b in zip(late, again.global_batch(1000)):
        assert torch.equal(a, b)
    for a, b in zip(first.global_batch(1000), late):
        assert torch.equal(a, b)


def _digest(tokens: torch.Tensor, targets: torch.Tensor) -> str:
    return hashlib.sha256(tokens.numpy().tobytes() + targets.numpy().tobytes()).hexdigest()


def test_another_process_makes_the_same_batch(corpus_tokens):
    here = _digest(*TextLoader(corpus_tokens, batch=4, seq=32, seed=5).global_batch(11))
    code = ("import hashlib; from workbook.capstone.text_data import *; "
            "t, y = TextLoader(ByteTokenizer().encode(load_corpus()), 4, 32, 5).global_batch(11); "
            "print(hashlib.sha256(t.numpy().tobytes() + y.numpy().tobytes()).hexdigest())")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONHASHSEED="12345")   # another str hash
    there = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=120, check=True).stdout.strip()
    assert there == here


def test_other_steps_seeds_and_splits_draw_other_windows(corpus_tokens):
    loader = TextLoader(corpus_tokens, batch=8, seq=32, seed=0)
    steps = {tuple(loader.starts(step).tolist()) for step in range(20)}
    assert len(steps) == 20
    assert not torch.equal(loader.global_batch(0)[0],
                           TextLoader(corpus_tokens, 8, 32, seed=1).global_batch(0)[0])
    assert not torch.equal(loader.global_batch(0)[0],
                           TextLoader(corpus_tokens, 8, 32, split="val").global_batch(0)[0])


def test_train_and_val_windows_never_overlap():
    tokens = torch.arange(1000)                     # each token says where it sits
    cut = 1000 - int(1000 * VAL_FRACTION)          # 950: the first token held out
    train = TextLoader(tokens, batch=64, seq=10, split="train")
    val = TextLoader(tokens, batch=64, seq=10, split="val")
    seen_train = torch.cat([torch.cat(train.global_batch(s), 1) for s in range(30)])
    seen_val = torch.cat([torch.cat(val.global_batch(s), 1) for s in range(30)])
    assert int(seen_train.max()) == cut - 1 and int(seen_train.min()) == 0  # reaches both ends
    assert int(seen_val.min()) == cut and int(seen_val.max()) == 999
    assert train.windows == cut - 10 and val.windows == 1000 - cut - 10


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch=0), "batch must be >= 1, got 0"),
    (dict(batch=-2), "batch must be >= 1, got -2"),
    (dict(batch=2.5), "batch must be a whole number >= 1, got 2.5"),
    (dict(seq=0), "seq must be >= 1, got 0"),
    (dict(seq=400), r"seq=400 needs seq \+ 1 tokens, but the train split has 380 \(of 400\)"),
    (dict(seq=20, split="val"), r"the val split has 20 \(of 400\): use a shorter seq"),
    (dict(split="test"), r"split='test' is unknown: use one of \('train', 'val'\)"),
    (dict(seed="x"), "seed must be a whole number"),
    (dict(tokens=torch.rand(400)), "tokens must be a 1-D integer tensor"),
    (dict(tokens=torch.zeros(4, 100, dtype=torch.int64)), "tokens must be a 1-D integer tensor"),
    (dict(tokens="some text"), r"pass ByteTokenizer\(\).encode\(load_corpus\(\)\)"),
])
def test_bad_loader_arguments_say_what_to_fix(kwargs, match):
    args = dict(tokens=torch.arange(400) % 256, batch=2, seq=8) | kwargs
    with pytest.raises(ValueError, match=match) as err:
        TextLoader(**args)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("step, match", [(-1, "step must be >= 0, got -1"),
                                         (1.5, "step must be a whole number >= 0, got 1.5")])
def test_a_bad_step_says_what_to_fix(step, match):
    with pytest.raises(ValueError, match=match):
        TextLoader(torch.arange(400) % 256, 2, 8).global_batch(step)
