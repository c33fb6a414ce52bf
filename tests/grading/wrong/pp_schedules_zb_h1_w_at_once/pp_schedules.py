"""WRONG ON PURPOSE (pp_schedules_zb_h1_w_at_once): ZB-H1 that runs each W right after its B.
The schedule is complete and safe, but the split bought nothing: the drain keeps 1F1B's idle
time. The grader names the first W that came too early and shows both bubbles."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_schedules")


def zb_h1(p, v, m, rank):
    out = []
    for kind, i, c in interleaved_1f1b(p, v, m, rank):                         # noqa: F821
        out.append((kind, i, c))
        if kind == "B":
            out.append(("W", i, c))                            # WRONG: W deferred to fill the drain
    return out


SCHEDULES["zb_h1"] = (zb_h1, INTERLEAVED)                                      # noqa: F821
