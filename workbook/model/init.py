"""Deterministic randomness: every random number is a function of names.

Each full weight is a pure function of ``(cfg.seed, parameter name)``, and
each dropout mask a pure function of ``(cfg.seed, site name, step)``:

    seed_of(parts) = first 8 bytes of sha256(repr(parts))  (63-bit integer)
    W(name)        = std(name) * N(0, 1) drawn from a CPU torch.Generator
                     seeded with seed_of((cfg.seed, "weight", name)), in float64,
                     then cast to cfg.dtype

Nothing depends on the order in which parameters are built, on the process or
on the device. So a tensor-parallel rank gets exactly its piece of the
single-device model by generating the full tensor and slicing it
(:func:`workbook.model.sharding.local_weight`), and a sequence-parallel rank
reproduces the reference dropout by slicing the full mask along the sequence.

The scale of each weight follows GPT-2 / Megatron-LM (arXiv 1909.08053):
std 0.02 for every matrix, and 0.02 / sqrt(2 L) for the matrices that write
into the residual stream (``wo``, ``fc2``, ``w_down``). Two deliberate
departures from the textbook, so that a lab's mistakes show up in numbers:
biases are small random values instead of zeros (a row-parallel bias added on
every rank instead of once is then visible), and norm gains are 1 plus small
noise instead of exactly 1 (a norm applied with the wrong slice of its gain is
then visible).
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from typing import Dict, Optional, Sequence, Tuple

import torch

from .config import ModelConfig

WEIGHT_STD = 0.02
BIAS_STD = 0.02
NORM_GAIN_NOISE = 0.02
# Matrices that add into the residual stream get std / sqrt(2 L).
RESIDUAL_OUTPUTS = ("attn.wo.weight", "mlp.fc2.weight", "mlp.w_down.weight")


def stable_seed(*parts) -> int:
    """A 63-bit seed from any tuple of ints/strings, equal in every process.

    Python's ``hash`` of a string changes per process; sha256 does not.
    """
    digest = hashlib.sha256(repr(tuple(parts)).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def generator_for(*parts) -> torch.Generator:
    """A CPU generator seeded from :func:`stable_seed` of ``parts``."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(stable_seed(*parts))
    return gen


def parameter_shapes(cfg: ModelConfig) -> "OrderedDict[str, Tuple[int, ...]]":
    """Name -> full shape of every parameter of ``ReferenceModel(cfg)``.

    Linear weights are stored ``[out, in]`` (y = x @ W.T + b), embeddings and
    the LM head ``[V, H]``. gpt style (biases, LayerNorm, learned positions)::

        embed.tok.weight            [V, H]
        embed.pos.weight            [S, H]
        blocks.{i}.norm1.weight     [H]      .bias [H]
        blocks.{i}.attn.wq.weight   [H, H]   .bias [H]    (also wk, wv)
        blocks.{i}.attn.wo.weight   [H, H]   .bias [H]
        blocks.{i}.norm2.weight     [H]      .bias [H]
        blocks.{i}.mlp.fc1.weight   [F, H]   .bias [F]
        blocks.{i}.mlp.fc2.weight   [H, F]   .bias [H]
        norm_f.weight               [H]      .bias [H]
        head.weight                 [V, H]

    llama style: no biases, no ``embed.pos``, RMSNorm (weight only), and the
    MLP is ``mlp.w_gate.weight [F, H]``, ``mlp.w_up.weight [F, H]``,
    ``mlp.w_down.weight [H, F]``. The embedding and head are not tied.
    """
    V, H, F, S = cfg.vocab_size, cfg.hidden, cfg.ffn_hidden, cfg.seq_len
    gpt = cfg.style == "gpt"
    shapes: "OrderedDict[str, Tuple[int, ...]]" = OrderedDict()

    def linear(name: str, out_f: int, in_f: int) -> None:
        shapes[f"{name}.weight"] = (out_f, in_f)
        if gpt:
            shapes[f"{name}.bias"] = (out_f,)

    def norm(name: str) -> None:
        shapes[f"{name}.weight"] = (H,)
        if gpt:
            shapes[f"{name}.bias"] = (H,)

    shapes["embed.tok.weight"] = (V, H)
    if gpt:
        shapes["embed.pos.weight"] = (S, H)
    for i in range(cfg.n_layers):
        b = f"blocks.{i}"
        norm(f"{b}.norm1")
        for w in ("wq", "wk", "wv"):
            linear(f"{b}.attn.{w}", H, H)
        linear(f"{b}.attn.wo", H, H)
        norm(f"{b}.norm2")
        if gpt:
            linear(f"{b}.mlp.fc1", F, H)
            linear(f"{b}.mlp.fc2", H, F)
        else:
            linear(f"{b}.mlp.w_gate", F, H)
            linear(f"{b}.mlp.w_up", F, H)
            linear(f"{b}.mlp.w_down", H, F)
    norm("norm_f")
    shapes["head.weight"] = (V, H)
    return shapes


def _is_norm(name: str) -> bool:
    return any(part.startswith("norm") for part in name.split(".")[:-1])


# Drawing a large model's weights in float64 takes seconds (100M numbers: about 3 s on one
# core), and a test suite builds the same model again and again in the same warm rank
# processes. Since a weight is a pure function of its key, a process may keep the weights it
# drew, up to WORKBOOK_WEIGHT_CACHE_MB megabytes (default 0: keep none; the package's tests set
# it), the least recently used dropped first. A kept weight is handed out as a copy.
_KEPT: "OrderedDict[tuple, torch.Tensor]" = OrderedDict()


def _keep_budget() -> int:
    import os
    try:
        return max(0, int(float(os.environ.get("WORKBOOK_WEIGHT_CACHE_MB", "0")) * 2**20))
    except ValueError:
        return 0


def full_weight(cfg: ModelConfig, name: str, shape: Sequence[int],
                device: Optional[torch.device] = None) -> torch.Tensor:
    """The full (unsharded) initial value of parameter ``name``.

    A pure function of ``(cfg.seed, name, shape)``: drawn in float64 on the
    CPU, then cast to ``cfg.dtype`` (so fp32 weights are the fp64 weights
    rounded) and moved to ``device``. Always a new tensor (a kept one is copied).
    """
    shape = tuple(int(s) for s in shape)
    key = (cfg.seed, name, shape, cfg.n_layers, cfg.torch_dtype)
    budget = _keep_budget()
    if key in _KEPT:
        _KEPT.move_to_end(key)
        return _KEPT[key].clone().to(device=device)
    value = _draw_weight(cfg, name, shape)
    nbytes = value.numel() * value.element_size()
    if 0 < nbytes <= budget:
        _KEPT[key] = value
        while sum(t.numel() * t.element_size() for t in _KEPT.values()) > budget:
            _KEPT.popitem(last=False)
        value = value.clone()
    return value.to(device=device)


def _draw_weight(cfg: ModelConfig, name: str, shape: Tuple[int, ...]) -> torch.Tensor:
    """``full_weight``'s value on the CPU, drawn (see the module docstring)."""
    gen = generator_for(cfg.seed, "weight", name)
    noise = torch.randn(shape, generator=gen, dtype=torch.float64)
    if _is_norm(name):
        value = (1.0 + NORM_GAIN_NOISE * noise) if name.endswith(".weight") else BIAS_STD * noise
    elif name.endswith(".bias"):
        value = BIAS_STD * noise
    elif name.endswith(RESIDUAL_OUTPUTS):
        value = (WEIGHT_STD / math.sqrt(2.0 * cfg.n_layers)) * noise
    else:
        value = WEIGHT_STD * noise
    return value.to(dtype=cfg.torch_dtype)


def full_weights(cfg: ModelConfig, device: Optional[torch.device] = None) -> Dict[str, torch.Tensor]:
    """Every full weight of the model, by name (see :func:`parameter_shapes`)."""
    return {n: full_weight(cfg, n, s, device) for n, s in parameter_shapes(cfg).items()}


def dropout_mask(cfg: ModelConfig, site_name: str, shape: Sequence[int], step: int = 0,
                 device: Optional[torch.device] = None) -> torch.Tensor:
    """The multiplicative dropout mask at one call site for one step.

    Returns a tensor of ``shape`` in ``cfg.dtype`` whose entries are 0 (with
    probability p = cfg.dropout) or 1 / (1 - p) (inverted dropout, so the
    expectation of ``x * mask`` is x). Drawn on the CPU from a generator
    seeded with ``(cfg.seed, "dropout", site_name, step)``.

    Site names are ``blocks.{i}.attn.dropout`` and ``blocks.{i}.mlp.dropout``
    (after the attention and MLP outputs, before the residual add). The
    reference applies the mask to activations of shape ``[B, S, H]``; a
    sequence-parallel rank that holds positions ``s0:s1`` draws the same
    full-shape mask and uses ``mask[:, s0:s1, :]`` — identical to the
    reference bit for bit, on any device and any number of ranks (a Domino
    batch chunk ``b0:b1`` likewise uses ``mask[b0:b1]``). Use a new
    ``step`` for each training step so masks differ between steps.
    """
    shape = tuple(int(s) for s in shape)
    p = float(cfg.dropout)
    if p == 0.0:
        return torch.ones(shape, dtype=cfg.torch_dtype, device=device)
    gen = generator_for(cfg.seed, "dropout", site_name, int(step))
    keep = torch.rand(shape, generator=gen, dtype=torch.float64) >= p
    mask = keep.to(torch.float64) / (1.0 - p)
    return mask.to(dtype=cfg.torch_dtype, device=device)
