"""The capstone's runs on ranks, for the grader, lesson 14, the report and ``workbook bench
capstone``: build the mesh from the lab's ``mesh_ranks``, train N steps of a configuration, or
profile one step of it on the simulated link.

Rank functions (run them through ``workbook.grading.engine.on_ranks`` or
``workbook.runtime.launch.run`` on ``inner x dp`` ranks):

* ``train_steps(kind, setup, steps)``: every step's loss and global gradient norm on this rank,
  with what the rank saw of its mesh (its groups, its DP shard's rows, its stage's blocks) and
  which pieces were the learner's own;
* ``traced_step(trace_dir, kind, setup)``: one small warm-up step (no link, the fewest rows),
  then one step in the profiler
  (``workbook.trace.capture.rank_trace``): this rank's link operations with their global ranks
  and bus bytes (``capstone_traffic``), and the share of each group's link time hidden behind
  compute (``capstone_traffic.hidden_by_group``).

``make_trainer(lab, kind, setup, mesh, pieces)`` is the one place a configuration's trainer is
picked. The lab is the implementation under test (``load_lab("capstone")``).

From the notebook, the report or a bench (the main process): ``check_run`` (the one-line errors
of a mesh or a setup that does not fit, before any rank starts; a command turns them into exit
2), ``run_training`` (per-step losses of every rank) and ``run_traced`` (one traced step), each on
the warm rank pool of ``workbook.runtime.launch.run``.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

INNER, DP = 2, 2                  # the capstone's 2 x 2 mesh
LAB = "capstone"
PIECES = {"tp": ("tp_block", "make_buckets"), "pp": ("schedule", "executor", "make_buckets")}


def build_mesh(lab, kind: str, inner: int = INNER, dp: int = DP):
    """This rank's ``Mesh`` of ``kind`` from the lab's ``mesh_ranks`` (every rank calls it)."""
    import torch.distributed as dist

    from workbook.capstone.mesh import Mesh
    inner_groups, dp_groups = lab.mesh_ranks(dist.get_world_size(), inner, dp)
    return Mesh.build(kind, inner, dp, inner_groups, dp_groups)


def make_trainer(lab, kind: str, setup, mesh, pieces: dict):
    """The lab's ``TPxDPTrainer`` (``kind == "tp"``) or ``PPxDPTrainer`` (``"pp"``)."""
    return (lab.TPxDPTrainer if kind == "tp" else lab.PPxDPTrainer)(setup, mesh, pieces)


def _seen(lab, mesh, kind: str, setup, batches) -> dict:
    """What this rank saw of its place: groups, DP shard rows (the first step's), stage."""
    tokens = batches[0][0]
    shard = lab.dp_shard(tokens, mesh.dp_rank, mesh.dp)
    rows = [next((i for i in range(tokens.shape[0]) if bool((tokens[i] == r).all())), -1)
            for r in shard]
    out = {"inner_ranks": mesh.inner_ranks, "dp_ranks": mesh.dp_ranks, "shard_rows": rows}
    if kind == "pp":
        out["blocks"] = [int(b) for b in lab.stage_blocks(setup.cfg.n_layers, mesh.inner,
                                                          mesh.inner_rank)]
    return out


def train_steps(kind: str, setup, steps: int) -> dict:
    """On every rank: ``steps`` training steps of ``kind``; ``{"rank", "losses", "norms",
    "seen", "notes"}`` or ``rank_error``'s dict when the lab raised."""
    import torch.distributed as dist

    from workbook.capstone.capstone_train import global_batches
    from workbook.capstone.pieces import load_pieces, own_pieces, stand_in_notes
    from workbook.grading.labs import load_lab
    from workbook.grading.model_checks import rank_error
    rank = dist.get_rank()
    try:
        lab = load_lab(LAB)
        pieces = load_pieces(*PIECES[kind])
        mesh = build_mesh(lab, kind)
        batches = global_batches(setup, steps)
        trainer = make_trainer(lab, kind, setup, mesh, pieces)
        losses, norms = [], []
        for step, (tokens, targets) in enumerate(batches):
            losses.append(float(trainer.step(tokens, targets, step)))
            norms.append(None if trainer.norm is None else float(trainer.norm))
        seen = _seen(lab, mesh, kind, setup, batches)
    except Exception as exc:                          # noqa: BLE001 - judged by the grader
        return {"rank": rank, **rank_error(exc)}
    return {"rank": rank, "losses": losses, "norms": norms, "seen": seen,
            "notes": stand_in_notes(pieces), "own": own_pieces(pieces)}


def traced_step(trace_dir: str, kind: str, setup) -> dict:
    """On every rank: a warm-up step, then one profiled step (module docstring); ``{"rank",
    "link", "ops": [(op, global ranks, bytes, bus bytes, issued in backward)], "hidden":
    {group: figures}, "param_bytes", "notes"}``."""
    import torch.distributed as dist

    from workbook import link
    from workbook.capstone.capstone_traffic import hidden_by_group, op_rows, rank_param_bytes
    from workbook.capstone.capstone_train import global_batches
    from workbook.capstone.pieces import load_pieces, stand_in_notes
    from workbook.grading.labs import load_lab
    from workbook.grading.model_checks import rank_error
    from workbook.measure.calibration import recalibrate
    from workbook.trace.capture import rank_trace
    rank = dist.get_rank()
    try:
        lab = load_lab(LAB)
        pieces = load_pieces(*PIECES[kind])
        mesh = build_mesh(lab, kind)
        (t0, y0), (t1, y1) = global_batches(setup, 2)
        trainer = make_trainer(lab, kind, setup, mesh, pieces)
        preset = link.current_link().preset if link.current_link() is not None else None
        link.set_link(None)                       # the warm-up step pays no modelled transfer
        rows = mesh.dp * setup.micro_batches      # and runs the fewest rows every path takes
        trainer.step(t0[:rows], y0[:rows], 0)
        if preset is not None:
            recalibrate(preset)                   # the link in proportion to compute now
        dist.barrier()
        before = len(link.op_log())
        with rank_trace(trace_dir, lab=LAB):
            trainer.step(t1, y1, 1)
        records = [r for r in link.op_log()[before:] if r.op != "barrier"]
    except Exception as exc:                          # noqa: BLE001 - judged by the grader
        return {"rank": rank, **rank_error(exc)}
    path = os.path.join(trace_dir, f"rank{rank}.trace.json")
    modelled = link.current_link() is not None
    return {"rank": rank, "link": link.current_link().label if modelled else "none",
            "modelled": modelled, "ops": op_rows(records),
            "hidden": hidden_by_group(path, mesh) if modelled else {},
            "param_bytes": rank_param_bytes(kind, setup.cfg, mesh.inner, mesh.inner_rank),
            "notes": stand_in_notes(pieces)}


@contextmanager
def implementation(impl: str | None):
    """On a rank: load the lab (and the earlier labs it composes) from ``impl`` (``labs``,
    ``solutions`` or a folder; None: as it is) inside the block, the rank's choice restored
    after (a warm rank serves later runs too)."""
    from workbook.grading.labs import ENV_IMPL, use_impl
    saved = os.environ.get(ENV_IMPL)
    if impl is not None:
        use_impl(impl)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(ENV_IMPL, None)
        else:
            os.environ[ENV_IMPL] = saved


def _on_impl(impl: str | None, fn, *args, **kwargs):
    """On a rank: ``fn`` with the implementation ``impl`` loaded (a warm rank keeps the
    environment it started with, so the choice travels with the task, not the environment)."""
    with implementation(impl):
        return fn(*args, **kwargs)


def check_run(kind: str, setup, world_size: int = INNER * DP) -> None:
    """One-line ``ValueError`` unless ``kind`` x ``setup`` runs on the capstone's mesh of
    ``world_size`` ranks (the mesh's sizes, then the setup's: ``TrainSetup.check``)."""
    from workbook.capstone.mesh import check_mesh_sizes
    if not isinstance(world_size, int) or world_size < INNER or world_size % INNER:
        raise ValueError(f"mesh: {world_size} ranks do not split into inner groups of {INNER}: "
                         f"the world size must be a multiple of {INNER}")
    check_mesh_sizes(world_size, INNER, world_size // INNER)
    setup.check(kind, INNER, world_size // INNER)


def run_training(kind: str, setup=None, steps: int | None = None, impl: str | None = None,
                 timeout: float = 300.0) -> list[dict]:
    """``train_steps`` on the 2 x 2 mesh (``impl``: ``labs``, ``solutions`` or a folder; None:
    the current one); every rank's ``{"losses", "norms", ...}``."""
    from workbook.capstone.capstone_train import TrainSetup
    from workbook.runtime.launch import run
    setup = setup or TrainSetup()
    check_run(kind, setup)
    return run(_on_impl, INNER * DP, impl, train_steps, kind, setup, steps or setup.steps,
               timeout=timeout, pool=True)


def run_traced(kind: str, trace_dir: str, setup=None, link: str = "dgx-h100",
               impl: str | None = None, timeout: float = 300.0) -> list[dict]:
    """``traced_step`` on the 2 x 2 mesh over the simulated ``link`` (default setup:
    ``TrainSetup.for_overlap()``); the traces in ``trace_dir``, one file per rank."""
    from workbook.capstone.capstone_train import TrainSetup
    from workbook.runtime.launch import run
    setup = setup or TrainSetup.for_overlap()
    check_run(kind, setup)
    return run(_on_impl, INNER * DP, impl, traced_step, str(trace_dir), kind, setup, link=link,
               timeout=timeout, pool=True)
