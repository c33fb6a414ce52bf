"""Lab ``pp_schedules``'s own figures in ``workbook run pp_schedules``: once every check passed, one
traced step of each schedule on the learner's executor, on 2 ranks over the simulated dgx-h100
link (the bench's rank side, small), printed beside each schedule's formula and
``simulate_chunked`` with the costs the run measured (``pp_schedules_figures``)."""
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

    from workbook.pipeline_parallel import pp_schedules_bench as bench
    o = dict(options or REPORT_OPTIONS, impl=impl)
    with tempfile.TemporaryDirectory(prefix="pp-schedules-report-") as tmp:
        out = bench._rank_bench(o, str(trace_dir or tmp))
    p, m = dist.get_world_size(), o["micro_batches"]
    lab = bench.load_schedules_lab(impl)
    out["schedules"] = ({name: bench.variant_schedules(lab, name, p, m) for name in o["run"]}
                        if dist.get_rank() == 0 else None)
    out["micro_batches"] = m
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
    return "\n".join(lines)
