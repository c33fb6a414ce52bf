"""Family: pipeline parallelism (labs ``pp_overlap`` and ``pp_schedules``): the given pieces (stage
units, the schedule checker, ``simulate``, the executors: ``pipeline_parallel``; placements,
the chunked checker and ``simulate_chunked``: ``virtual_stages``; B and W of a chunk's backward:
``split_backward``; ``ChunkedExecutor``, a rank's chunks running a chunked schedule:
``chunked_executor``), the benchmarks and reports.

A family imports the layers below it, never another family. This ``__init__`` only re-exports
the given pieces, each imported on first use (so a family's bench or report imports no torch
until it needs it).
"""
from __future__ import annotations

import importlib

_GIVEN = dict.fromkeys((
    "Action", "B", "F", "PipelineStage", "ScheduleError", "StageExecutor", "Timeline",
    "activation_shape", "bubble_fraction", "check_schedule", "micro_batches", "peak_in_flight",
    "phases", "simulate", "stage_units"
), "pipeline_parallel") | dict.fromkeys((
    "W", "ChunkAction", "ChunkedTimeline", "INTERLEAVED", "PLACEMENTS", "V_SHAPE",
    "check_chunked_schedule", "check_interleaved_shape", "interleaved_bubble_fraction",
    "rank_and_chunk", "simulate_chunked", "stage_index"
), "virtual_stages") | dict.fromkeys((
    "SplitLinear", "WeightGradStore", "split_linears"
), "split_backward") | dict.fromkeys((
    "ChunkedExecutor", "action_name", "destination_of", "source_of"
), "chunked_executor")


def __getattr__(name: str):          # PEP 562: ``from workbook.pipeline_parallel import X``
    if name not in _GIVEN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_GIVEN[name]}"), name)
