"""WRONG ON PURPOSE (pp_schedules_zbv_w_at_once): ZBV with every W moved to just after its B:
the V's forwards and backwards in order, but no W left to fill the waits."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_schedules")
_reference_zbv = zbv                                                           # noqa: F821


def zbv(p, v, m, rank):
    out = []
    for kind, i, c in _reference_zbv(p, v, m, rank):
        if kind != "W":
            out.append((kind, i, c))
        if kind == "B":
            out.append(("W", i, c))                            # WRONG: W at once
    return out


SCHEDULES["zbv"] = (zbv, V_SHAPE)                                              # noqa: F821
