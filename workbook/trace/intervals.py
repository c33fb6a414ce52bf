"""Interval arithmetic: the algebra behind every overlap number.

A rank's compute time is not the sum of its operators' durations: operators
nest (``aten::linear`` contains ``aten::addmm``), and on a GPU kernels of
several streams run at once.  What we want is the *measure of the union* of
their intervals -- how long at least one of them was running.  Likewise,
"communication hidden behind compute" is the measure of an *intersection*,
and "exposed communication" of a *difference*.

Here a set of intervals is a pair of sorted numpy arrays ``(starts, ends)``
with no two intervals overlapping (a *normalised* set).  :func:`union`
normalises any bag of intervals in O(n log n) (one sort, then a running
maximum); intersection and difference of normalised sets are a sweep over
their sorted boundaries, also O(n log n) with numpy doing the loops.
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]
EMPTY: Intervals = (np.empty(0), np.empty(0))


def union(starts, ends) -> Intervals:
    """Merge possibly overlapping or nested intervals into a normalised set.

    Sort by start; keep a running maximum of the ends; a new merged
    interval begins wherever a start lies beyond every end seen so far.
    """
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    if s.size == 0:
        return EMPTY
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], run_end[last]


def measure(iv: Intervals) -> float:
    """Total length of a normalised set."""
    return float(np.sum(iv[1] - iv[0])) if iv[0].size else 0.0


def _sweep(a: Intervals, b: Intervals, keep) -> Intervals:
    """Walk the boundaries of two normalised sets in time order and keep the
    stretches where ``keep(inside_a, inside_b)`` holds."""
    if a[0].size == 0 and b[0].size == 0:
        return EMPTY
    t = np.concatenate([a[0], a[1], b[0], b[1]])
    da = np.concatenate([np.ones(a[0].size), -np.ones(a[0].size), np.zeros(2 * b[0].size)])
    db = np.concatenate([np.zeros(2 * a[0].size), np.ones(b[0].size), -np.ones(b[0].size)])
    order = np.lexsort((da + db, t))          # at equal times, ends before starts
    t, ina, inb = t[order], np.cumsum(da[order]) > 0, np.cumsum(db[order]) > 0
    inside = keep(ina, inb)[:-1]
    lo, hi = t[:-1][inside], t[1:][inside]
    nz = hi > lo
    return union(lo[nz], hi[nz])


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """The stretches covered by both sets."""
    if a[0].size == 0 or b[0].size == 0:
        return EMPTY
    return _sweep(a, b, lambda x, y: x & y)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """The stretches covered by ``a`` but not by ``b``."""
    if a[0].size == 0 or b[0].size == 0:
        return a
    return _sweep(a, b, lambda x, y: x & ~y)


def join(a: Intervals, b: Intervals) -> Intervals:
    """The union of two sets."""
    return union(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))


def clip(a: Intervals, t0: float, t1: float) -> Intervals:
    """Restrict a normalised set to the window ``[t0, t1]``."""
    s, e = np.maximum(a[0], t0), np.minimum(a[1], t1)
    keep = e > s
    return s[keep], e[keep]
