"""How each named parameter is split over tensor-parallel ranks.

The layout is Megatron-LM's (Shoeybi et al. 2019, arXiv 1909.08053, sec. 3).
Linear weights are stored ``[out, in]`` and applied as y = x @ W.T + b.

* column-parallel (``wq wk wv``, ``fc1``, ``w_gate w_up``): split the output
  dim, ``("column", 0)`` for weight and bias. Rank r owns output features
  ``r*out/tp : (r+1)*out/tp``; for q/k/v those are whole heads
  ``r*heads/tp : (r+1)*heads/tp`` (heads are contiguous in the output dim).
* row-parallel (``wo``, ``fc2``, ``w_down``): split the input dim,
  ``("row", 1)``. Each rank makes a partial sum that an all-reduce (or a
  reduce-scatter in sequence parallelism) completes; the bias is
  ``("replicated", None)`` and must be added once, after the reduction.
* vocab-parallel (``embed.tok``, ``head``): split the vocab dim of the
  ``[V, H]`` table, ``("vocab", 0)``.
* replicated: norms, learned positions, row-parallel biases.

:func:`slice_for_rank` also accepts ``("sequence", dim)`` to cut an
activation (or a dropout mask) into sequence shards for sequence parallelism.
The reference's activations are ``[B, S, H]``, so sequence shards cut dim 1
(Megatron-LM keeps ``[S, B, H]`` and cuts dim 0; the idea is the same).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from .config import ModelConfig
from .init import full_weight, parameter_shapes

KINDS = ("column", "row", "vocab", "replicated", "sequence")


class ShardSpec(NamedTuple):
    """How a tensor is split: ``kind`` and the ``dim`` cut (None: not cut)."""

    kind: str
    dim: Optional[int]


COLUMN = ShardSpec("column", 0)
ROW = ShardSpec("row", 1)
VOCAB = ShardSpec("vocab", 0)
REPLICATED = ShardSpec("replicated", None)

# First match wins; patterns are matched against the end of the full name.
_RULES: List[Tuple[str, ShardSpec]] = [
    (r"embed\.tok\.weight", VOCAB),
    (r"embed\.pos\.weight", REPLICATED),
    (r"head\.weight", VOCAB),
    (r"attn\.w[qkv]\.(weight|bias)", COLUMN),
    (r"attn\.wo\.weight", ROW),
    (r"attn\.wo\.bias", REPLICATED),
    (r"mlp\.(fc1|w_gate|w_up)\.(weight|bias)", COLUMN),
    (r"mlp\.(fc2|w_down)\.weight", ROW),
    (r"mlp\.(fc2|w_down)\.bias", REPLICATED),
    (r"norm\w*\.(weight|bias)", REPLICATED),
]


def shard_spec(name: str) -> ShardSpec:
    """How parameter ``name`` is split over tensor-parallel ranks.

    >>> shard_spec("blocks.0.attn.wq.weight")
    ShardSpec(kind='column', dim=0)
    >>> shard_spec("blocks.1.mlp.fc2.weight")
    ShardSpec(kind='row', dim=1)
    """
    for pattern, spec in _RULES:
        if re.search(rf"(^|\.){pattern}$", name):
            return spec
    raise KeyError(f"no shard spec for parameter {name!r}: names look like "
                   f"'blocks.0.attn.wq.weight' (see workbook.model.init.parameter_shapes)")


def _as_spec(spec) -> ShardSpec:
    spec = ShardSpec(*spec)
    if spec.kind not in KINDS:
        raise ValueError(f"unknown shard kind {spec.kind!r}: use one of {KINDS}")
    if spec.kind != "replicated" and spec.dim is None:
        raise ValueError(f"a {spec.kind!r} shard needs a dim")
    return spec


def shard_range(size: int, rank: int, world_size: int, what: str = "dim") -> Tuple[int, int]:
    """``(start, stop)`` of rank's equal, contiguous piece of ``size``."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    if size % world_size:
        raise ValueError(f"cannot split {what} of size {size} into {world_size} equal pieces "
                         f"(choose a size divisible by {world_size})")
    piece = size // world_size
    return rank * piece, (rank + 1) * piece


def slice_for_rank(full: torch.Tensor, spec, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s piece of ``full`` under ``spec`` (a fresh tensor).

    ``spec`` is a :class:`ShardSpec` or a ``(kind, dim)`` pair. Replicated
    tensors are returned whole (cloned). Raises ``ValueError`` when the cut
    dim does not divide by ``world_size``.
    """
    spec = _as_spec(spec)
    if spec.kind == "replicated":
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        return full.detach().clone()
    dim = spec.dim % full.dim()
    start, stop = shard_range(full.shape[dim], rank, world_size,
                              what=f"dim {dim} ({spec.kind} shard, shape {tuple(full.shape)})")
    return full.detach().narrow(dim, start, stop - start).clone()


def unslice(pieces: Sequence[torch.Tensor], spec) -> torch.Tensor:
    """Inverse of :func:`slice_for_rank`: join every rank's piece (rank order)."""
    spec = _as_spec(spec)
    if spec.kind == "replicated":
        return pieces[0].detach().clone()
    return torch.cat([p.detach() for p in pieces], dim=spec.dim)


def local_weight(cfg: ModelConfig, name: str, rank: int, world_size: int,
                 device: Optional[torch.device] = None) -> torch.Tensor:
    """Rank's piece of the initial value of parameter ``name``.

    Generates the full weight (:func:`workbook.model.init.full_weight`) and
    slices it by :func:`shard_spec`, so it equals the matching slice of
    ``ReferenceModel(cfg)`` exactly.
    """
    shapes = parameter_shapes(cfg)
    if name not in shapes:
        raise KeyError(f"{name!r} is not a parameter of a {cfg.style}-style model with "
                       f"{cfg.n_layers} layers (see workbook.model.init.parameter_shapes)")
    full = full_weight(cfg, name, shapes[name])
    return slice_for_rank(full, shard_spec(name), rank, world_size).to(device)


def shard_table(cfg: ModelConfig, world_size: int = 1) -> Dict[str, Tuple[Tuple[int, ...], ShardSpec, Tuple[int, ...]]]:
    """Name -> (full shape, spec, local shape on each of ``world_size`` ranks)."""
    cfg.validate(tp=world_size)
    table: Dict[str, Tuple[Tuple[int, ...], ShardSpec, Tuple[int, ...]]] = OrderedDict()
    for name, shape in parameter_shapes(cfg).items():
        spec = shard_spec(name)
        local = list(shape)
        if spec.dim is not None:
            local[spec.dim] //= world_size
        table[name] = (tuple(shape), spec, tuple(local))
    return table
