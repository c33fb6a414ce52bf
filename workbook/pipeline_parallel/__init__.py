"""Family: pipeline parallelism (lab ``pp_overlap``): the given pieces (stage units, the schedule
checker, ``simulate``, the executors: ``pipeline_parallel``), the lab's benchmark and report.

A family imports the layers below it, never another family. This ``__init__`` only re-exports
the given pieces, each imported on first use (so a family's bench or report imports no torch
until it needs it).
"""
from __future__ import annotations

import importlib

_GIVEN = {
    "Action": "pipeline_parallel", "stage_units": "pipeline_parallel",
    "PipelineStage": "pipeline_parallel", "micro_batches": "pipeline_parallel",
    "activation_shape": "pipeline_parallel", "ScheduleError": "pipeline_parallel",
    "check_schedule": "pipeline_parallel", "Timeline": "pipeline_parallel",
    "simulate": "pipeline_parallel", "bubble_fraction": "pipeline_parallel",
    "peak_in_flight": "pipeline_parallel", "phases": "pipeline_parallel",
    "StageExecutor": "pipeline_parallel", "B": "pipeline_parallel", "F": "pipeline_parallel"
}


def __getattr__(name: str):          # PEP 562: ``from workbook.pipeline_parallel import X``
    if name not in _GIVEN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_GIVEN[name]}"), name)
