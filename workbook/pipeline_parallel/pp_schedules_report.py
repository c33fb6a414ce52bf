"""Lab ``pp_schedules``'s own figures in ``workbook run pp_schedules``: once every check passed, one
traced step of each schedule on the learner's executor, on 2 ranks over the simulated dgx-h100
link (the bench's rank side, small), printed beside each schedule's formula and
``simulate_chunked`` with the costs the run measured (``pp_schedules_figures``).

The prediction. Then, per schedule, the learner's ``predict_step_ms`` (the lab's prediction task)
with the link this run used, the activation's shape and a whole stage's compute (the schedule's
own measured chunk actions x v: ``whole_stage_costs``), beside the model's value of the same figure
(``step_model``: ``simulate_chunked`` of the learner's schedule, each chunk action 1/v of a whole
stage's compute, the link's alpha-beta time for one activation at every dependency between two
ranks, none at the V's turn) and the measured step, on the simulated link
(``workbook.grading.predictions.comparison_lines``; a prediction not written yet shows ``-``).
``step_model`` also gives the values of the known wrong derivations, which the grader
(``tests/grading/test_pp_schedules.py``) names when a prediction equals one of them."""
from __future__ import annotations

from workbook.pipeline_parallel.pp_schedules_figures import _fmt, paper_rows

# --------------------------------------------------------------------------- the self-check's figures
WORLD_SIZE = 2
LINK = "dgx-h100"
#: the self-check's run: a small model, 8 micro-batches, the four schedules and the optimum
REPORT_OPTIONS = dict(hidden=256, layers=4, seq=256, rows=1, micro_batches=8, heads=4, vocab=256,
                      repeats=1, warmup=1, links=[LINK],
                      run=["1f1b", "interleaved_v2", "zb_h1", "zbv", "no_comm"])


def run(trace_dir=None, impl=None, options=None) -> dict:
    """On every rank, after ``workbook run pp_schedules`` passed: one traced step of each
    schedule on the learner's executor (the bench's rank side, small: ``REPORT_OPTIONS``, or
    ``options``), its figures and, on rank 0, the schedules played and the options."""
    import tempfile

    import torch.distributed as dist

    from workbook import link
    from workbook.pipeline_parallel import pp_schedules_bench as bench
    o = dict(options or REPORT_OPTIONS, impl=impl)
    with tempfile.TemporaryDirectory(prefix="pp-schedules-report-") as tmp:
        out = bench._rank_bench(o, str(trace_dir or tmp))
    p, m = dist.get_world_size(), o["micro_batches"]
    lab = bench.load_schedules_lab(impl)
    out["schedules"] = ({name: bench.variant_schedules(lab, name, p, m) for name in o["run"]}
                        if dist.get_rank() == 0 else None)
    out.update(micro_batches=m, link_model=link.current_link(), impl=impl,
               activation_shape=(o["rows"], o["seq"], o["hidden"]))   # [b, S, H], fp32
    return out


def describe(results: list[dict]) -> str:
    """The self-check's lines: per schedule the step against the no-communication optimum, the
    steady state's p2p hidden, the measured bubble beside the formula's and simulate_chunked's
    (with the costs this run measured)."""
    from workbook.pipeline_parallel import pp_schedules_bench as bench
    per = [r["links"][LINK] for r in results]
    names = REPORT_OPTIONS["run"]
    rows = {name: bench.combine([q["variants"][name] for q in per]) for name in names}
    schedules = results[0]["schedules"]
    p, m = len(results), results[0]["micro_batches"]
    paper_rows(rows, schedules, p, m, per[0]["t_p2p_ms"])
    opt = rows["no_comm"]["step_ms"]
    lines = [f"  your schedules on your executor, {p} ranks, {m} micro-batches "
             f"({per[0]['link_label']}):",
             f"  {'schedule':16s}{'step ms':>9s}{'x opt':>7s}{'hid% steady':>13s}"
             f"{'bubble %':>10s}{'formula':>9s}{'simulate':>10s}"]
    for name in names[:-1]:
        r = rows[name]
        lines.append(f"  {name:16s}{r['step_ms']:9.0f}{r['step_ms'] / opt:7.2f}"
                     f"{_fmt(r.get('hidden_pct'), '{:.0f}'):>13s}{100 * r['bubble']:10.1f}"
                     f"{100 * r['formula']:9.1f}{100 * r['paper']['bubble']:10.1f}")
    lines.append("  (lesson 12, section 7 explains these; `workbook bench pp_schedules` runs the full "
                 "comparison)")
    first = results[0]
    return "\n".join(lines + prediction_lines(first["link_model"], first["activation_shape"], m,
                                               schedules, rows, _lab_prediction(first["impl"])))


# --------------------------------------------------------------------------- the prediction's model
def transfer_ms(link, shape, itemsize: int) -> float:
    """The link's time in ms for one activation (or its gradient) of ``shape``, elements of
    ``itemsize`` bytes, sent to the next rank: the alpha-beta cost of ``Link.op_time``."""
    import math
    return 1e3 * link.op_time("send", math.prod(shape) * itemsize, 2)


def _turn_charged_step(schedules, p: int, v: int, costs: dict, c: float) -> float:
    """A WRONG model, for the mistakes' values: ``simulate_chunked``'s play of a V schedule with
    every dependency charged a transfer, the V's turn on rank p - 1 included."""
    from workbook.pipeline_parallel import B, F, V_SHAPE, W, stage_index
    split = any(a[0] == W for acts in schedules for a in acts)
    cost = {F: costs["t_f"], B: costs["t_b"] + (0 if split else costs["t_w"]), W: costs["t_w"]}
    last, end, nxt, free = p * v - 1, {}, [0] * p, [0.0] * p
    while any(nxt[r] < len(schedules[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while nxt[r] < len(schedules[r]):
                kind, i, chunk = schedules[r][nxt[r]]
                s = stage_index(r, chunk, p, V_SHAPE)
                dep = ((s - 1, F, i) if kind == F and s > 0 else
                       (s + 1, B, i) if kind == B and s < last else None)
                if dep is not None and dep not in end:
                    break
                start = max(free[r], 0.0 if dep is None else end[dep] + c)
                free[r] = end[(s, kind, i)] = start + cost[kind]
                nxt[r], moved = nxt[r] + 1, True
        if not moved:
            raise ValueError("the schedule deadlocks on paper")
    return max(free)


def step_model(name: str, schedules, placement: str, link, shape, itemsize: int,
               t_f_ms: float, t_b_ms: float, t_w_ms: float) -> tuple[float, dict]:
    """The model's step in ms of schedule ``name`` (``interleaved_1f1b``, ``zb_h1`` or ``zbv``;
    ``schedules``: every rank's actions, ``placement`` their placement) run with overlapped p2p
    on ``link``: ``simulate_chunked`` with a chunk action's compute, a whole stage's ``t_f_ms``,
    ``t_b_ms``, ``t_w_ms`` divided by the v chunks a rank holds (an unsplit B costs B + W), and
    ``transfer_ms`` of one activation ``shape`` for every dependency between two ranks (the V's
    turn, on one rank, costs nothing). Returns ``(model, mistakes)``: ``mistakes`` maps each
    known wrong derivation (as the learner's message words it) to the value it gives, for
    ``workbook.grading.predictions.judge_prediction``."""
    import math

    from workbook.pipeline_parallel import V_SHAPE, W, simulate_chunked
    from workbook.pipeline_parallel.pp_schedules_lesson import formula_bubble
    p = len(schedules)
    v = 1 + max(a[2] for acts in schedules for a in acts)
    m = sum(1 for a in schedules[0] if a[0] == "F" and a[2] == 0)
    split = any(a[0] == W for acts in schedules for a in acts)
    whole = dict(t_f=t_f_ms, t_b=t_b_ms, t_w=t_w_ms)
    chunk = {k: t / v for k, t in whole.items()}
    alpha_ms, c = 1e3 * link.latency_s, transfer_ms(link, shape, itemsize)

    def play(c_ms: float, costs=chunk) -> float:
        return simulate_chunked(schedules, p, v, placement, t_p2p=c_ms, **costs).step
    model = play(c)
    busy = m * (t_f_ms + t_b_ms + t_w_ms)
    formula = {"interleaved_1f1b": "interleaved 1F1B", "zb_h1": "ZB-H1", "zbv": "ZBV"}[name]
    mistakes = {
        "leave the transfers out: the schedule's own formula, busy m(t_F + t_B + t_W) over "
        "1 - its bubble, counts no p2p at all": busy / (1 - formula_bubble(formula, p, v, m,
                                                                            **whole)),
        "leave the transfers out: the textbook bubble (p - 1)/(v m + p - 1), with no p2p on the "
        "critical path": busy / (1 - (p - 1) / (v * m + p - 1)),
        "play your schedule with free transfers (t_p2p = 0)": play(0.0),
        "leave the link's latency (alpha) out of each transfer's time": play(c - alpha_ms),
        "leave the bandwidth term (bytes / bandwidth) out of each transfer's time: only the "
        "latency": play(alpha_ms),
        "count the activation's elements as bytes (its itemsize left out)":
            play(alpha_ms + 1e3 * math.prod(shape) / link.bandwidth_Bps),
        "give each chunk action a whole stage's compute: with v chunks a rank runs each "
        "micro-batch's F, B and W v times, each on 1/v of its layers": play(c, whole),
        "give seconds, not milliseconds": model / 1e3,
    }
    if not split:
        mistakes["cost an unsplit B as t_B alone: with no W in the schedule, each B is the "
                  "whole backward, t_B + t_W"] = play(c, {**chunk, "t_w": 0.0})
    if placement == V_SHAPE:
        mistakes["charge a transfer at the V's turn: stages p - 1 and p are both on rank p - 1, "
                 "so the tensor is handed over in memory"] = _turn_charged_step(
                     schedules, p, v, chunk, c)
    return model, mistakes


#: the schedules the report predicts, measured variant -> the lab's schedule name
PREDICTED = {"1f1b": "interleaved_1f1b", "interleaved_v2": "interleaved_1f1b",
             "zb_h1": "zb_h1", "zbv": "zbv"}


def whole_stage_costs(row: dict, v: int) -> list[float] | None:
    """A whole stage's F, B, W compute in ms (what ``predict_step_ms`` takes) from a measured
    row's per-chunk-action means: x v; an unsplit schedule's B holds its W, split here in two
    halves (an unsplit B costs B + W, so the step does not depend on the split). None when the
    row has no compute measured."""
    if row.get("t_f_ms") is None or row.get("t_b_ms") is None:
        return None
    if row.get("t_w_ms") is None:
        return [v * row["t_f_ms"], v * row["t_b_ms"] / 2, v * row["t_b_ms"] / 2]
    return [v * row[k] for k in ("t_f_ms", "t_b_ms", "t_w_ms")]


def prediction_lines(link, shape, m: int, schedules: dict, rows: dict, predict) -> list[str]:
    """The table: per variant of ``PREDICTED`` in ``rows`` (the measured rows, ``combine``'s),
    the learner's ``predict`` (their ``predict_step_ms``; None or one that raises, a stub, shows
    ``-``), the model (``step_model`` of ``schedules[variant]`` = ``(actions, v, placement)``)
    and the measured step, in seconds. The inputs: ``link``, the activation ``shape`` (fp32)
    and the variant's own measured compute (``whole_stage_costs``: the machine's speed drifts
    between variants, so each is predicted from its own)."""
    from workbook.grading.predictions import comparison_lines
    if link is None:
        return ["  prediction: no simulated link on this run, nothing to predict"]
    table, used = [], []
    for variant, name in PREDICTED.items():
        if variant not in rows or variant not in schedules:
            continue
        acts, v, placement = schedules[variant]
        whole = whole_stage_costs(rows[variant], v)
        if whole is None:
            continue
        model, _ = step_model(name, acts, placement, link, shape, 4, *whole)
        try:
            predicted = float(predict(link, name, len(acts), v, m, shape, 4, *whole))
        except Exception:                        # noqa: BLE001 - a stub or a bug shows as "-"
            predicted = None
        table.append((f"{variant} (v={v})", None if predicted is None else predicted / 1e3,
                      model / 1e3, rows[variant]["step_ms"] / 1e3))
        used.append(f"{variant} " + " / ".join(f"{t:.0f}" for t in whole))
    if not table:
        return ["  prediction: no schedule's compute measured on this run, nothing to predict"]
    return ([f"  prediction (predict_step_ms with this run's link, shape {tuple(shape)} fp32 and "
             f"each schedule's own measured compute, a whole stage's F / B / W in ms: "
             f"{'; '.join(used)}; measured on the SIMULATED link):"]
            + ["  " + line for line in comparison_lines(table, unit="s")])


def _lab_prediction(impl):
    """The lab's ``predict_step_ms`` (``impl``: labs, solutions or a folder), or None."""
    from workbook.grading.labs import load_lab
    try:
        return load_lab("pp_schedules", impl).predict_step_ms
    except Exception:                            # noqa: BLE001 - not loadable: shown as "-"
        return None


def bench_prediction_lines(result: dict, predict, preset: str = LINK) -> list[str]:
    """``prediction_lines`` for a ``pp_schedules_bench.measure`` result (lesson 12, section 7):
    its ``preset``'s link and rows, the learner's ``predict`` (None: not written)."""
    from workbook.link import Link
    o, r = result["options"], result["links"][preset]
    schedules = {name: (acts, r["variants"][name]["v"], r["variants"][name]["placement"])
                 for name, acts in result["schedules"].items() if name in r["variants"]}
    return prediction_lines(Link(**r["link"]), (o["rows"], o["seq"], o["hidden"]),
                            o["micro_batches"], schedules, r["variants"], predict)
