"""Family: context parallelism (lab ``cp_ring``): the given pieces of ring attention
(``context_parallel``), the lab's benchmark and report.

A family imports the layers below it, never another family. This ``__init__`` only re-exports
the given pieces, each imported on first use (so a family's bench or report imports no torch
until it needs it).
"""
from __future__ import annotations

import importlib

_GIVEN = {
    "cp_rank": "context_parallel", "cp_world_size": "context_parallel",
    "ring_neighbours": "context_parallel", "RingTransfer": "context_parallel",
    "start_ring_exchange": "context_parallel", "Layout": "context_parallel",
    "contiguous_layout": "context_parallel", "Partial": "context_parallel",
    "block_forward": "context_parallel", "finish": "context_parallel",
    "block_backward": "context_parallel", "reference_attention": "context_parallel",
    "reference_lse": "context_parallel", "cp_attention": "context_parallel",
    "sync_cp_grads": "context_parallel", "BlockCallTimer": "context_parallel",
    "CAUSAL": "context_parallel", "FULL": "context_parallel", "SKIP": "context_parallel"
}


def __getattr__(name: str):          # PEP 562: ``from workbook.context_parallel import X``
    if name not in _GIVEN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_GIVEN[name]}"), name)
