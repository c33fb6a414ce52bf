"""One policy for every check graded from measured time: a busy machine never costs a correct
answer its points, and a wrong schedule never earns them.

A figure such as "93% of the all-reduce time was hidden behind compute" is a measurement, and
two CPU ranks sharing two cores (or one) measure it with noise: a rank is descheduled for a few
ms, a peer issues its half of an all-reduce late. Every timing check of the course therefore
judges in this order (``async_overlap`` and ``domino`` today; every later lab the same way):

1. **Structure first.** What was issued between an operation's start and its wait is a fact of
   the program, read from the flight recorder, the lab's spies and the trace: an all-reduce
   never started with ``async_op=True``, a wait placed before the compute it should hide
   behind, a handle never waited on. "Waited on before compute could hide it" is counted, not
   timed: the link notes how many GEMMs the rank had run when an op started and when it was
   first waited on (``workbook.link.program_order``). A structural mistake fails at once, with a
   message that names it, on every run and under any load.
2. **The figure, rank skew excluded.** The overlap figure counts communication as exposed only
   while the rank waited on the *schedule*: time waiting for a peer that issued the same
   operation late (``link: peers late`` spans of the trace, ``Metrics.skew_us``) is excused.
3. **A near miss is measured again.** A figure below the threshold by less than
   ``NEAR_MISS_PCT`` points is measured again, up to ``ATTEMPTS`` times in all, and the best
   measurement counts; a clear miss (a schedule that hides next to nothing) is not, since
   measuring it again cannot help it.
4. **A measured margin.** Each threshold sits below what the reference solution measures by a
   margin measured under load and on one core: ``tests/bench/grading_stability.py`` prints
   the table (false failures per runs, wrong implementations caught per runs, the lowest
   figure the reference reached) that the README keeps.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

R = TypeVar("R")

ATTEMPTS = 3                 # measurements at most, for one check
NEAR_MISS_PCT = 25.0         # points below a threshold that are worth measuring again
STRUCTURAL = math.inf        # the shortfall of a schedule whose structure is wrong


def measure_until_clear(run: Callable[[int], R], shortfall: Callable[[R], float], *,
                        attempts: int = ATTEMPTS, near_miss: float = NEAR_MISS_PCT) -> R:
    """The least-short of up to ``attempts`` measurements ``run(0), run(1), ...``.

    ``shortfall(result)``: how many points the result is below its threshold (<= 0: it passes;
    ``STRUCTURAL``: the structure is wrong). Stops at the first pass, at a clear miss (a
    shortfall of ``near_miss`` or more), or when the attempts run out."""
    best, best_short = None, math.inf
    for attempt in range(attempts):
        result = run(attempt)
        short = shortfall(result)
        if best is None or short < best_short:
            best, best_short = result, short
        if short <= 0 or short >= near_miss:
            break
    return best


def hidden_pct(comm_us: float, exposed_us: float, skew_us: float = 0.0) -> float:
    """Percent of ``comm_us`` hidden behind compute, counting exposed time spent waiting for a
    late peer (``skew_us``) as hidden: that wait is the machine's, not the schedule's."""
    if comm_us <= 0:
        return 0.0
    return 100.0 * (1.0 - max(0.0, exposed_us - skew_us) / comm_us)
