"""The simulated link at the real hardware's speed, for a check that counts what was sent.

A traffic check (which collectives or sends a step issued, in which pass, how many, how many
bytes) reads the trace's link track for names and sizes, never for durations. On CPU ranks the
simulated link runs in slow motion: it is calibrated so that a transfer takes as long, next to
this CPU's matmuls, as it would next to the GPU's (``workbook.link.make_link``; at 50 GFLOP/s
local a dgx-h100 operation pays 32 ms of latency), and every op waits that modelled time out.
A count does not need it. ``untimed_link()`` keeps the preset and the nodes, but calibrates
the link to the preset's own GPU rate (scale 1): the same ops, in the same order and passes,
with the same bytes, are traced in microseconds of modelled time instead of seconds. (The
traffic of dp_overlap's naive DP, one traced step after two, on 2 and 3 ranks: 22 s before,
3 s after, every count and byte the same.)

Never for a check that reads time: the overlap checks keep the slow-motion link their thresholds
were measured on. Each run on the ranks sets its own link again (``workbook.runtime.ranks.
set_link``), and ``untimed_link`` puts the previous one back when it ends, so nothing after it
sees the fast link.
"""
from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def untimed_link():
    """On every rank of a run, around the steps whose traffic is counted: the current simulated
    link at scale 1 (``module docstring``); nothing changes where there is no simulated link
    (NCCL ranks, ``link="none"``)."""
    from workbook import link
    from workbook.link.presets import PRESETS
    from workbook.runtime.ranks import link_nodes
    previous = link.current_link()
    if previous is None:
        yield
        return
    link.set_link(link.make_link(previous.preset, PRESETS[previous.preset].peak_tflops * 1e12,
                                 link_nodes()))
    try:
        yield
    finally:
        link.set_link(previous)
