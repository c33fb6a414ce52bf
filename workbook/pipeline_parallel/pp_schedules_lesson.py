"""Lesson 12's helpers (lab ``pp_schedules``), on paper: the chunked schedules played, drawn and
compared with the formulas, with no rank started.

* ``schedule_of``: the learner's schedule where it is right, else the order PyTorch runs
  (``torch_orders``), so the lesson never needs the reference solutions (a student release has
  none) and says which one it draws;
* ``paper_figure`` / ``paper_explorer``: one schedule played by ``simulate_chunked``, each rank's
  F, B and W per chunk, with the transfers' cost as a parameter, and widgets to play it;
* ``formula_bubble``: each schedule's idle share from its formula, beside ``simulate_chunked``'s
  in ``compare_table``, which also counts activations in flight and point-to-point messages.

Costs are given for a whole stage (lab 10's units: a forward 1, an input-gradient backward 1,
a weight-gradient backward 1) and divided by ``v`` for a chunk, so that schedules with different
numbers of chunks are compared on the same model.
"""
from __future__ import annotations

from workbook.measure import lesson_figures as lf
from workbook.pipeline_parallel.pipeline_parallel import B, F, ScheduleError
from workbook.pipeline_parallel.torch_orders import TORCH_CLASS, first_difference, torch_order
from workbook.pipeline_parallel.virtual_stages import (INTERLEAVED, V_SHAPE, W,
                                                       check_chunked_schedule, rank_and_chunk,
                                                       simulate_chunked, stage_index)
from workbook.trace import colors

KIND_COLOR = {F: colors.COMPUTE, B: lf.BACKWARD, W: colors.MEMCPY, "waiting": colors.EXPOSED}
#: the schedules this lesson compares: name -> (the lab's function name, placement, chunks v)
SCHEDULES = {"1F1B": ("interleaved_1f1b", INTERLEAVED, 1),
             "interleaved 1F1B": ("interleaved_1f1b", INTERLEAVED, 2),
             "ZB-H1": ("zb_h1", INTERLEAVED, 1), "ZBV": ("zbv", V_SHAPE, 2)}
CHECK_SHAPES = ((2, 1, 4), (4, 1, 8), (2, 2, 8), (4, 2, 8))          # (p, v, m) a schedule must match


def ranks_of(schedule, p: int, v: int, m: int) -> list[list[tuple]]:
    """Every rank's actions under ``schedule(p, v, m, rank)``, as plain tuples."""
    return [[tuple(a) for a in schedule(p, v, m, r)] for r in range(p)]


def schedule_problem(schedule, name: str) -> str | None:
    """Why ``schedule`` (the learner's ``name``, one of ``TORCH_CLASS``) is not the order PyTorch
    runs, on a few shapes, or None."""
    placement = TORCH_CLASS[name][1]
    for p, v, m in CHECK_SHAPES:
        if name == "zbv" and v != 2:
            continue
        acts = ranks_of(schedule, p, v, m)
        check_chunked_schedule(acts, p, v, m, placement)
        want = torch_order("1f1b" if (name, v) == ("interleaved_1f1b", 1) else name, p, v, m)
        diff = first_difference(acts, want, ("yours", "torch's"))
        if diff:
            return f"p={p}, v={v}, m={m}: {diff}"
    return None


def schedule_of(lab, name: str):
    """``(fn, whose)``: the lab's schedule ``name`` where it runs PyTorch's order, else PyTorch's
    order itself (a function of (p, v, m, rank), as the lab's), saying which and why."""
    def torchs(p: int, v: int, m: int, rank: int) -> list[tuple]:
        peer = "1f1b" if (name, v) == ("interleaved_1f1b", 1) else name
        got = torch_order(peer, p, v, m)
        if isinstance(got, str):
            raise ScheduleError(f"{TORCH_CLASS[peer][0]} for p={p}, v={v}, m={m}: {got}")
        return got[rank]

    yours = getattr(lab, name, None) if lab is not None else None
    if yours is None:
        print(f"no {name} in your lab yet: drawing the order PyTorch's {TORCH_CLASS[name][0]} runs")
        return torchs, f"PyTorch's {TORCH_CLASS[name][0]}"
    fn, whose = lf.yours_or_reference(name, yours, torchs, lambda f: schedule_problem(f, name),
                                      f"torch.distributed.pipelining's {TORCH_CLASS[name][0]}")
    return fn, ("your" if whose == "your" else f"PyTorch's {TORCH_CLASS[name][0]}")


def chunk_costs(v: int, t_f: float = 1.0, t_b: float = 1.0, t_w: float = 1.0) -> dict:
    """A chunk action's costs when a whole stage's are ``t_f``, ``t_b``, ``t_w``: each / v."""
    return dict(t_f=t_f / v, t_b=t_b / v, t_w=t_w / v)


def play(schedule, placement: str, p: int, v: int, m: int, t_p2p: float = 0.0, **costs):
    """``(actions per rank, ChunkedTimeline)``: the schedule checked, then played on paper."""
    acts = ranks_of(schedule, p, v, m)
    check_chunked_schedule(acts, p, v, m, placement)
    return acts, simulate_chunked(acts, p, v, placement, t_p2p=t_p2p, **chunk_costs(v, **costs))


def formula_bubble(name: str, p: int, v: int, m: int, t_f: float = 1.0, t_b: float = 1.0,
                   t_w: float = 1.0) -> float:
    """The idle share of the step each schedule's formula gives, with no transfer time, whole-
    stage costs ``t_f``, ``t_b``, ``t_w`` (lesson 12 derives each):

    * 1F1B and interleaved 1F1B: idle ``(p - 1)(t_f + t_b + t_w) / v`` per rank (Narayanan et
      al. 2021), so the bubble is ``(p - 1) / (v m + p - 1)``;
    * ZB-H1: idle ``(p - 1)(t_f + t_b - t_w) / v`` (Qi et al. 2023, section 3; ``m >= p``);
    * ZBV: idle ``(p - 1) t_f / 2`` (section 6; ``m >= 2p``, chunk costs equal).
    Every rank is busy ``m (t_f + t_b + t_w)``; the bubble is ``idle / (busy + idle)``."""
    per_rank = {"1F1B": (p - 1) * (t_f + t_b + t_w) / v,
                "interleaved 1F1B": (p - 1) * (t_f + t_b + t_w) / v,
                "ZB-H1": (p - 1) * (t_f + t_b - t_w) / v,
                "ZBV": (p - 1) * t_f / v}[name]
    busy = m * (t_f + t_b + t_w)
    return per_rank / (busy + per_rank)


def messages(acts: list[list[tuple]], p: int, placement: str) -> int:
    """Point-to-point messages one step sends: every F whose next stage, and every B whose
    previous stage, sits on another rank (the turn of a V stays on its rank)."""
    v = 1 + max(c for rank_acts in acts for _, _, c in rank_acts)
    count = 0
    for r, rank_acts in enumerate(acts):
        for kind, _, c in rank_acts:
            to = stage_index(r, c, p, placement) + {F: 1, B: -1}.get(kind, 0)
            if kind != W and 0 <= to < p * v:
                count += rank_and_chunk(to, p, placement)[0] != r
    return count


def compare_table(schedule_fns: dict, p: int, m: int, t_p2p: float = 0.0) -> list[dict]:
    """One row per schedule of ``SCHEDULES`` (``schedule_fns``: name -> function): step, bubble
    simulated and by formula, the most activations any rank holds (in whole stages' worth), and
    the messages sent per step. ``COMPARE_COLUMNS`` prints it with ``lf.print_table``."""
    rows = []
    for name, (_, placement, v) in SCHEDULES.items():
        acts, line = play(schedule_fns[name], placement, p, v, m, t_p2p)
        rows.append({"schedule": name, "v": v, "step": line.step, "bubble": 100 * line.bubble,
                     "formula": 100 * formula_bubble(name, p, v, m),
                     "peak": max(line.peak_in_flight) / v,
                     "messages": messages(acts, p, placement)})
    return rows


COMPARE_COLUMNS = [("schedule", 17, "{schedule}"), ("v", 3, "{v}"), ("step", 8, "{step:.2f}"),
                   ("bubble %", 10, "{bubble:.1f}"), ("formula %", 11, "{formula:.1f}"),
                   ("peak stages", 13, "{peak:g}"), ("messages", 10, "{messages}")]


def paper_rows(acts: list[list[tuple]], line) -> dict:
    """The rows of ``lf.lanes_figure`` for a played schedule: one per rank, each action a bar
    named ``F3`` (chunk 0) or ``F3.1`` (chunk 1), coloured by kind."""
    return {f"rank {r}": [(a, z, act.kind, f"{act.kind}{act.micro_batch}"
                           + (f".{act.chunk}" if act.chunk else "")) for a, z, act in spans]
            for r, spans in enumerate(line.spans)}


def paper_figure(schedule_fns: dict, name: str, p: int, m: int, c: float = 0.0,
                 v: int | None = None):
    """Schedule ``name`` (a key of ``SCHEDULES``; ``v`` chunks a rank, by default its entry's)
    on paper, ``c`` the cost of one transfer in forwards of a whole stage; prints its step and
    bubble beside the formula's."""
    _, placement, default_v = SCHEDULES[name]
    v = default_v if v is None else v
    acts, line = play(schedule_fns[name], placement, p, v, m, t_p2p=c)
    print(f"{name}, v={v}: step {line.step:.2f} forwards of a whole stage; bubble "
          f"{line.bubble:.1%} (formula, no transfers: {formula_bubble(name, p, v, m):.1%}); the "
          f"busiest rank holds {max(line.peak_in_flight) / v:g} stages' activations; "
          f"{messages(acts, p, placement)} messages per step")
    return lf.lanes_figure(paper_rows(acts, line), f"{name}, p={p}, v={v}, m={m}, transfer {c:g}, "
                           "on paper", KIND_COLOR, "time (forwards of a whole stage)")


#: the explorer's schedules: name -> the chunks a rank may hold (ZBV's V holds exactly 2)
EXPLORED = {"interleaved 1F1B": (1, 2, 3, 4), "ZB-H1": (1, 2, 3, 4), "ZBV": (2,)}


def explorer_shape(name: str, p: int, v: int, m: int) -> tuple[int, int, str | None]:
    """``(v, m, note)``: the explorer's ``v`` and ``m`` made runnable for ``name`` (ZBV: v = 2;
    interleaved with v > 1: m a multiple of p, Megatron's rule), and what was changed, or None."""
    notes = []
    if v not in EXPLORED[name]:
        v = EXPLORED[name][0]
        notes.append(f"{name} holds v = {v} chunks a rank")
    if v > 1 and SCHEDULES[name][1] == INTERLEAVED and m % p:
        m += p - m % p
        notes.append(f"with v > 1, m must be a multiple of p: m = {m}")
    return v, m, ("(" + "; ".join(notes) + ")") if notes else None


def paper_explorer(schedule_fns: dict):
    """``paper_figure`` with widgets: the schedule (a dropdown), ranks p, chunks a rank v,
    micro-batches m, a transfer's cost; the timeline from ``simulate_chunked``, its bubble
    beside the formula's."""
    import ipywidgets as widgets
    style = {"description_width": "150px"}
    controls = {
        "name": widgets.Dropdown(options=list(EXPLORED), value="ZB-H1", description="schedule",
                                 style=style),
        "p": widgets.IntSlider(value=4, min=2, max=8, description="ranks p", style=style),
        "v": widgets.IntSlider(value=2, min=1, max=4, description="chunks a rank v", style=style),
        "m": widgets.IntSlider(value=8, min=2, max=24, step=2, description="micro-batches m",
                               style=style),
        "c": widgets.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.05,
                                 description="transfer / forward", style=style)}

    def draw(name, p, v, m, c):
        v, m, note = explorer_shape(name, p, v, m)
        if note:
            print(note)
        return paper_figure({name: schedule_fns[name]}, name, p, m, c, v=v)

    return lf.live_figure(draw, controls, [["name", "p"], ["v", "m"], ["c"]])
