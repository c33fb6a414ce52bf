"""The capstone (issue 32): the course's pieces composed, and a real run planned.

It sits above the course families (the layers contract in ``pyproject.toml``): picotron's point
is that the parallelisms compose, so the capstone imports the families' *given* pieces (the
sequence-parallel block and collectives of ``tensor_parallel``, the pipeline stage and executor
base of ``pipeline_parallel``), never a lab's answer; the learner's own answers come in through
``workbook.grading.labs.load_lab`` (``pieces``). No family imports the capstone.

Lab ``capstone``: ``mesh`` (the 2-D mesh of process groups and ``Mesh.as_world``, an earlier
lab's world-wide code run inside one group), ``capstone_model`` (the sequence-parallel model
around any block; a pipeline stage holding the blocks a split chose), ``capstone_standins``
(the package's stand-ins for unfinished earlier labs) and ``pieces`` (which is used),
``capstone_train`` (the setup, the reference schedule, the single-device run),
``capstone_data`` (the seam to the shipped text, ``text_data``), ``capstone_traffic`` (bus
bytes per group, on paper and from a trace; hidden share per group) and ``capstone_run`` (the
runs on ranks the grader, the lesson, the report and the bench share). Around the lab: the
self-check's figures (``capstone_report``) and its one picture of a whole step
(``capstone_figures``), ``workbook bench capstone`` (``capstone_bench``), and lesson 14's helpers
on paper (``capstone_lesson``) and on ranks (``capstone_lesson_ranks``).

``workbook plan``: a 4D split of a real model on a real cluster predicted from the course's
formulas (``plan``), with its shapes and rules (``plan_shapes``), FLOPs (``plan_flops``), memory
(``plan_memory``), communication (``plan_comm``), the search over splits (``plan_search``) and
the command (``plan_cli``). The formulas of lab ``overlap_math`` are re-derived there on the link
layer's cost model (``workbook.link.topology``), which is torch-free, so ``workbook plan`` starts
without importing torch.
"""
from __future__ import annotations

import importlib

_GIVEN = {  # name -> the module that defines it (the lab's given pieces)
    **dict.fromkeys(("Mesh", "check_mesh_sizes", "check_rank_lists"), "mesh"),
    **dict.fromkeys(("SPLanguageModel", "stage_with_blocks"), "capstone_model"),
    **dict.fromkeys(("TrainSetup", "global_batches", "reference_lr", "train_single_device"),
                    "capstone_train"),
    **dict.fromkeys(("Piece", "load_piece", "load_pieces"), "pieces"),
    **dict.fromkeys(("bus_bytes", "traffic_model"), "capstone_traffic"),
    **dict.fromkeys(("check_run", "run_training", "run_traced"), "capstone_run"),
}


def __getattr__(name: str):          # PEP 562: ``from workbook.capstone import X``
    if name not in _GIVEN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_GIVEN[name]}"), name)
