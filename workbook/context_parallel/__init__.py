"""Family: context parallelism (lab ``cp_ring``): the given pieces of ring attention
(``context_parallel``), the lab's benchmark and report.

A family imports the layers below it, never another family. This ``__init__`` only re-exports
the given pieces, each imported on first use (so a family's bench or report imports no torch
until it needs it).
"""
from __future__ import annotations

import importlib

_GIVEN = dict.fromkeys((
    "BlockCallTimer", "CAUSAL", "FULL", "Layout", "Partial", "RingTransfer", "SKIP",
    "block_backward", "block_forward", "contiguous_layout", "cp_attention", "cp_rank",
    "cp_world_size", "finish", "reference_attention", "reference_lse", "ring_neighbours",
    "start_ring_exchange", "sync_cp_grads"
), "context_parallel")


def __getattr__(name: str):          # PEP 562: ``from workbook.context_parallel import X``
    if name not in _GIVEN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_GIVEN[name]}"), name)
