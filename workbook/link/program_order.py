"""Did compute run between a collective's start and its wait? Decided from program order.

An overlap grader must tell a schedule that hides communication from one that does not. The
structural question is simple: between ``work = dist.all_reduce(t, async_op=True)`` and
``work.wait()``, did the rank run any compute that could hide the transfer? Reading it off the
clock (the wait came within 5% of the modelled transfer after the start) fails on a loaded
machine: a rank descheduled between the two lines shows a long gap with nothing in it, and a
wrong lab passes. Program order cannot be stretched by load, so the graders count instead.

``CountGemms`` is a ``TorchDispatchMode``: every aten op the rank runs while it is active (the
autograd backward's too) passes through it, and it counts the
matrix products (``mm``, ``addmm``, ``bmm``, ``baddbmm``: what ``@``, ``F.linear`` and attention
decompose into). The simulated link (``workbook.link``) notes the count when an op is issued and
when it is first waited on (``OpRecord.gemms_at_issue`` / ``gemms_at_wait``): equal counts mean
no GEMM ran in between, so nothing could have hidden that transfer.

    with CountGemms():
        work = dist.all_reduce(g, async_op=True)    # gemms_at_issue = k
        y = x @ w                                   # k + 1
        work.wait()                                 # gemms_at_wait = k + 1: hidden behind a GEMM

Outside a counted run the records hold ``None`` and ``waited_at_once`` falls back to the clock.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
GEMM_OPS = frozenset({_aten.mm.default, _aten.addmm.default, _aten.bmm.default,
                      _aten.baddbmm.default})
AT_ONCE = 0.05      # the clock's rule, for runs not counted: waited within 5% of the transfer

_active: list["CountGemms"] = []   # the counting modes now entered, innermost last


class CountGemms(TorchDispatchMode):
    """Count the GEMMs this rank runs while the mode is active (``gemms_run()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __enter__(self):
        _active.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        _active.remove(self)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in GEMM_OPS:             # an outer CountGemms sees the op next, when func runs
            self.count += 1
        return func(*args, **(kwargs or {}))


def gemms_run() -> int | None:
    """GEMMs run since the innermost active ``CountGemms`` began; None outside one."""
    return _active[-1].count if _active else None


def waited_at_once(record, at_once: float = AT_ONCE) -> bool:
    """True when ``record`` (a ``workbook.link.OpRecord``) was waited on before any compute
    could hide it: no GEMM ran between its start and its first wait (a counted run), or, for a
    run not counted, the first wait came within ``at_once`` of its modelled transfer time.
    An op never waited on is not "waited at once" (the graders report it on its own)."""
    if not record.first_wait_ns:
        return False
    if record.gemms_at_issue is not None and record.gemms_at_wait is not None:
        return record.gemms_at_wait == record.gemms_at_issue
    return record.first_wait_ns - record.issued_ns < at_once * record.modelled_ns
