"""Lab ``capstone``'s own figures in ``workbook run capstone``: one picture of a whole step.

Once the checks ran, on the 2 x 2 mesh (``WORLD_SIZE`` = 4 ranks):

* the loss of ``TrainSetup().steps`` (20) training steps of each configuration, TP x DP and
  PP x DP, beside the single-device run on the same global batches (``capstone_train``), with
  no link model (numbers, not time);
* one traced step of each configuration on the SIMULATED ``LINK`` (``TrainSetup.for_overlap``,
  ``capstone_run.traced_step``): per rank, when it computed and when each group's
  communication (TP, DP, PP: which group an operation ran on is read from the global ranks the
  link records with it, ``Mesh.group_of``) was on the link, and the part of it no compute
  covered, the *exposed* part (``step_spans``);
* the share of each group's link time hidden behind compute (``capstone_traffic.
  hidden_by_group``, the grader's figure: rank skew excused), and the bytes each group sent
  beside the model and the learner's ``predict_traffic``.

``capstone_figures.figure(results)`` draws the picture: per configuration a timeline with a
row per rank, compute grey, each group's transfers in its colour, the exposed part as a red bar
under the row; and, beside them, the loss curves against one device. ``describe(results)``
prints the figures and writes the picture (``PICTURE``, plotly HTML) next to the traces. Lesson
14 draws the same picture from its own runs (``capstone_lesson_ranks``), with the rank
functions here (``train_losses``, ``traced_picture``).
"""
from __future__ import annotations

from pathlib import Path

from workbook.capstone.capstone_run import implementation
from workbook.capstone.capstone_figures import (KINDS, NAMES, WORLD_SIZE, figure, groups_of,
                                               hidden_rows, loss_gap, sent_by_group, step_spans)

LINK = "dgx-h100"
PICTURE = "capstone_step.html"


# --------------------------------------------------------------------------- on a rank
def train_losses(kind: str, setup=None, steps: int | None = None, impl: str | None = None) -> dict:
    """On every rank: ``capstone_run.train_steps`` with no link model (the run's numbers do not
    depend on time), the link given back afterwards."""
    from workbook import link
    from workbook.capstone.capstone_run import train_steps
    from workbook.capstone.capstone_train import TrainSetup
    setup = setup or TrainSetup()
    saved = link.current_link()
    link.set_link(None)
    try:
        with implementation(impl):
            return train_steps(kind, setup, steps or setup.steps)
    finally:
        link.set_link(saved)


def traced_picture(trace_dir: str, kind: str, setup=None, impl: str | None = None) -> dict:
    """On every rank: ``capstone_run.traced_step`` of ``kind`` into ``trace_dir`` (default setup
    ``TrainSetup.for_overlap``), with this rank's ``step_spans`` added as ``"spans"``."""
    from workbook.capstone.capstone_run import traced_step
    from workbook.capstone.capstone_train import TrainSetup
    with implementation(impl):
        out = traced_step(str(trace_dir), kind, setup or TrainSetup.for_overlap())
    path = Path(trace_dir) / f"rank{out['rank']}.trace.json"
    if "ops" in out and path.is_file():
        out["spans"] = step_spans(path, groups_of(kind))
    out["trace_dir"] = str(trace_dir)
    return out


def _raise_unless_done(res: dict, what: str) -> None:
    """A rank's result that holds no figures: "not implemented yet" for a stub, the rank's own
    error otherwise (never a real error shown as a stub's)."""
    if "not_implemented" in res:
        raise NotImplementedError(f"capstone: {what} yet ({res['not_implemented']})")
    if "error" in res:
        raise RuntimeError(f"capstone: {what}: {res['error']}")


def run(trace_dir=None, impl=None, options=None) -> dict:
    """On every rank: the loss of every step of both configurations, one device's on rank 0,
    and one traced step of each (module docstring); ``options``: ``{"steps", "setup",
    "traced_setup"}`` to shrink the run."""
    import torch.distributed as dist

    from workbook import link
    from workbook.capstone.capstone_train import TrainSetup, train_single_device
    from workbook.grading.model_checks import rank_error
    from workbook.measure.calibration import recalibrate
    from workbook.measure.profiled_step import trace_folder
    o = {"steps": None, "setup": None, "traced_setup": None, **(options or {})}
    setup = o["setup"] or TrainSetup()
    rank, preset = dist.get_rank(), link.current_link() and link.current_link().preset
    out = {"rank": rank, "training": {}, "traced": {}, "traffic": {},
           "steps": o["steps"] or setup.steps}
    from workbook.capstone.capstone_run import check_run
    for kind in KINDS:                        # the mesh's rules, in one line, before any step
        check_run(kind, setup, dist.get_world_size())
    with implementation(impl):
        for kind in KINDS:
            out["training"][kind] = train_losses(kind, setup, o["steps"])
            _raise_unless_done(out["training"][kind], f"{NAMES[kind]} does not train")
        if rank == 0:
            try:
                out["single"] = train_single_device(setup, out["steps"])["losses"]
            except Exception as exc:                  # noqa: BLE001 - a figure, not a check
                out["single"] = rank_error(exc)
        if preset:
            recalibrate(preset)               # traced_step reads the link it is given
        with trace_folder(trace_dir, "capstone") as root:
            for kind in KINDS:
                res = out["traced"][kind] = traced_picture(str(Path(root) / kind), kind,
                                                           o["traced_setup"])
                _raise_unless_done(res, f"the traced {NAMES[kind]} step failed")
                out["traffic"][kind] = traffic_rows(res, kind, o["traced_setup"])
    return out


# --------------------------------------------------------------------------- the lines
def traffic_rows(res: dict, kind: str, setup=None, predict=None) -> list[tuple]:
    """``(name, predicted, model, measured)`` in MB per group for rank ``res["rank"]``:
    ``predict`` (default: the lab's ``predict_traffic``; one that raises gives None), the
    package's model (``capstone_traffic.traffic_model``) and the trace."""
    from workbook.capstone.capstone_train import TrainSetup
    from workbook.capstone.capstone_traffic import traffic_model
    setup = setup or TrainSetup.for_overlap()
    inner, dp, at = 2, WORLD_SIZE // 2, res["rank"] % 2
    args = (kind, setup.cfg, setup.batch, inner, dp, setup.micro_batches, res["param_bytes"], at)
    model, _ = traffic_model(*args)
    if predict is None:
        from workbook.grading.labs import load_lab

        def predict(*a):
            return load_lab("capstone").predict_traffic(*a)
    try:
        predicted = dict(predict(*args))
    except Exception:                                 # noqa: BLE001 - a stub shows as "-"
        predicted = {}
    sent = sent_by_group(res, kind)
    mb = lambda x: None if x is None else float(x) / 1e6              # noqa: E731
    return [(f"{NAMES[kind]}, rank {res['rank']}: {g} MB sent", mb(predicted.get(g)),
             mb(model[g]), mb(sent[g])) for g in model]


def describe(results: list[dict]) -> str:
    """The figures as text (module docstring); the picture written to ``PICTURE`` beside the
    traces, when they were kept."""
    from workbook.grading.predictions import comparison_lines
    from workbook.measure.output import where_measured
    first = results[0]
    gaps = loss_gap(results)
    link = next((first["traced"][k].get("link") for k in KINDS
                 if first["traced"].get(k, {}).get("link")), None)
    lines = [f"  capstone figures: 4 ranks as a 2 x 2 mesh; {first['steps']} training steps of "
             f"each configuration (no link), one traced step each ({where_measured(link)})"]
    for kind in KINDS:
        losses = first["training"][kind].get("losses", [])
        gap = gaps[kind]
        lines.append(f"  {NAMES[kind]}: loss {losses[0]:.4f} -> {losses[-1]:.4f}; against one "
                     f"device " + ("-" if gap is None else f"at most {gap:.1e} apart"))
    lines.append(f"  {'step':<10}{'group':>6}{'link ms':>10}{'exposed':>10}{'hidden':>8}"
                 "   (ranks added; skew excused)")
    for kind in KINDS:
        for row in hidden_rows([r["traced"][kind] for r in results], kind):
            pct = "-" if row["pct"] is None else f"{row['pct']:.0f}%"
            lines.append(f"  {NAMES[kind]:<10}{row['group']:>6}{row['comm_ms']:>10.0f}"
                         f"{row['exposed_ms']:>10.0f}{pct:>8}")
    rows = [tuple(row) for kind in KINDS for row in first.get("traffic", {}).get(kind, [])]
    lines.append("  the bytes each group sent in one step (predict_traffic, the model, the trace):")
    lines += comparison_lines(rows, unit="MB")
    folder = _trace_root(first)
    if folder is not None:
        path = Path(folder) / PICTURE
        figure(results).write_html(path)
        lines.append(f"  the picture of a whole step: {path}")
    return "\n".join(lines)


def _trace_root(res: dict):
    """The folder the traced steps went under (None: a temporary one, gone now)."""
    paths = [r.get("trace_dir") for r in res["traced"].values() if isinstance(r, dict)]
    for p in paths:
        if p and Path(p).parent.is_dir():
            return Path(p).parent
    return None
