"""Family: tensor parallelism (labs ``tp``, ``sp``, ``domino``, ``tp_overlap``).

Given pieces: ``mappings`` (the conjugate f/g region ops, Megatron's ``copy_to_tensor_parallel_region``
family, vocab-parallel cross-entropy, a rank's slice of a dimension), ``sequence_parallel`` (the
sequence collectives, blocking or started), ``layer_stack`` (one rank's blocks as plain functions,
which Domino schedules). Then each lab's benchmark, report and lesson helpers, named after it.

A family imports the layers below it, never another family. This ``__init__`` only re-exports
the given pieces, each imported on first use (so a family's bench or report imports no torch
until it needs it).
"""
from __future__ import annotations

import importlib

_GIVEN = {  # name -> the module that defines it
    **dict.fromkeys(("SUBLAYERS", "all_reduce_sum", "conjugate_op",
                     "copy_to_tensor_parallel_region", "gather_last_dim", "local_param",
                     "mark_sequence_parallel", "reduce_from_tensor_parallel_region",
                     "row_parallel_name", "sequence_range", "split_last_dim", "tp_rank",
                     "tp_world_size", "vocab_parallel_cross_entropy", "vocab_range"), "mappings"),
    **dict.fromkeys(("Pending", "SequenceParallelBlock", "ShardedLinear", "all_gather_sequence",
                     "all_reduce_grads", "reduce_scatter_sequence", "start_all_gather_sequence",
                     "start_reduce_scatter_sequence", "sync_sequence_parallel_grads"),
                    "sequence_parallel"),
}


def __getattr__(name: str):          # PEP 562: ``from workbook.tensor_parallel import X``
    if name not in _GIVEN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_GIVEN[name]}"), name)
