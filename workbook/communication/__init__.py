"""Family: collective communication (labs ``collectives``, ``ring_allreduce``, ``async_overlap``,
``overlap_math``). Given pieces (the reduce operations), the collectives benchmark
(``workbook bench all_reduce``), and each lab's report.

A family imports the layers below it, never another family. This ``__init__`` only re-exports
the given pieces, each imported on first use (so a family's bench or report imports no torch
until it needs it).
"""
from __future__ import annotations

import importlib

_GIVEN = dict.fromkeys(("MAX", "MIN", "SUM", "combine"), "reduce_ops")


def __getattr__(name: str):          # PEP 562: ``from workbook.communication import X``
    if name not in _GIVEN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_GIVEN[name]}"), name)
