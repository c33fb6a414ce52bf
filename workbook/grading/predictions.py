"""Predictions: a figure the learner derives from the model before the run, judged against it.

Every overlap lab has one prediction task. From the link's alpha-beta figures (``Link.latency_s``
= alpha, ``Link.bandwidth_Bps`` = 1/beta) and the measured compute rate the lab hands over
(``Link.local_flops``), the learner computes a figure of *their own* schedule: the exposed
communication, the hidden share, the bubble, the step time. The grader compares it with the
package's own model of that schedule (``judge_prediction``):

* within ``rel_tol`` of the model's value: right (a correct derivation lands there exactly; the
  tolerance only absorbs rounding and the order of floating-point sums);
* equal (within the same tolerance) to the value of a *known wrong derivation* -- payload bytes
  instead of bus bytes, the (n-1)/n factor forgotten, the latency left out -- the message names
  that term, so the learner knows which step of the derivation to redo;
* anything else: the two values and their ratio, and the terms to recheck.

The report then prints prediction, model and measurement side by side (``comparison_lines``), so
the learner sees where the model and the machine part: the model is exact arithmetic on the
schedule, the measurement has launch costs, skew and a loaded CPU in it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

REL_TOL = 0.02          # a correct derivation is exact; 2 % absorbs rounding the learner may do


def _close(a: float, b: float, rel_tol: float) -> bool:
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-12)


def judge_prediction(got, model: float, mistakes: Mapping[str, float], *, what: str,
                     unit: str = "ms", terms: str = "", rel_tol: float = REL_TOL) -> str | None:
    """None when ``got`` matches ``model``; else the one-paragraph message the learner reads.

    ``mistakes``: ``{what the wrong derivation did: the value it gives}`` (e.g. ``{"used the
    payload bytes S where the ring moves the bus bytes 2(n-1)/n * S": ...}``); the first one
    ``got`` matches is named. ``terms``: the terms of the right derivation, listed when no known
    mistake matches."""
    if got is None or isinstance(got, bool) or not isinstance(got, (int, float)):
        return (f"the prediction of {what} must be a number (a float, in {unit}), "
                f"got {type(got).__name__}: {got!r}")
    got = float(got)
    if not math.isfinite(got):
        return f"the prediction of {what} is {got}: it must be a finite number of {unit}"
    if _close(got, model, rel_tol):
        return None
    for mistake, value in mistakes.items():
        if not _close(value, model, rel_tol) and _close(got, value, rel_tol):
            return (f"the prediction of {what} is {got:.4g} {unit}, the model gives "
                    f"{model:.4g} {unit}: your value is what you get if you {mistake}.")
    ratio = f" ({got / model:.3g} x the model)" if model else ""
    recheck = f" Recheck each term: {terms}." if terms else ""
    return (f"the prediction of {what} is {got:.4g} {unit}, the model gives {model:.4g} "
            f"{unit}{ratio}.{recheck}")


def _names(code) -> set[str]:
    names = set(code.co_names)                   # globals, attributes, imports: not locals
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names(const)
    return names


def reads_the_model(fn, model_names) -> str | None:
    """None when the learner's prediction function derives its figure; else the message: the
    package's own model (``model_names``: its functions) is not a derivation. A function that is
    itself from the package, or whose code (nested functions included) names a model function,
    reads the answer instead of deriving it."""
    module = getattr(fn, "__module__", "") or ""
    if module.startswith("workbook."):
        return (f"the prediction is the package's own {module}.{getattr(fn, '__name__', fn)}: "
                f"derive the figure from the link's alpha and beta and the compute rate instead")
    code = getattr(fn, "__code__", None)
    used = sorted(set(model_names) & _names(code)) if code is not None else []
    if used:
        return (f"the prediction calls the package's model ({', '.join(used)}): derive the figure "
                f"from the link's alpha and beta and the compute rate yourself")
    return None


def comparison_lines(rows, unit: str = "ms") -> list[str]:
    """The report's table: one row per figure, ``(name, predicted, model, measured)``; a value
    may be None (not implemented yet, or not measured on this run) and is shown as ``-``."""
    def cell(value) -> str:
        if value is None:
            return "-"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    width = max([len("figure")] + [len(r[0]) for r in rows])
    lines = [f"  {'figure':<{width}}  {'you predicted':>13}  {'the model':>10}  "
             f"{'measured':>10}  ({unit})"]
    for name, predicted, model, measured in rows:
        lines.append(f"  {name:<{width}}  {cell(predicted):>13}  {cell(model):>10}  "
                     f"{cell(measured):>10}")
    return lines
