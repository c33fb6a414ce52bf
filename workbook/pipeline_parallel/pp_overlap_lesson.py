"""Lesson 10's helpers (lab ``pp_overlap``): pipeline schedules played and drawn on paper, the
steps it measures on ranks, and the figures and tables it draws from them.

* On paper: ``stages`` (every stage's actions), ``schedule_problem`` (is the learner's schedule
  the textbook one?), ``lanes`` (rows of actions, transfers and waits, in this lesson's colours),
  ``paper_rows`` (a ``simulate`` timeline as such rows, with the transfers between the stages),
  ``paper_hidden`` (the share of each stage's steady-state transfer time during which it
  computes), ``simulate_blocking`` (``simulate`` for the blocking executor), ``on_paper`` and
  ``paper_explorer`` (the four ``VARIANTS``, and widgets to play them).
* On ranks: ``check`` (one step of an executor against one device), ``variant_steps`` (profiled
  steps of each variant, traced into ``folder(variant, take)``, with each action's span, each
  wait and the link's log) and ``measure_variants`` (which runs it, falling back to the
  reference, and keeps the faster take).
* From the measurement: ``transfer_ms`` (one boundary tensor on the calibrated link),
  ``paper_share_measured`` (``paper_hidden`` of 1F1B with the measured costs), ``variant_stats`` /
  ``stats_table`` (step, compute, waiting, bubble, beside the paper), ``time_split_figure``,
  ``measured_panel`` (a variant's timeline, picked with a widget) and ``hidden_table`` (the
  hidden share the trace finds).

The shared bars, verdicts and the link's log are ``workbook.measure.lesson_figures``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from workbook import trace
from workbook.measure import lesson_figures as lf
from workbook.pipeline_parallel import (ScheduleError, Timeline, bubble_fraction, check_schedule,
                                        peak_in_flight, phases, simulate)
from workbook.trace import colors
from workbook.trace import intervals as iv

KIND_COLOR = {"F": colors.COMPUTE, "B": lf.BACKWARD, "activation": colors.COMMUNICATION,
              "gradient": colors.LINK, "waiting": colors.EXPOSED}
TRANSFERS = ("activation", "gradient")                 # drawn thinner than the actions
VARIANTS = {"GPipe, blocking": ("gpipe", "blocking"), "1F1B, blocking": ("1f1b", "blocking"),
            "1F1B, overlapped": ("1f1b", "overlapped"),
            "GPipe, overlapped": ("gpipe", "overlapped")}


def stages(schedule, p: int, m: int) -> list[list[tuple]]:
    """Every stage's actions under ``schedule(p, m, stage)``, as ``("F" | "B", i)`` tuples."""
    return [[tuple(a) for a in schedule(p, m, s)] for s in range(p)]


def lanes(rows: dict, title: str, xtitle: str = "time (units of one forward)"):
    """``lf.lanes_figure`` in this lesson's colours: forwards, backwards, transfers, waits."""
    return lf.lanes_figure(rows, title, KIND_COLOR, xtitle, thin=TRANSFERS)


def schedule_problem(lab, reference, kind: str) -> str | None:
    """Why ``lab``'s schedule ``kind`` is not the textbook one (None: it is), on a few (p, m)."""
    for p, m in ((2, 4), (4, 8), (3, 5), (4, 2)):
        try:
            got = stages(lab.SCHEDULES[kind], p, m)
            check_schedule(got, m)
        except Exception as exc:                 # noqa: BLE001 - unfinished work is expected
            return lf.verdict_of(exc)
        for s, (g, w) in enumerate(zip(got, stages(reference.SCHEDULES[kind], p, m))):
            if g != w:
                return f"p={p}, m={m}, stage {s}: " + " ".join(f"{k}{i}" for k, i in g)
    return None


# --------------------------------------------------------------------------- on paper
def paper_transfers(schedules, line, c: float) -> list[tuple]:
    """Every transfer on paper: (sender, receiver, action, start, end); a stage's output leaves
    when its action ends and lands ``c`` later."""
    ends = {(s, name): z for s, spans in enumerate(line.spans) for _, z, name in spans}
    out = []
    for s, actions in enumerate(schedules):
        for kind, i in actions:
            to = s + 1 if kind == "F" else s - 1
            if 0 <= to < len(schedules):
                sent = ends[(s, f"{kind}{i}")]
                out.append((s, to, f"{kind}{i}", sent, sent + c))
    return out


def paper_rows(schedules, line, c: float = 0.0) -> dict:
    """The rows of ``lanes`` for a schedule played on paper: each stage's actions, and with
    ``c > 0`` the activations and gradients between each pair of stages."""
    rows, moves = {}, paper_transfers(schedules, line, c) if c > 0 else []
    for s, spans in enumerate(line.spans):
        rows[f"stage {s}"] = [(a, z, name[0], name) for a, z, name in spans]
        if s + 1 < len(line.spans) and moves:
            rows[f"{s}→{s + 1} activations"] = [(a, z, "activation", n[1:])
                                                for src, _, n, a, z in moves if src == s]
            rows[f"{s + 1}→{s} gradients"] = [(a, z, "gradient", n[1:])
                                              for src, _, n, a, z in moves if src == s + 1]
    return rows


def paper_hidden(schedules, line, c: float) -> list:
    """Per stage, the % of its steady-state transfer time (the union of the transfers it sends
    or receives for its steady-state actions) during which it computes; None: no steady state."""
    moves, out = paper_transfers(schedules, line, c), []
    for s, actions in enumerate(schedules):
        phase = {f"{k}{i}": ph for (k, i), ph in zip(actions, phases(actions))}
        own = [(a, z) for src, dst, n, a, z in moves if s in (src, dst) and phase[n] == "steady"]
        if not own:
            out.append(None)
            continue
        comm = iv.union([a for a, _ in own], [z for _, z in own])
        busy = iv.union([a for a, _, _ in line.spans[s]], [z for _, z, _ in line.spans[s]])
        out.append(100 * iv.measure(iv.intersect(comm, busy)) / iv.measure(comm))
    return out


def _blocking_programs(schedules) -> list:
    """Per stage: (action, key of its send, key of the next action's receive), the first input
    received up front. The n-th send from a stage to another meets the n-th receive there."""
    p, programs = len(schedules), []
    for s, actions in enumerate(schedules):
        seen = {}

        def key(op, src, dst):
            seen[(op, src, dst)] = n = seen.get((op, src, dst), 0) + 1
            return (op, src, dst, n)

        def receive(k):
            if k < len(actions):
                src = s - 1 if actions[k][0] == "F" else s + 1
                return key("recv", src, s) if 0 <= src < p else None

        program = [("", None, receive(0))]
        for k, (kind, i) in enumerate(actions):
            dst = s + 1 if kind == "F" else s - 1
            program.append((f"{kind}{i}", key("send", s, dst) if 0 <= dst < p else None,
                            receive(k + 1)))
        programs.append(program)
    return programs


def simulate_blocking(schedules, t_fwd: float = 1.0, t_bwd: float = 2.0, t_p2p: float = 0.0):
    """``simulate`` for the blocking executor, which waits after every action until its send and
    its next receive are both done. A send ends ``t_p2p`` after it is posted, and not before the
    peer has posted the matching receive (gloo's rule); a receive ends ``t_p2p`` after both sides
    have posted. Returns the Timeline and each stage's waits ``[(start, end)]``."""
    p, cost, posted = len(schedules), {"F": t_fwd, "B": t_bwd}, {}
    programs = _blocking_programs(schedules)

    def partner(k):
        return ("recv" if k[0] == "send" else "send",) + k[1:]

    line, waits = Timeline([[] for _ in range(p)]), [[] for _ in range(p)]
    pos, clock, posted_at = [0] * p, [0.0] * p, [None] * p
    while any(pos[s] < len(programs[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while pos[s] < len(programs[s]):
                name, send, recv = programs[s][pos[s]]
                if posted_at[s] is None:               # run the action, then post both
                    end = clock[s] + (cost[name[0]] if name else 0.0)
                    if name:
                        line.spans[s].append((clock[s], end, name))
                    posted_at[s] = end
                    for k in (send, recv):
                        if k:
                            posted[k] = end
                t = posted_at[s]
                if any(k and partner(k) not in posted for k in (send, recv)):
                    break                              # the peer has not posted its side yet
                done = t
                if send:
                    done = max(done, t + t_p2p, posted[partner(send)])
                if recv:
                    done = max(done, max(t, posted[partner(recv)]) + t_p2p)
                if done > t:
                    waits[s].append((t, done))
                clock[s], posted_at[s], pos[s], moved = done, None, pos[s] + 1, True
        if not moved:
            raise ScheduleError("deadlock: every stage waits for a peer's send or receive")
    line.step = max(clock)
    return line, waits


def on_paper(schedules_of: dict, variant: str, p: int, m: int, t_f: float = 1.0,
             t_b: float = 2.0, c: float = 0.0):
    """The Timeline of ``variant`` (a key of ``VARIANTS``) on paper: ``simulate`` for the
    overlapped executor, ``simulate_blocking`` for the blocking one. ``schedules_of``:
    ``{"gpipe": fn, "1f1b": fn}``."""
    kind, executor = VARIANTS[variant]
    play = simulate_blocking if executor == "blocking" else simulate
    out = play(stages(schedules_of[kind], p, m), t_f, t_b, c)
    return out[0] if isinstance(out, tuple) else out


def paper_figure(schedules_of: dict, p: int, m: int, c: float, kind: str, executor: str):
    """One variant on paper, with a line comparing its step and bubble with the textbook and
    counting the activations stage 0 keeps alive (the blocking drawing shows its waits in red
    and leaves the transfers out)."""
    schedules = stages(schedules_of[kind], p, m)
    ideal = simulate(schedules)
    if executor == "blocking":
        line, waits = simulate_blocking(schedules, t_p2p=c)
        rows = {f"stage {s}": [(a, z, n[0], n) for a, z, n in spans]
                + [(a, z, "waiting", "wait") for a, z in waits[s]]
                for s, spans in enumerate(line.spans)}
    else:
        line = simulate(schedules, t_p2p=c)
        rows = paper_rows(schedules, line, c)
    grew = (line.step - ideal.step) / c if c else 0.0
    print(f"step {line.step:.2f} forwards (without transfers {ideal.step:g}, +{grew:.1f} "
          f"transfers); bubble {line.bubble:.1%} (textbook {bubble_fraction(p, m):.1%}); "
          f"stage 0 keeps {peak_in_flight(schedules[0])} micro-batches alive")
    name = {"1f1b": "1F1B", "gpipe": "GPipe"}[kind]
    return lanes(rows, f"{name}, {executor}, p={p}, m={m}, transfer {c:g} forward, on paper")


def paper_explorer(schedules_of: dict):
    """``paper_figure`` with widgets: stages, micro-batches, a transfer's cost in forwards, the
    schedule and the executor."""
    import ipywidgets as W
    style = {"description_width": "150px"}
    controls = {
        "p": W.IntSlider(value=4, min=2, max=8, description="stages p", style=style),
        "m": W.IntSlider(value=8, min=1, max=32, description="micro-batches m", style=style),
        "c": W.FloatSlider(value=0.5, min=0.0, max=2.0, step=0.05, description="transfer / forward",
                           style=style),
        "kind": W.ToggleButtons(options=[("1F1B", "1f1b"), ("GPipe", "gpipe")], value="1f1b",
                                description="schedule", style=style),
        "executor": W.ToggleButtons(options=["overlapped", "blocking"], value="overlapped",
                                    description="executor", style=style)}
    return lf.live_figure(lambda **v: paper_figure(schedules_of, **v), controls,
                          [["p", "m"], ["c", "kind"], ["executor"]])


# --------------------------------------------------------------------------- on ranks
def check(impl, executor: str, schedules) -> dict:
    """On every rank: one step of ``executor`` on a tiny fp64 model, its loss and its gradients
    against one device: ``{executor: "ok" | "WRONG: ..."}`` (an error is raised: the ranks
    stop together, and ``lf.probe`` reports it)."""
    import torch
    import torch.distributed as dist

    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig, ReferenceModel, grads_by_name, make_batch
    cfg = ModelConfig(dtype="float64", n_layers=2)
    m = len(schedules[0]) // 2
    tokens, targets = make_batch(cfg, 2 * m, seed=1)
    runner = load_lab("pp_overlap", impl).EXECUTORS[executor](cfg, m)
    loss = runner.step(tokens, targets, schedules[dist.get_rank()])
    model = ReferenceModel(cfg)
    want = model(tokens, targets)
    want.backward()
    grads = grads_by_name(model)
    bad = [k for k, g in runner.stage.named_grads().items()
           if g is None or not torch.allclose(g, grads[k], rtol=1e-9, atol=1e-12)]
    if runner.stage.is_last and (loss is None or abs(float(loss) - want.item()) > 1e-9):
        bad.insert(0, "the loss")
    return {executor: f"WRONG: {bad[0]} differs from one device" if bad else "ok"}


def folder(variant: str, take: int) -> str:
    """The trace folder of a variant's take: ("1F1B, overlapped", 0) -> "1f1b_overlapped_0"."""
    return f"{variant.lower().replace(', ', '_')}_{take}"


def variant_steps(run_dir, impl: dict, model: dict, m: int, rows: int, variants: dict, warmup,
                  takes: int = 2) -> dict:
    """On each rank: recalibrate the link, warm both executors up (2 micro-batches, the schedules
    ``warmup``), then ``takes`` rounds of one profiled step of each variant (``{name: (every
    stage's actions, executor)}``) into ``run_dir/folder(name, take)``. Per variant and take:
    the step's start and end, each action's span, each wait inside ``take_received``,
    ``exchange`` and ``finish``, and the link's sends and receives, in ``lf.ms_now`` ms."""
    import torch.distributed as dist

    from workbook import link
    from workbook.grading.labs import load_lab
    from workbook.measure.calibration import recalibrate
    from workbook.model import ModelConfig, make_batch
    from workbook.trace.capture import rank_trace
    rank, local_flops = dist.get_rank(), recalibrate()
    cfg = ModelConfig(**model)
    tokens, targets = make_batch(cfg, rows * m, seed=0)

    def build(executor, micro, spans, waits):
        runner = load_lab("pp_overlap", impl[executor]).EXECUTORS[executor](cfg, micro)
        for name, kind in (("forward_step", "F"), ("backward_step", "B")):
            setattr(runner, name, lf.timed(getattr(runner, name), lambda a, _, t0, t1, k=kind:
                                           spans.append((f"{k}{a[0]}", t0, t1))))
        for name in ("take_received", "exchange", "finish"):
            setattr(runner, name, lf.timed(getattr(runner, name), lambda a, _, t0, t1, n=name:
                                           waits.append((n, t0, t1))))
        return runner

    for executor in ("blocking", "overlapped"):           # warm-up: 2 micro-batches each
        build(executor, 2, [], []).step(tokens[:2 * rows], targets[:2 * rows], warmup[rank])
    out = {"local_flops": local_flops}
    for take in range(takes):                    # the variants in turn, then again
        for name, (schedules, executor) in variants.items():
            spans, waits = [], []
            runner = build(executor, m, spans, waits)
            dist.barrier()
            before = len(link.op_log())
            with rank_trace(Path(run_dir) / folder(name, take), lab="lesson10"):
                t0 = lf.ms_now()
                runner.step(tokens, targets, schedules[rank])
                t1 = lf.ms_now()
            out.setdefault(name, []).append({"take": take, "t0": t0, "t1": t1, "spans": spans,
                                             "waits": waits,
                                             "ops": lf.link_ops(before, kinds=("send", "recv"))})
    return out


def measure_variants(run_dir, impl: dict, model: dict, m: int, rows: int, plan: dict, warmup,
                     preset: str, timeout: float = 180, takes: int = 2):
    """``variant_steps`` (``takes`` rounds) on ``len(warmup)`` ranks over ``preset``; if the
    learner's executors fail, the reference's instead. Returns (per rank, the fastest take of
    each variant; ``{variant: take}``; the implementations used; the calibrated FLOP rate)."""
    from workbook.runtime.launch import on_ranks
    args = (variant_steps, len(warmup), str(run_dir))
    try:
        res = on_ranks(*args, impl, model, m, rows, plan, warmup, takes, link=preset,
                       timeout=timeout)
    except Exception as exc:                      # noqa: BLE001 - e.g. your executor hangs in GPipe
        if set(impl.values()) == {"solutions"}:
            raise
        print(f"Your executors failed here ({lf.verdict_of(exc)}); measuring the REFERENCE "
              "instead.")
        impl = dict.fromkeys(impl, "solutions")
        res = on_ranks(*args, impl, model, m, rows, plan, warmup, takes, link=preset,
                       timeout=timeout)
    take = {name: min(range(len(res[0][name])),             # the faster take of each variant
                      key=lambda k: max(r[name][k]["t1"] for r in res)
                      - min(r[name][k]["t0"] for r in res)) for name in plan}
    return [{name: r[name][take[name]] for name in plan} for r in res], take, impl, \
        res[0]["local_flops"]


# --------------------------------------------------------------------------- from the measurement
def action_costs(x: dict, t0: float = 0.0) -> list[tuple]:
    """Each action of one rank: (name, start, end, compute ms), the waits inside it taken off."""
    out = []
    for n, a, z in x["spans"]:
        waited = sum(wz - wa for _, wa, wz in x["waits"] if a <= wa and wz <= z)
        out.append((n, a - t0, z - t0, z - a - waited))
    return out


def variant_stats(measured: list) -> dict:
    """Per variant: its start, its step (first rank's start to last rank's end), each stage's
    compute and waiting, the measured bubble, and the mean forward and backward compute."""
    stats, p = {}, len(measured)
    for name in measured[0]:
        t0, t1 = min(r[name]["t0"] for r in measured), max(r[name]["t1"] for r in measured)
        costs = [action_costs(r[name]) for r in measured]
        compute = [sum(c for *_, c in cs) for cs in costs]
        stats[name] = dict(t0=t0, step=t1 - t0, compute=compute,
                           waiting=[sum(z - a for _, a, z in r[name]["waits"]) for r in measured],
                           bubble=1 - sum(compute) / (p * (t1 - t0)),
                           t_f=np.mean([c for cs in costs for n, *_, c in cs if n[0] == "F"]),
                           t_b=np.mean([c for cs in costs for n, *_, c in cs if n[0] == "B"]))
    return stats


def stats_table(stats: dict, schedules_of: dict, p: int, m: int, c_ms: float) -> None:
    """Each variant's step, compute and waiting per stage, and bubble, beside the same step on
    paper (``on_paper``) with the costs this variant measured and a transfer of ``c_ms``."""
    print(f"textbook bubble (p-1)/(m+p-1) = {bubble_fraction(p, m):.1%}\n")
    print(f"{'':19s}{'step ms':>9s}{'compute ms':>14s}{'waiting ms':>14s}{'bubble':>8s}"
          f"{'on paper: step':>16s}{'bubble':>8s}")
    for name, st in stats.items():
        paper = on_paper(schedules_of, name, p, m, st["t_f"], st["t_b"], c_ms)
        print(f"{name:19s}{st['step']:9.0f}{st['compute'][0]:7.0f}/{st['compute'][1]:<6.0f}"
              f"{st['waiting'][0]:7.0f}/{st['waiting'][1]:<6.0f}{st['bubble']:8.1%}"
              f"{paper.step:16.0f}{paper.bubble:8.1%}")


def time_split_figure(stats: dict, p: int, title: str):
    """Per variant and stage, the step split into compute, waiting and idle time, stacked."""
    import plotly.graph_objects as go
    names = list(stats)
    x = [[n for n in names for _ in range(p)], [f"stage {s}" for _ in names for s in range(p)]]
    parts = {"compute": lambda n, s: stats[n]["compute"][s],
             "waiting": lambda n, s: stats[n]["waiting"][s],
             "idle (nothing to do)": lambda n, s: (stats[n]["step"] - stats[n]["compute"][s]
                                                   - stats[n]["waiting"][s])}
    fig = go.Figure()
    for (part, size), color in zip(parts.items(), (colors.COMPUTE, colors.EXPOSED, colors.IDLE)):
        fig.add_trace(go.Bar(x=x, y=[size(n, s) for n in names for s in range(p)], name=part,
                             marker_color=color,
                             hovertemplate=part.split()[0] + ": %{y:.0f} ms<extra></extra>"))
    fig.update_layout(barmode="stack", title=title, yaxis_title="ms", height=420,
                      margin=dict(l=10, r=10, t=80, b=40))
    return fig


WAITED_IN = {"take_received": "recv", "exchange": "send+recv", "finish": "sends"}


def measured_rows(measured: list, stats: dict, name: str, c_ms: float) -> dict:
    """The rows of ``lanes`` for a measured step: each stage's actions and its waits (longer than
    2% of a transfer), then the transfers as the receiving rank's link log has them."""
    t0, rows = stats[name]["t0"], {}
    for s, res in enumerate(measured):
        x = res[name]
        rows[f"stage {s}"] = ([(a, z, n[0], n) for n, a, z, _ in action_costs(x, t0)]
                              + [(a - t0, z - t0, "waiting", WAITED_IN[what])
                                 for what, a, z in x["waits"] if z - a > 0.02 * c_ms])
        if s + 1 < len(measured):
            for label, kind, ops in ((f"{s}→{s + 1} activations", "activation",
                                      measured[s + 1][name]["ops"]),
                                     (f"{s + 1}→{s} gradients", "gradient", x["ops"])):
                rows[label] = [(o["start"] - t0, o["end"] - t0, kind, str(i))
                               for i, o in enumerate(o for o in ops if o["op"] == "recv")]
    return rows


def measured_panel(measured: list, stats: dict, who: dict, label: str, c_ms: float):
    """A variant's measured timeline, picked with a dropdown (``who``: whose executor, by kind)."""
    import ipywidgets as W

    def draw(name):
        return lanes(measured_rows(measured, stats, name, c_ms),
                     f"{name} ({who[VARIANTS[name][1]]} executor), step "
                     f"{stats[name]['step']:.0f} ms — {label}",
                     xtitle="ms since the first rank began the step")
    pick = W.Dropdown(options=list(stats), value="1F1B, overlapped", description="variant")
    return lf.live_figure(draw, {"name": pick}, [["name"]])


def transfer_ms(sim, shape, itemsize: int = 4) -> tuple[int, float]:
    """One boundary tensor of ``shape`` on the link ``sim``: its bytes and its time in ms (the
    lab's prediction task computes this itself; here it only feeds the measured tables)."""
    nbytes = int(np.prod(shape)) * itemsize
    return nbytes, sim.op_time("send", nbytes, 2) * 1e3


def paper_share_measured(schedules, own: dict, c_ms: float) -> list:
    """``paper_hidden`` of ``schedules`` played with a variant's measured forward and backward
    (``own``, one row of ``variant_stats``) and the modelled transfer ``c_ms``."""
    return paper_hidden(schedules, simulate(schedules, own["t_f"], own["t_b"], c_ms), c_ms)


def hidden_table(run_dir, take: dict, paper_share: list) -> None:
    """For both 1F1B executors: per stage the link time of the steady state and the share the
    trace finds hidden (``paper_share``: ``paper_hidden`` beside the overlapped one), then both
    stages together with the skew excused, as the grader reads it."""
    for name in ("1F1B, blocking", "1F1B, overlapped"):
        r_run = trace.load_run(Path(run_dir) / folder(name, take[name]))
        comm = exposed = 0.0
        for r in r_run.ranks:
            o = trace.overlap(r_run, rank=r, within="steady")
            comm, exposed = comm + o.comm_us, exposed + o.exposed_comm_us - o.skew_us
            print(f"{name:17s} stage {r}: link busy {o.comm_us / 1e3:5.0f} ms in the steady "
                  f"state, {o.overlap_pct:3.0f}% hidden ({o.overlap_pct_ex_skew:3.0f}% with skew "
                  "as hidden)" + (f"; on paper {paper_share[r]:.0f}%"
                                  if name.endswith("overlapped") else ""))
        print(f"{name:17s} both stages: {100 * (1 - exposed / comm):.0f}% hidden, skew excused\n")
