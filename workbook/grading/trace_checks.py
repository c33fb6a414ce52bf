"""What the overlap graders share once a trace has been read: where traces go, and the verdict on
how much communication compute hid.

* ``trace_root_fixture(prefix)``: a module-scoped pytest fixture ``trace_root``, one fresh folder
  for the module's traces (the self-check passes its own ``trace_root``);
* ``assert_hidden(pct, at_least, ...)``: fail, in the words every overlap check uses, when less
  than ``at_least`` % of the graded communication was hidden behind compute;
* ``ranks_hidden_pct(res, phase)``: the share of the job's communication in a phase (all ranks
  together) hidden behind compute, rank skew excused;
* ``overlap_figures(trace, within)``: one rank's figures in the form ``ranks_hidden_pct`` reads,
  from any trace: the simulated link's spans on CPU ranks, NCCL and compute kernels on a GPU;
* ``measure_overlap(run, tmp_root, ...)``: one overlap run on 2 ranks under the timing policy;
* ``OverlapCheck``: one lab's overlap check, measured and judged the way every overlap grader
  judges (a rank that failed, then the structure, then the hidden share of each phase).

The rank side that makes the figures is ``workbook.grading.overlap_run``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest


def trace_root_fixture(prefix: str):
    """A module-scoped fixture named ``trace_root``: a new folder ``<prefix>N`` under pytest's
    temporary root. Use it as ``trace_root = trace_root_fixture("async_overlap_traces")``."""
    @pytest.fixture(scope="module")
    def trace_root(tmp_path_factory):
        return tmp_path_factory.mktemp(prefix)
    return trace_root


def assert_hidden(pct: float, at_least: float, *, rank: int, where: str, what: str, details: str,
                  advice: str) -> None:
    """Fail unless at least ``at_least`` % of ``what`` was hidden behind compute.

    ``where``: the run (``"overlapped_all_reduce on 2 ranks, simulated dgx-h100 link"``);
    ``what``: the communication graded (``"the all-reduce"``); ``details``: the measured figures
    shown in brackets (modelled transfer, time excused while a peer was late, ...); ``advice``:
    what to change. The message reads::

        rank 0: WHERE: 12% of WHAT (DETAILS) was hidden behind compute, read from the trace;
        at least 70% is expected. ADVICE
    """
    if pct < at_least:
        raise AssertionError(
            f"rank {rank}: {where}: {pct:.0f}% of {what} ({details}) was hidden behind compute, "
            f"read from the trace; at least {at_least:.0f}% is expected. {advice}")


def measure_hidden(run_once, limits: dict, structure) -> list[dict]:
    """The shared timing policy (``workbook.grading.timing``) over one overlap run of the ranks,
    ``run_once(k)`` -> every rank's results: measured again after a near miss, never after a
    structural mistake (a rank failed, or ``structure(r)`` names one), else judged by the largest
    shortfall of ``ranks_hidden_pct`` under ``limits`` (``{phase: at least %}``)."""
    from workbook.grading import timing             # looked up per call: the stability script wraps it

    def shortfall(res) -> float:
        if any("error" in r or "not_implemented" in r or structure(r) for r in res):
            return timing.STRUCTURAL
        return max(limit - ranks_hidden_pct(res, ph) for ph, limit in limits.items())
    return timing.measure_until_clear(run_once, shortfall)


def assert_phase_hidden(res: list[dict], phase: str, at_least: float, *, where: str, what: str,
                        advice: str) -> None:
    """Fail unless the job hid ``at_least`` % of the link time of ``phase`` (``ranks_hidden_pct``
    over every rank's ``res[r][phase]``), or when some rank saw no communication in it. The
    message names the worst rank, every rank's figure, and the worst rank's link, exposed and
    excused (late peer) milliseconds, and its ops when the figures list them (``count``,
    ``ops``). ``where`` may hold ``{link}``: the link's label from the results."""
    for r in res:
        if not r[phase]["comm_ms"]:
            raise AssertionError(f"rank {r['rank']}: {where.format(link=r.get('link'))}: no "
                                 f"communication of the {phase} pass was found on the link track "
                                 f"of the trace")
    worst = min(res, key=lambda r: r[phase]["pct"] or 0.0)
    o = worst[phase]
    ops = f"{o['count']} ops ({', '.join(o['ops'])}), " if "ops" in o else ""
    assert_hidden(
        ranks_hidden_pct(res, phase), at_least, rank=worst["rank"],
        where=where.format(link=worst.get("link")), what=what,
        details=", ".join(f"rank {r['rank']} {r[phase]['pct']:.0f}%" for r in res)
        + f"; {ops}{o['comm_ms']:.0f} ms on the link on rank {worst['rank']}, "
          f"{o['exposed_ms']:.0f} ms exposed, not counting {o['skew_ms']:.0f} ms while the other "
          f"rank was late",
        advice=advice)


def ranks_hidden_pct(res: list[dict], phase: str) -> float:
    """The share of the job's link time issued in ``phase`` (every rank's ``res[r][phase]``
    figures, ``comm_ms`` and ``exposed_ms`` with skew already excused, added up) hidden behind
    compute; 0 when no communication was seen."""
    from workbook.grading.timing import hidden_pct
    comm = sum(r[phase]["comm_ms"] for r in res)
    return hidden_pct(comm, sum(r[phase]["exposed_ms"] for r in res)) if comm else 0.0


def overlap_figures(trace, within: str | None = None) -> dict:
    """``{"pct", "comm_ms", "exposed_ms", "skew_ms", "count"}`` of the communication one rank
    issued (in phase ``within``, or all of it): the share hidden behind compute, rank skew
    excused (``Metrics.overlap_pct_ex_skew``; a GPU trace has no skew), the communication time,
    the exposed time less skew, the skew and the number of collectives. On a GPU trace the
    communication is the NCCL kernels and the compute the other kernels, on other streams."""
    from workbook.trace import overlap
    o = overlap(trace, within=within)
    return {"pct": o.overlap_pct_ex_skew, "comm_ms": o.comm_us / 1e3,
            "exposed_ms": (o.exposed_comm_us - o.skew_us) / 1e3, "skew_ms": o.skew_us / 1e3,
            "count": sum(c["count"] for c in o.collectives.values())}


def measure_overlap(run, tmp_root, *args, limits: dict, structure, link: str,
                    timeout: float) -> list[dict]:
    """``run(trace_dir, *args)`` on 2 ranks over the simulated ``link``, measured again after a
    near miss (``measure_hidden`` with ``limits`` and ``structure(r)``); each attempt in a folder
    of its own under ``tmp_root``, and replayed to every test that reads the same run."""
    from workbook.grading.engine import on_ranks, world_sizes
    n, = world_sizes(2)
    name = "-".join(("overlap", *map(str, args)))
    return measure_hidden(
        lambda k: on_ranks(n, run, str(tmp_root / f"{name}{k}"), *args, link=link,
                           timeout=timeout, key=(name, str(tmp_root), k)),
        limits, structure)


@dataclass(frozen=True)
class OverlapCheck:
    """One lab's overlap check. ``run(trace_dir, *args)``: the rank side (every rank's result
    holds ``rank``, ``link`` and, per phase of ``limits``, the figures ``assert_phase_hidden``
    reads); ``limits``: ``{phase: at least % hidden}``; ``structure(r, phases)``: the first
    structural mistake of rank result ``r`` in ``phases``, or None; ``where``: the run in
    messages (may hold ``{link}``); ``what``: the communication graded (may hold ``{phase}``);
    ``advice``: ``{phase: what to change}``; ``failed``: the run, when a rank raised."""
    run: Callable
    limits: dict
    structure: Callable
    where: str
    what: str
    advice: dict
    link: str = "dgx-h100"
    timeout: float = 120.0
    failed: str = "the overlap run"
    args: tuple = ()

    def results(self, tmp_root) -> list[dict]:
        """Every rank's results of the run (measured again after a near miss, once per module:
        the tests of each phase read the same run)."""
        phases = tuple(self.limits)
        return measure_overlap(self.run, tmp_root, *self.args, limits=self.limits,
                               structure=lambda r: self.structure(r, phases), link=self.link,
                               timeout=self.timeout)

    def check(self, tmp_root, phases=None) -> None:
        """Judge ``phases`` (default: every phase of ``limits``): fail on a rank that raised, then
        on a structural mistake, then on too little of the link time hidden."""
        from workbook.grading.model_checks import raise_if_failed
        res = self.results(tmp_root)
        phases = tuple(phases or self.limits)
        for r in res:
            raise_if_failed(r, r["rank"], len(res), self.failed)
            problem = self.structure(r, phases)
            if problem:
                raise AssertionError(problem)
        for phase in phases:
            assert_phase_hidden(res, phase, self.limits[phase], where=self.where,
                                what=self.what.format(phase=phase), advice=self.advice[phase])
