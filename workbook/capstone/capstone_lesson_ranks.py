"""Lesson 14's runs on ranks and what it prints and draws of them: ``as_world`` on 4 ranks (what
a ``group=None`` call and a ``group=dp`` call do inside ``Mesh.as_world``, and the given model's
parameters as a TP rank holds them), both configurations' 20 steps against one device, one
traced step of each on the simulated link, and their tables: the traffic (your prediction, the
model, your trace), what the link carried, the hidden share per group, and the one picture of a
step (``capstone_figures.figure``).

Rank functions (``workbook.lessons.on_ranks`` on 4 ranks): ``as_world_demo``, ``train_both``
and ``trace_both``, each of the last two from an implementation (``labs`` or ``solutions``).
"""
from __future__ import annotations

from workbook.capstone.capstone_figures import KINDS, NAMES

INNER, DP = 2, 2


def as_world_demo() -> dict:
    """On 4 ranks: inside ``as_world`` of this rank's TP group, what ``get_rank``,
    ``get_world_size`` and an ``all_reduce`` of the global rank with no ``group=`` see, and the
    same all-reduce naming the DP group."""
    import torch
    import torch.distributed as dist

    from workbook.capstone.mesh import Mesh
    rows = [list(range(d * INNER, (d + 1) * INNER)) for d in range(DP)]
    cols = [list(range(i, INNER * DP, INNER)) for i in range(INNER)]
    mesh = Mesh.build("tp", INNER, DP, rows, cols)
    rank = dist.get_rank()
    with mesh.as_world(mesh.inner_group):
        seen = (dist.get_rank(), dist.get_world_size())
        plain, named = torch.tensor([float(rank)]), torch.tensor([float(rank)])
        dist.all_reduce(plain)                            # no group: the TP group, as the world
        dist.all_reduce(named, group=mesh.dp_group)       # named: the DP group
        params = model_parameters() if rank == 0 else None
    return {"rank": rank, "seen": seen, "plain": float(plain), "named": float(named),
            "tp": mesh.inner_ranks, "dp": mesh.dp_ranks, "params": params}


def model_parameters() -> list:
    """Inside a TP group seen as the world: the capstone's given ``SPLanguageModel`` (lesson
    14's setup, the package's plain block), each parameter's name, this rank's shape and
    whether it carries the ``sequence_parallel`` tag."""
    from workbook.capstone.capstone_model import SPLanguageModel
    from workbook.capstone.capstone_standins import plain_sp_block
    from workbook.capstone.capstone_train import TrainSetup
    model = SPLanguageModel(TrainSetup().cfg, plain_sp_block)
    return [(name, list(p.shape), bool(getattr(p, "sequence_parallel", False)))
            for name, p in model.named_parameters()]


def parameter_table(params: list) -> None:
    """The model's parameters on TP rank 0: shape and tag (given by the package)."""
    print(f"{'parameter (TP rank 0 of 2)':<30}{'shape here':>12}  tagged sequence_parallel")
    for name, shape, tagged in params:
        if name.startswith("blocks.") and not name.startswith("blocks.0."):
            continue                                   # every block as block 0
        print(f"{name:<30}{str(shape):>12}  {'yes' if tagged else ''}")
    print("(blocks.1, ... as blocks.0)")


def as_world_table(results: list[dict]) -> None:
    print(f"{'rank':>5}{'TP group':>10}{'DP group':>10}{'get_rank()':>12}"
          f"{'get_world_size()':>18}{'all_reduce(r)':>15}{'…, group=dp':>13}")
    for r in results:
        print(f"{r['rank']:>5}{str(r['tp']):>10}{str(r['dp']):>10}{r['seen'][0]:>12}"
              f"{r['seen'][1]:>18}{r['plain']:>15.0f}{r['named']:>13.0f}")


def train_both(impl: str, steps: int | None = None) -> dict:
    """On every rank: both configurations' ``train_steps`` from ``impl`` (no link); rank 0
    then trains the single-device run too (``"single"``: its losses), on a process that has
    already paid for Adam's first step."""
    import torch.distributed as dist

    from workbook.capstone.capstone_report import train_losses
    from workbook.capstone.capstone_train import TrainSetup, train_single_device
    out = {kind: train_losses(kind, None, steps, impl) for kind in KINDS}
    if dist.get_rank() == 0:
        out["single"] = train_single_device(TrainSetup(), steps)["losses"]
    return out


def trace_both(trace_dir: str, impl: str, setup=None) -> dict:
    """On every rank: one traced step of each configuration (``traced_picture``) from
    ``impl``, on the link the ranks were given; with rank 0's bytes per group."""
    from pathlib import Path

    from workbook.capstone.capstone_figures import sent_by_group
    from workbook.capstone.capstone_report import implementation, traced_picture
    out = {}
    for kind in KINDS:
        out[kind] = traced_picture(str(Path(trace_dir) / kind), kind, setup, impl)
        if "ops" in out[kind]:
            with implementation(impl):
                out[kind]["sent"] = sent_by_group(out[kind], kind)
    return out


def failed(per_rank: list[dict]) -> str | None:
    """The first rank's error of a run (``rank_error``'s dict), as one line; None: it ran."""
    for r in per_rank:
        if "error" in r or "not_implemented" in r:
            return f"rank {r['rank']}: " + str(r.get("error") or r.get("not_implemented"))
    return None


def loss_table(trained: list[dict], single: list[float]) -> None:
    """Per configuration: first and last loss, and the largest gap to one device's."""
    for kind in KINDS:
        why = failed([r[kind] for r in trained])
        if why:
            print(f"{NAMES[kind]}: did not train: {why}")
            continue
        gap = max(abs(a - b) for r in trained for a, b in zip(r[kind]["losses"], single))
        losses = trained[0][kind]["losses"]
        notes = trained[0][kind].get("notes") or []
        print(f"{NAMES[kind]}: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} steps; "
              f"at most {gap:.1e} from one device's" + "".join(f"\n  note: {n}" for n in notes))


def assemble(trained: list[dict] | None, single, traced: list[dict] | None) -> list[dict]:
    """The lesson's runs in the shape ``capstone_report.figure`` draws."""
    n = len(trained or traced)
    return [{"rank": r, "training": trained[r] if trained else {},
             "traced": traced[r] if traced else {}, "single": single if r == 0 else None,
             "steps": len(single or [])} for r in range(n)]


def loss_figure(trained: list[dict], single: list[float]):
    """The loss curves alone: one device, TP x DP and PP x DP."""
    import plotly.graph_objects as go

    from workbook.capstone.capstone_figures import loss_traces
    fig = go.Figure(loss_traces(assemble(trained, single, None)))
    fig.update_layout(title="the loss of every step: 4 ranks against one device", height=360,
                      xaxis_title="step", yaxis_title="loss (nats)", plot_bgcolor="white")
    return fig


def prediction_before(predict, setup) -> None:
    """The traced step's shapes, and what your ``predict_traffic`` says of rank 0's TP and PP
    bytes before anything runs (the DP bytes need the rank's parameter bytes: the trace's)."""
    cfg = setup.cfg
    print(f"the traced step: L={cfg.n_layers}, H={cfg.hidden}, S={cfg.seq_len}, "
          f"B={setup.batch}, inner n=2, dp=2, m={setup.micro_batches} micro-batches, "
          f"{cfg.dtype} ({cfg.torch_dtype.itemsize} bytes)")
    for kind, group in (("tp", "TP"), ("pp", "PP")):
        args = (kind, cfg, setup.batch, INNER, DP, setup.micro_batches, 0, 0)
        try:
            got = dict(predict(*args))[group]
        except NotImplementedError:
            print("your predict_traffic: not written yet (task 9); write your figures down "
                  "before you run the next cell")
            return
        except Exception as exc:                      # noqa: BLE001 - shown, not raised
            print(f"your predict_traffic raised {type(exc).__name__}: {exc}")
            return
        print(f"  your predict_traffic, {NAMES[kind]}, rank 0: {group} {got / 1e6:.2f} MB "
              f"(DP: 2 (dp - 1) / dp of the rank's parameter bytes, known after the run)")


def traffic_table(traced: list[dict], predict, setup) -> None:
    """Per configuration, rank 0: your ``predict_traffic``, the model, your trace (MB); then,
    where your prediction is off, what the known wrong derivations would have given."""
    from workbook.capstone.capstone_traffic import traffic_model
    from workbook.grading.predictions import comparison_lines, judge_prediction
    rows, words = [], []
    for kind in KINDS:
        res = traced[0][kind]
        if "sent" not in res:
            print(f"{NAMES[kind]}: no trace ({failed([res])})")
            continue
        args = (kind, setup.cfg, setup.batch, INNER, DP, setup.micro_batches,
                res["param_bytes"], 0)
        model, mistakes = traffic_model(*args)
        try:
            got = dict(predict(*args))
        except Exception as exc:                      # noqa: BLE001 - not written yet
            got, why = {}, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            words.append(f"{NAMES[kind]}: your predict_traffic: {why}")
        for group, want in model.items():
            rows.append((f"{NAMES[kind]} {group}", got.get(group) and got[group] / 1e6,
                         want / 1e6, res["sent"][group] / 1e6))
            if group in got:
                verdict = judge_prediction(got[group], want, mistakes.get(group, {}),
                                           what=f"{NAMES[kind]}'s {group} bytes", unit="bytes")
                if verdict:
                    words.append(f"{NAMES[kind]} {group}: {verdict}")
    print("the bytes rank 0 sends in one step, per group (MB):")
    print("\n".join(comparison_lines(rows, unit="MB")))
    for w in words:
        print(w)


def picture(results: list[dict]):
    """The picture of a whole step (``capstone_report.figure``) from the lesson's runs."""
    from workbook.capstone.capstone_figures import figure
    link = next((r.get("link") for r in results[0]["traced"].values() if r.get("link")), "")
    return figure(results, title="One step of each configuration, 4 ranks as a 2 × 2 mesh — "
                  + link.replace("simulated", "SIMULATED", 1))


def ops_table(traced: list[dict]) -> None:
    """What rank 0's link carried in each configuration's traced step: per group and operation,
    how many and their bus bytes (MB; the scalars' all-reduces among them)."""
    from workbook.capstone.capstone_figures import groups_of
    for kind in KINDS:
        res = traced[0][kind]
        if "ops" not in res:
            continue
        group_of, counts = groups_of(kind), {}
        for op in res["ops"]:
            key = (group_of(op["ranks"]), op["op"], op["bytes"])
            n, bus = counts.get(key, (0, 0.0))
            counts[key] = (n + 1, bus + op["bus"])
        print(f"{NAMES[kind]}, rank 0: {'group':>6}{'operation':>16}{'bytes each':>12}"
              f"{'count':>7}{'bus MB':>9}")
        for (group, op, size), (n, bus) in sorted(counts.items()):
            print(f"{'':<18}{group:>6}{op:>16}{size:>12,}{n:>7}{bus / 1e6:>9.2f}")


def hidden_table(traced: list[dict]) -> None:
    """Per configuration and group: link ms and exposed ms (ranks added) and the share hidden,
    as the grader reads them."""
    from workbook.capstone.capstone_figures import hidden_rows
    print(f"{'step':<10}{'group':>6}{'link ms':>10}{'exposed':>10}{'hidden':>8}")
    for kind in KINDS:
        for row in hidden_rows([r[kind] for r in traced], kind):
            pct = "-" if row["pct"] is None else f"{row['pct']:.0f}%"
            print(f"{NAMES[kind]:<10}{row['group']:>6}{row['comm_ms']:>10.0f}"
                  f"{row['exposed_ms']:>10.0f}{pct:>8}")
