"""Family: data parallelism and the distributed optimizer (lab ``dp_overlap``): the given
pieces (``data_parallel``), the lab's benchmark and report.

A family imports the layers below it, never another family. This ``__init__`` only re-exports
the given pieces, each imported on first use (so a family's bench or report imports no torch
until it needs it).
"""
from __future__ import annotations

import importlib

_GIVEN = dict.fromkeys((
    "ADAM", "FlatParameters", "KINDS", "STAGE", "Trainer", "dp_rank", "dp_world_size",
    "layer_units", "local_rows", "memory_by_kind", "predicted_memory", "train_reference"
), "data_parallel")


def __getattr__(name: str):          # PEP 562: ``from workbook.data_parallel import X``
    if name not in _GIVEN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_GIVEN[name]}"), name)
