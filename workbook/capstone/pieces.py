"""The learner's own earlier answers, composed by the capstone, or the package's stand-ins.

The capstone trains with the pieces the learner built in earlier labs, loaded from the
implementation under test (``workbook.grading.labs.load_lab``: ``labs/``, ``solutions/`` or a
folder), never from ``solutions/`` behind the learner's back:

=================  ==============================================  =============================
piece              from lab                                        stand-in (``capstone_standins``)
=================  ==============================================  =============================
``tp_block``       ``tp_overlap``: ``OverlapBlock`` with          ``plain_sp_block``
                   ``Overlap()`` (the ring exchange forward,
                   bulk overlap backward)
``make_buckets``   ``dp_overlap``: ``make_buckets``                ``buckets_in_backward_order``
``schedule``       ``pp_overlap``: ``one_f_one_b``                 ``one_f_one_b``
``executor``       ``pp_overlap``: ``OverlappedExecutor``          ``PairedExchangeExecutor``
=================  ==============================================  =============================

A piece is unfinished when its lab file is missing, does not import, or still holds a stub of
a function the piece needs (the generated ``raise NotImplementedError("not implemented yet:
LAB.NAME")``), or when the piece raises ``NotImplementedError`` on a tiny probe (the pure
functions). Then the stand-in is used and ``Piece.note`` says so, in the words the grader
prints: "tp_overlap is unfinished (...): the package's reference stands in (no points for the
TP overlap check)".
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: what each piece needs from its lab (a stub of any of these makes the piece unfinished)
NEEDS = {
    "tp_block": ("tp_overlap", ("exchange", "ring_all_gather_matmul", "ring_matmul_reduce_scatter",
                                "ColumnParallelMatmul", "RowParallelMatmul",
                                "column_parallel_linear", "row_parallel_linear",
                                "OverlapAttention", "OverlapMLP", "OverlapBlock")),
    "make_buckets": ("dp_overlap", ("make_buckets",)),
    "schedule": ("pp_overlap", ("one_f_one_b",)),
    "executor": ("pp_overlap", ("BlockingExecutor", "OverlappedExecutor")),
}
#: the check whose points rest on each piece
CHECK = {"tp_block": "TP overlap", "make_buckets": "DP overlap", "schedule": "PP overlap",
         "executor": "PP overlap"}


@dataclass
class Piece:
    """One composed piece: ``value`` (what the capstone calls), ``own`` (the learner's) and,
    for a stand-in, ``note`` (why, in the grader's words)."""
    name: str
    lab: str
    value: object
    own: bool
    note: str = ""


def unfinished(name: str) -> tuple[object, str | None]:
    """``(lab module or None, why it cannot serve piece ``name``, or None)``."""
    from workbook.grading.labs import LabDoesNotImport, load_lab
    lab, needs = NEEDS[name]
    try:
        module = load_lab(lab)
    except FileNotFoundError:
        return None, f"no {lab}.py in the implementation under test"
    except LabDoesNotImport as exc:
        return None, f"it does not import: {exc}"
    source = Path(module.__file__).read_text()
    stubs = [n for n in needs if f"not implemented yet: {lab}.{n}" in source]
    if stubs:
        return module, f"{', '.join(stubs)} still a stub"
    return module, None


def _probe(name: str, value) -> str | None:
    """Run a pure piece on a tiny input: None, or why it is unfinished."""
    import torch
    try:
        if name == "make_buckets":
            value([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))], 16)
        elif name == "schedule":
            value(2, 2, 0)
    except NotImplementedError as exc:
        return f"{exc}".replace("not implemented yet: ", "") + " raises NotImplementedError"
    return None


def load_piece(name: str) -> Piece:
    """Piece ``name`` (``tp_block``, ``make_buckets``, ``schedule``, ``executor``) from the
    implementation under test, or its stand-in."""
    from workbook.capstone import capstone_standins as standins
    lab_name = NEEDS[name][0]
    module, why = unfinished(name)
    value = None
    if why is None:
        if name == "tp_block":
            def value(cfg, layer, device, _lab=module):
                return _lab.OverlapBlock(cfg, layer, device, _lab.Overlap())
        else:
            value = getattr(module, {"make_buckets": "make_buckets", "schedule": "one_f_one_b",
                                     "executor": "OverlappedExecutor"}[name])
        why = _probe(name, value)
    if why is None:
        return Piece(name, lab_name, value, True)
    stand_in = {"tp_block": standins.plain_sp_block,
                "make_buckets": standins.buckets_in_backward_order,
                "schedule": standins.one_f_one_b,
                "executor": standins.PairedExchangeExecutor}[name]
    return Piece(name, lab_name, stand_in, False,
                 f"{lab_name} is unfinished ({why}): the package's reference stands in for "
                 f"{name} (no points for the {CHECK[name]} check)")


def load_pieces(*names: str) -> dict[str, Piece]:
    """``{name: Piece}`` for each of ``names``."""
    return {name: load_piece(name) for name in names}


def stand_in_notes(pieces: dict) -> list[str]:
    """One line per earlier lab that did not serve: which of its pieces the package's reference
    stands in for, and which checks earn nothing ("pp_overlap is unfinished (...): the package's
    reference stands in for schedule and executor (no points for the PP overlap check)")."""
    by_lab: dict = {}
    for p in pieces.values():
        if not p.own:
            by_lab.setdefault(p.lab, []).append(p)
    lines = []
    for lab, ps in by_lab.items():
        why = ps[0].note.split(": the package's reference", 1)[0]
        names = " and ".join(p.name for p in ps)
        checks = " and ".join(dict.fromkeys(CHECK[p.name] for p in ps))
        lines.append(f"{why}: the package's reference stands in for {names} (no points for the "
                     f"{checks} check)")
    return lines


def own_pieces(pieces: dict) -> list[str]:
    """``["tp_overlap (tp_block)", ...]``: the learner's own pieces in this composition."""
    return [f"{p.lab} ({p.name})" for p in pieces.values() if p.own]
