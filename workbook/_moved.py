"""Old import paths, each answered with one line that names the new place.

The package was laid out by families and layers (``docs/architecture.md``). A notebook or lab
file written before that, say ``from workbook.tp import conjugate_op``, gets an ``ImportError``
that says where the module went instead of a bare "No module named". Only exact old names are
answered; everything else imports as usual.
"""
from __future__ import annotations

import importlib.abc
import sys

MOVED = {
    "launch": "workbook.runtime.launch", "pool": "workbook.runtime.pool",
    "ranks": "workbook.runtime.ranks", "gpu": "workbook.runtime.gpu",
    "flight": "workbook.runtime.flight", "multinode": "workbook.runtime.multinode",
    "node_placement": "workbook.runtime.node_placement",
    "multinode_probe": "workbook.grading.multinode_probe",
    "presets": "workbook.link.presets", "topology": "workbook.link.topology",
    "program_order": "workbook.link.program_order", "colors": "workbook.trace.colors",
    "assign": "workbook.instructor.assign", "autograder": "workbook.instructor.autograder",
    "autograder.bundle": "workbook.instructor.autograder.bundle",
    "autograder.run": "workbook.instructor.autograder.run",
    "grading.classroom": "workbook.instructor.classroom", "selftest": "workbook.instructor.selftest",
    "grading.tp_checks": "workbook.grading.model_checks",
    "reduce_ops": "workbook.communication.reduce_ops (or: from workbook.communication import ...)",
    "bench": "workbook.communication.bandwidth_bench (its size options: workbook.measure.bench_cli)",
    "tp": "workbook.tensor_parallel.mappings (or: from workbook.tensor_parallel import ...; a rank's "
          "device: workbook.runtime.ranks.device())",
    "tp_stack": "workbook.tensor_parallel.layer_stack",
    "sequence_parallel": "workbook.tensor_parallel.sequence_parallel",
    "domino_plan": "workbook.tensor_parallel.domino_plan",
    "domino_measure": "workbook.tensor_parallel.domino_measure (recalibrate: "
                      "workbook.measure.calibration; profiled_step: workbook.measure.profiled_step)",
    "bench_domino": "workbook.tensor_parallel.domino_bench",
    "bench_tp_overlap": "workbook.tensor_parallel.tp_overlap_bench",
    "bench_dp_overlap": "workbook.data_parallel.dp_overlap_bench",
    "pipeline": "workbook.pipeline_parallel (from workbook.pipeline_parallel import ...)",
    "bench_pp_overlap": "workbook.pipeline_parallel.pp_overlap_bench",
    "bench_cp_ring": "workbook.context_parallel.cp_ring_bench",
    "reports": "workbook.measure (each lab's report: workbook.<family>.<lab>_report)",
    "reports.collectives": "workbook.communication.collectives_report",
    "reports.ring_allreduce": "workbook.communication.ring_allreduce_report",
    "reports.async_overlap": "workbook.communication.async_overlap_report",
    "reports.overlap_math": "workbook.communication.overlap_math_report",
    "reports.tp": "workbook.tensor_parallel.tp_report", "reports.sp": "workbook.tensor_parallel.sp_report",
    "reports.domino": "workbook.tensor_parallel.domino_report",
    "reports.tp_overlap": "workbook.tensor_parallel.tp_overlap_report",
    "reports.dp_overlap": "workbook.data_parallel.dp_overlap_report",
    "reports.pp_overlap": "workbook.pipeline_parallel.pp_overlap_report",
    "reports.cp_ring": "workbook.context_parallel.cp_ring_report",
}


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers an import of an old ``workbook.X`` path with an ImportError naming the new one."""

    def find_spec(self, fullname, path=None, target=None):
        old = fullname[len("workbook."):] if fullname.startswith("workbook.") else None
        if old in MOVED:
            raise ImportError(f"{fullname} has moved: import {MOVED[old]}", name=fullname)
        return None


def install() -> None:
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
