"""``workbook bench capstone``: the step time of each configuration of the capstone's 2 x 2 mesh,
TP x DP and PP x DP, with its overlaps off and on, against the no-communication optimum.

Public functions: ``measure(**options) -> dict`` (what ``--json`` writes), ``report(result)``
(the table), ``figure(result)`` (plotly), ``run_bench(args)`` and ``add_arguments(parser)``
for the command line; ``off_pieces(kind)`` (the overlaps switched off) and
``_rank_bench(options, trace_dir)``, the rank side.

What runs. The lab's trainers (``--impl``, default solutions: ``TPxDPTrainer``,
``PPxDPTrainer``) on ``--nproc`` ranks (inner groups of 2, ``--nproc / 2`` DP replicas), one
training step a repeat (forward, backward, the DP average, clipping, Adam) of a GPT model of
``--layers`` blocks, hidden ``--hidden``, on ``--batch`` rows of ``--seq`` bytes of the shipped
text, fp32. Per configuration, three variants, each its own trainer built from the same seed:

* ``overlap``: the pieces the capstone composes (``capstone.pieces``: ``tp_overlap``'s
  ``OverlapBlock`` with ``Overlap()``, the ring exchange forward and the bulk overlap backward;
  ``pp_overlap``'s ``OverlappedExecutor`` running ``one_f_one_b``; ``dp_overlap``'s buckets,
  each all-reduced during the backward as soon as its gradients are in);
* ``no_overlap``: the same step with each overlap switched off (``off_pieces``): the
  sequence-parallel block with blocking collectives (``capstone_standins.plain_sp_block``), the
  executor that waits for every transfer at once (``PairedExchangeExecutor``), and all the
  gradients in one bucket, all-reduced once the backward is over (naive DP);
* ``no_comm``: ``overlap`` with the link set to None: the collectives still cross loopback
  gloo, at about the cost of a copy; the optimum each step is divided by.

A warm-up step per variant (no link, the fewest rows), then ``--repeats`` profiled steps on the
simulated ``--link``, recalibrated first, the variants taking turns. Per variant (medians over
the repeats per rank, then over the ranks): ``step_ms`` the slowest rank's wall time,
``over_no_comm`` = step / no_comm's step; ``exposed_ms`` the slowest rank's link time (every
group's together) no compute ran beside, rank skew excused, and ``exposed_over_no_comm`` = 1 +
exposed / no_comm's step (the step's ratio had it computed as fast as no_comm: under load a
variant's compute is slowed by its turn's neighbours, this figure less so); per group (TP or PP, and DP) ``comm_ms`` and
``exposed_ms`` (ranks added; rank skew excused, ``capstone_traffic.hidden_by_group``) and
``hidden_pct``; ``loss`` of the first measured step (the variants compute the same step).

Times on the SIMULATED link (``workbook.link``): a CPU in slow motion, calibrated to the
preset's compute / link ratio, labelled so; docs/bench-capstone.md has figures.

    workbook bench capstone --json capstone.json --figure capstone.html
"""
from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

from workbook.measure.bench_cli import UsageError, listed, measure_and_save, run_as_command

KINDS = ("tp", "pp")
NAMES = {"tp": "TP x DP", "pp": "PP x DP"}
VARIANTS = ("no_overlap", "overlap", "no_comm")
WHAT = {"no_overlap": "overlaps off", "overlap": "overlaps on", "no_comm": "no communication"}
#: TrainSetup.for_overlap's model and batch: GEMMs wide enough to cover the simulated link
DEFAULTS = dict(hidden=512, heads=8, layers=2, seq=256, batch=16, micro_batches=2)
QUICK = dict(hidden=64, heads=4, layers=2, seq=32, batch=8, micro_batches=2)
PREFIX = "workbook bench capstone: "


def add_arguments(parser) -> None:
    parser.add_argument("--nproc", type=int, default=4,
                        help="ranks: inner groups of 2, nproc / 2 DP replicas (default 4)")
    parser.add_argument("--link", default="dgx-h100", help="the simulated link (default "
                                                           "%(default)s)")
    parser.add_argument("--impl", default="solutions", help="labs, solutions or a folder")
    parser.add_argument("--kinds", default=",".join(KINDS), help="tp, pp or both (default "
                                                                 "%(default)s)")
    for name, value in DEFAULTS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, default=value,
                            help=f"default {value}")
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny shapes, for a smoke test: {QUICK}")
    parser.add_argument("--repeats", type=int, default=2,
                        help="measured steps a variant (median; default 2)")
    parser.add_argument("--trace-dir", default=None, help="keep the traces here")
    for name, what in (("json", "the results as JSON"), ("figure", "the figure (plotly HTML)")):
        parser.add_argument(f"--{name}", default=None, metavar="PATH", help=f"write {what}")


def make_setup(o: dict):
    """The ``TrainSetup`` of options ``o`` (``DEFAULTS``' keys): fp32, GPT, bucket cap 2 MiB."""
    from workbook.capstone.capstone_train import TrainSetup
    from workbook.model import ModelConfig
    cfg = ModelConfig(vocab_size=256, hidden=o["hidden"], heads=o["heads"],
                      ffn_hidden=4 * o["hidden"], n_layers=o["layers"], seq_len=o["seq"],
                      style="gpt", dtype="float32", seed=0)
    return TrainSetup(cfg=cfg, batch=o["batch"], steps=2, micro_batches=o["micro_batches"],
                      bucket_bytes=2 << 20)


def one_bucket(params, bucket_bytes):
    """Every gradient in one bucket: it is complete, and all-reduced, when the backward is over."""
    return [list(params)]


def off_pieces(kind: str) -> dict:
    """The pieces of ``kind`` with every overlap switched off (the module docstring)."""
    from workbook.capstone import capstone_standins as standins
    from workbook.capstone.pieces import Piece
    out = {"make_buckets": Piece("make_buckets", "dp_overlap", one_bucket, False)}
    if kind == "tp":
        out["tp_block"] = Piece("tp_block", "sp", standins.plain_sp_block, False)
    else:
        out["schedule"] = Piece("schedule", "pp_overlap", standins.one_f_one_b, False)
        out["executor"] = Piece("executor", "pp_overlap", standins.PairedExchangeExecutor, False)
    return out


# --------------------------------------------------------------------------- inside a rank
def _rank_bench(o: dict, root: str) -> dict:
    """On every rank: per configuration of ``o["kinds"]`` and variant, ``o["repeats"]``
    profiled steps; the medians of this rank's figures (module docstring)."""
    import torch.distributed as dist

    from workbook import link
    from workbook.capstone.capstone_run import PIECES, build_mesh, make_trainer
    from workbook.capstone.capstone_train import global_batches
    from workbook.capstone.capstone_traffic import hidden_by_group
    from workbook.capstone.pieces import load_pieces, stand_in_notes
    from workbook.grading.labs import load_lab, use_impl
    from workbook.measure.calibration import recalibrate
    from workbook.measure.profiled_step import profiled_step
    from workbook import trace
    from workbook.trace.capture import hardware
    use_impl(o["impl"])                               # the pieces' labs come from it too
    lab, rank = load_lab("capstone"), dist.get_rank()
    setup = make_setup(o)
    (tokens, targets), = global_batches(setup, 1)
    out = {"hardware": hardware(), "kinds": {}, "notes": []}
    for kind in o["kinds"]:
        mesh = build_mesh(lab, kind)
        on = load_pieces(*PIECES[kind])
        out["notes"] += stand_in_notes(on)
        pieces = {"no_overlap": off_pieces(kind), "overlap": on, "no_comm": on}
        trainers = {v: make_trainer(lab, kind, setup, mesh, pieces[v]) for v in VARIANTS}
        link.set_link(None)
        rows = mesh.dp * setup.micro_batches           # warm-up: the fewest rows, no link
        for trainer in trainers.values():
            trainer.step(tokens[:rows], targets[:rows], 0)
        recalibrate(o["link"])
        lk = link.current_link()
        figures = {v: [] for v in VARIANTS}
        for k in range(o["repeats"]):
            for v in VARIANTS:
                link.set_link(None if v == "no_comm" else lk)
                loss = []
                tdir = Path(root) / kind / v / f"step{k}"
                ms, _, t = profiled_step(
                    lambda: loss.append(trainers[v].step(tokens, targets, 1 + k)), tdir, rank,
                    "capstone")
                hidden = hidden_by_group(str(tdir / f"rank{rank}.trace.json"), mesh) \
                    if v != "no_comm" else {}
                ov = trace.overlap(t) if v != "no_comm" else None   # every group's together
                figures[v].append({"step_ms": ms, "loss": loss[0], "hidden": hidden,
                                   "exposed_ms": (ov.exposed_comm_us - ov.skew_us) / 1e3 if ov
                                   else 0.0})
        link.set_link(lk)
        out["kinds"][kind] = {"link_label": lk.label, "link": lk.describe(), "variants": {
            v: _median(f, kind) for v, f in figures.items()}}
    link.set_link(None)
    return out


def _median(steps: list[dict], kind: str) -> dict:
    """The median over the repeats of one rank's step ms and per-group link and exposed ms;
    the first repeat's loss."""
    out = {"step_ms": statistics.median(s["step_ms"] for s in steps), "loss": steps[0]["loss"],
           "exposed_ms": statistics.median(s["exposed_ms"] for s in steps)}
    for group in (kind.upper(), "DP"):
        for key in ("comm_ms", "exposed_ms"):
            out[f"{group}_{key}"] = statistics.median(
                s["hidden"].get(group, {}).get(key, 0.0) for s in steps)
    return out


def combine(per_rank: list[dict], kind: str) -> dict:
    """One variant's row over the ranks: the slowest rank's step; per group the link and
    exposed ms added up and the share hidden (``workbook.grading.timing.hidden_pct``)."""
    from workbook.grading.timing import hidden_pct
    row = {"step_ms": max(r["step_ms"] for r in per_rank), "loss": per_rank[0]["loss"],
           "exposed_ms": max(r["exposed_ms"] for r in per_rank)}
    for group in (kind.upper(), "DP"):
        comm = sum(r[f"{group}_comm_ms"] for r in per_rank)
        exposed = sum(r[f"{group}_exposed_ms"] for r in per_rank)
        row.update({f"{group}_comm_ms": comm, f"{group}_exposed_ms": exposed,
                    f"{group}_hidden_pct": hidden_pct(comm, exposed) if comm else None})
    return row


# --------------------------------------------------------------------------- the command
def _check(o: dict, nproc: int, kinds: list, repeats: int, link: str, unknown_options) -> None:
    from workbook.capstone.capstone_run import check_run
    from workbook.link.presets import PRESETS
    problems = []
    if unknown_options:
        problems.append(f"unknown option(s) {sorted(unknown_options)}")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        problems.append(f"--kinds {','.join(kinds)}: choose tp, pp or both")
    if link not in PRESETS:
        problems.append(f"unknown link preset {link!r}: choose from {', '.join(PRESETS)}")
    if not isinstance(nproc, int) or nproc not in (2, 4, 6, 8):
        problems.append(f"--nproc {nproc}: 2, 4, 6 or 8 ranks (inner groups of 2)")
    if repeats < 1:
        problems.append(f"--repeats {repeats}: at least 1")
    small = sorted(k for k, v in o.items() if not isinstance(v, int) or v < 1)
    if small:
        problems.append(f"--{', --'.join(k.replace('_', '-') for k in small)} must be at least 1")
    if not problems:
        for kind in dict.fromkeys(kinds):
            try:
                check_run(kind, make_setup(o), nproc)
            except ValueError as exc:
                problems.append(f"{NAMES[kind]}: {exc}")
    if problems:
        raise UsageError(PREFIX + "; ".join(dict.fromkeys(problems)))


def measure(*, impl: str = "solutions", nproc: int = 4, link: str = "dgx-h100", kinds=KINDS,
            repeats: int = 2, trace_dir=None, pool: bool = False, quick: bool = False,
            **shape) -> dict:
    """Run the benchmark on ``nproc`` fresh ranks (``pool``: the package's warm ones, for its
    tests); return what ``--json`` writes. ``shape``: any of ``DEFAULTS`` (``quick``: ``QUICK``
    under them); a bad option raises ``UsageError`` (a ``SystemExit``, status 2, one line)
    before any rank starts."""
    import torch

    from workbook.grading.labs import load_lab
    from workbook.runtime import launch
    kinds = list(kinds)
    o = dict(QUICK if quick else DEFAULTS)
    unknown_options = set(shape) - set(o)
    o.update({k: v for k, v in shape.items() if k in o})
    _check(o, nproc, kinds, repeats, link, unknown_options)
    try:                                             # before any rank starts
        load_lab("capstone", impl)
    except (FileNotFoundError, ValueError, ImportError) as err:
        raise UsageError(PREFIX + " ".join(str(err).split())) from None
    o.update(impl=impl, repeats=repeats, link=link, kinds=kinds)
    with tempfile.TemporaryDirectory(prefix="capstone-bench-") as tmp:
        results = launch.run(_rank_bench, nproc, o, str(trace_dir or tmp), timeout=3600,
                             link=link, pool=pool)
    out = {}
    for kind in kinds:
        per = [r["kinds"][kind] for r in results]
        rows = {v: combine([p["variants"][v] for p in per], kind) for v in VARIANTS}
        opt = rows["no_comm"]["step_ms"]
        for row in rows.values():
            row["over_no_comm"] = row["step_ms"] / opt
            row["exposed_over_no_comm"] = 1 + row["exposed_ms"] / opt
        out[kind] = {"link_label": per[0]["link_label"], "link": per[0]["link"],
                     "no_comm_step_ms": opt, "variants": rows}
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {"nproc": nproc, "mesh": f"2 x {nproc // 2}", "cores": os.cpu_count() or 1,
            "load_avg": load, "options": o, "kinds": out, "notes": results[0]["notes"],
            "hardware": results[0]["hardware"], "torch": torch.__version__}


def report(result: dict) -> str:
    """The table: per configuration and variant the step, its ratio to the optimum, and per
    group the link ms, exposed ms and hidden share (ranks added)."""
    from workbook.measure.output import where_measured
    o = result["options"]
    first = next(iter(result["kinds"].values()))
    lines = [f"capstone benchmark, {where_measured(first['link_label'])}",
             f"{result['nproc']} ranks ({result['mesh']} mesh); GPT {o['layers']} layers, hidden "
             f"{o['hidden']}, {o['heads']} heads, batch {o['batch']} x {o['seq']} bytes, fp32, "
             f"{o['micro_batches']} micro-batches per replica (PP); {o['repeats']} measured "
             f"step(s) a variant, median; lab from {o['impl']}"]
    for kind, r in result["kinds"].items():
        inner = kind.upper()
        lines += ["", f"{NAMES[kind]}   {'step ms':>9}{'x optimum':>11}{'1+e/o':>7}"
                      f"{inner + ' ms':>9}{'exposed':>9}{'hidden':>8}"
                      f"{'DP ms':>9}{'exposed':>9}{'hidden':>8}"]
        for v in VARIANTS:
            row, cells = r["variants"][v], ""
            for g in (inner, "DP"):
                pct = row[f"{g}_hidden_pct"]
                cells += (f"{'-':>9}{'-':>9}{'-':>8}" if v == "no_comm" else
                          f"{row[f'{g}_comm_ms']:>9.0f}{row[f'{g}_exposed_ms']:>9.0f}"
                          f"{'-' if pct is None else f'{pct:.0f}%':>8}")
            lines.append(f"  {WHAT[v]:<17}{row['step_ms']:>9.0f}{row['over_no_comm']:>10.2f}x"
                         f"{row['exposed_over_no_comm']:>7.2f}{cells}")
    lines += ["", "(1+e/o: 1 + the slowest rank's exposed link time, every group's together, over "
                  "the optimum's step: the ratio had the step computed as fast as the optimum's; "
                  "link ms and exposed per group: every rank's added; exposed excuses the time a "
                  "late peer held a transfer up; no communication: the collectives over loopback "
                  "gloo, no link model)"]
    lines += [f"note: {n}" for n in result.get("notes", [])]
    return "\n".join(lines)


def figure(result: dict):
    """Per configuration, the step of each variant as a bar, its ratio to the optimum on it."""
    import plotly.graph_objects as go
    from workbook.measure.output import where_measured
    from workbook.trace import colors
    fig = go.Figure()
    tint = {"no_overlap": colors.EXPOSED, "overlap": colors.COMMUNICATION,
            "no_comm": colors.COMPUTE}
    for v in VARIANTS:
        xs = [NAMES[k] for k in result["kinds"]]
        ys = [r["variants"][v]["step_ms"] for r in result["kinds"].values()]
        text = [f"{r['variants'][v]['over_no_comm']:.2f}x" for r in result["kinds"].values()]
        fig.add_trace(go.Bar(x=xs, y=ys, name=WHAT[v], marker_color=tint[v], text=text,
                             textposition="outside"))
    first = next(iter(result["kinds"].values()))
    fig.update_layout(barmode="group", yaxis_title="step ms (slowest rank, median)",
                      title=f"workbook bench capstone: {result['nproc']} ranks — "
                            f"{where_measured(first['link_label'])}", plot_bgcolor="white")
    return fig


def run_bench(args) -> dict:
    return measure_and_save(args, measure, report, figure, link=args.link,
                            kinds=listed(args.kinds), repeats=args.repeats, quick=args.quick,
                            **{k: getattr(args, k) for k in DEFAULTS
                               if not args.quick or getattr(args, k) != DEFAULTS[k]})


def main(argv=None) -> None:
    run_as_command(add_arguments, run_bench, "the capstone's TP x DP and PP x DP steps with "
                   "their overlaps off and on vs no communication, on the simulated link",
                   argv, prog="workbook bench capstone")


if __name__ == "__main__":
    main()
