"""The rank side every overlap grader shares: one profiled step of the lab under test on the
simulated link, then what the link logged and what the trace says of each phase.

A grader's rank function names what is its own (the model, the warm-up, the step and its phase
marks) and reads the figures its judge needs::

    def _overlap(trace_dir):
        run = profile_lab_step(LAB, LINK, trace_dir, prepare, step)
        if isinstance(run, dict):                 # the lab raised: graded by the judge
            return run
        result = run.head()
        for phase in ("forward", "backward"):
            result[phase] = run.figures(phase, [r for r in run.link_ops if ...])
        return result

The judge's half (measured again after a near miss, structure first, then the hidden share) is
``workbook.grading.trace_checks``.
"""
from __future__ import annotations

from dataclasses import dataclass

from workbook.grading.trace_checks import overlap_figures


@dataclass
class LabStep:
    """One rank's profiled step: ``link_ops``, the link's records of what the step issued
    (barriers left out), ``trace``, this rank's trace, ``marks``, what ``step`` returned (times it
    noted), and ``spied``, what the spy's ``with`` gave (``BlockCallTimer``'s calls).

    (Not ``ops``: a rank function is sent to the ranks by value, and cloudpickle takes an
    attribute read in it, ``run.ops``, beside the global ``torch``, for the module ``torch.ops``,
    which it cannot pickle.)"""
    rank: int
    link: str
    link_ops: list
    trace: object
    marks: object = None
    spied: object = None

    def head(self) -> dict:
        """The start of every rank's result: ``{"rank", "link"}`` (the link's label)."""
        return {"rank": self.rank, "link": self.link}

    def figures(self, within: str, mine=None) -> dict:
        """``overlap_figures`` of the trace in phase ``within``; with ``mine`` (the link ops
        issued in it) also their names (``ops``), number (``count``), modelled transfer
        (``link_ms``) and the names of those never waited on (``never_waited``)."""
        out = overlap_figures(self.trace, within)
        if mine is not None:
            out.update(ops=sorted({r.op for r in mine}), count=len(mine),
                       link_ms=sum(r.modelled_ns for r in mine) / 1e6,
                       never_waited=sorted({r.op for r in mine if not r.first_wait_ns}))
        return out


def _count_gemms(lab):
    from workbook.link.program_order import CountGemms
    return CountGemms()


def profile_lab_step(lab_name: str, preset: str, trace_dir: str, prepare, step,
                     spy=_count_gemms) -> LabStep | dict:
    """On one rank: load the lab, re-calibrate the link ``preset`` to the matmul rate now (a busy
    machine slows compute: slow the link alike), ``state = prepare(lab)`` (the model, warm-up
    steps), then, all ranks starting together, ``marks = step(lab, state)`` inside the profiler
    (the trace in ``trace_dir``) and ``spy(lab)`` (by default ``CountGemms``: program order, the
    GEMMs run between an op's start and its wait). A lab that raised gives this rank's
    ``{"rank", "not_implemented"}`` or ``{"rank", "error", "traceback"}`` instead."""
    import os

    import torch.distributed as dist

    from workbook import link, trace
    from workbook.grading.labs import load_lab
    from workbook.grading.model_checks import rank_error
    from workbook.measure.calibration import recalibrate
    from workbook.trace.capture import rank_trace
    rank = dist.get_rank()
    try:
        lab = load_lab(lab_name)
        recalibrate(preset)
        state = prepare(lab)
        dist.barrier()
        before = len(link.op_log())
        with rank_trace(trace_dir, lab=lab_name), spy(lab) as spied:
            marks = step(lab, state)
    except NotImplementedError as exc:
        return {"rank": rank, "not_implemented": str(exc)}
    except Exception as exc:             # noqa: BLE001 - reported by the judge
        return {"rank": rank, **rank_error(exc)}
    ops = [r for r in link.op_log()[before:] if r.op != "barrier"]
    t = trace.load_trace(os.path.join(trace_dir, f"rank{rank}.trace.json"))
    return LabStep(rank, link.current_link().label, ops, t, marks, spied)
