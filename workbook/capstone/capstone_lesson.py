"""Lesson 14's measuring and drawing: the mesh, the text, clipping on paper, ``as_world`` on
ranks, the training runs against one device, the traced steps, the prediction's table and the
one picture of a step (``capstone_report``'s, from the lesson's own runs).

Rank functions (``workbook.lessons.on_ranks`` on 4 ranks): ``as_world_demo`` (what a
``group=None`` call and a ``group=dp`` call do inside ``Mesh.as_world``), ``train_both`` (both
configurations' losses, no link) and ``trace_both`` (one traced step of each, on the simulated
link), each from an implementation (``labs`` or ``solutions``).
"""
from __future__ import annotations

import math

from workbook.capstone.capstone_report import KINDS, NAMES

INNER, DP = 2, 2


# --------------------------------------------------------------------------- 1. the mesh
def mesh_grid(world: int, inner: int) -> None:
    """The ranks of an ``inner x (world / inner)`` mesh as a grid: a row per DP replica (its
    inner group), a column per inner position (its DP group), by ``rank = dp_rank * inner +
    inner_rank`` (the mesh's layout, ``workbook/capstone/mesh.py``)."""
    dp = world // inner
    print(" " * 14 + "".join(f"inner {i:<4}" for i in range(inner)))
    for d in range(dp):
        print(f"  replica {d:<4}" + "".join(f"rank {d * inner + i:<5}" for i in range(inner)))
    print("  (a row: an inner group, TP or PP; a column: a DP group)")


def check_mesh(mesh_ranks, world: int, inner: int, dp: int) -> None:
    """Your ``mesh_ranks`` on one mesh, beside the grid's rows and columns."""
    rows = [[d * inner + i for i in range(inner)] for d in range(dp)]
    cols = [[d * inner + i for d in range(dp)] for i in range(inner)]
    try:
        got = mesh_ranks(world, inner, dp)
    except NotImplementedError:
        print("your mesh_ranks: not written yet (task 1)")
        return
    except Exception as exc:                          # noqa: BLE001 - shown, not raised
        print(f"your mesh_ranks raised {type(exc).__name__}: {exc}")
        return
    verdict = "as the grid" if [list(g) for g in got[0]] == rows and \
        [list(g) for g in got[1]] == cols else f"the grid says {rows}, {cols}"
    print(f"your mesh_ranks({world}, {inner}, {dp}) = {got}: {verdict}")


def link_times(hidden: int = 4096, seq: int = 8192, layers: int = 32, params_b: float = 8.0,
               tp: int = 8) -> None:
    """Why TP is innermost: one step's bus bytes a rank sends in its TP group and in its DP
    group (``capstone_traffic.traffic_model``, bf16, one sequence a replica), and their time on
    a DGX-H100's NVLink and on its network card per GPU (``workbook.link.presets``)."""
    from workbook.capstone.capstone_traffic import traffic_model
    from workbook.link.presets import PRESETS
    from workbook.model import ModelConfig
    cfg = ModelConfig(vocab_size=256, hidden=hidden, heads=32, ffn_hidden=4 * hidden,
                      n_layers=layers, seq_len=seq, dtype="float32")
    param_bytes = int(params_b * 1e9 / tp * 2)                  # bf16, this TP rank's share
    model, _ = traffic_model("tp", cfg, 8, tp, 8, 1, param_bytes)
    model["TP"] /= 2                                            # the model counted fp32 shards
    preset = PRESETS["dgx-h100"]
    nvlink, nic = preset.bandwidth_GBps * 1e9, preset.nic_GBps * 1e9         # bytes/s
    print(f"one step, {layers} layers of hidden {hidden}, {seq} tokens a replica, bf16, TP {tp}:")
    for group in ("TP", "DP"):
        b = model[group]
        print(f"  {group}: {b / 1e9:6.1f} GB a rank sends -> {b / nvlink * 1e3:7.1f} ms on NVLink "
              f"({preset.bandwidth_GBps:.0f} GB/s), {b / nic * 1e3:8.1f} ms on the network "
              f"({preset.nic_GBps:.0f} GB/s)")


# --------------------------------------------------------------------------- 2. the text
def text_demo(n_chars: int = 160) -> tuple:
    """The corpus's first characters, their tokens, and a character beyond ASCII as bytes."""
    from workbook.capstone.text_data import ByteTokenizer, load_corpus
    text, tok = load_corpus(), ByteTokenizer()
    print(f"the corpus: {len(text):,} characters; the first {n_chars}:\n")
    print(text[:n_chars])
    ids = tok.encode(text[:24])
    print(f"\ntokens of {text[:24]!r}:\n  {ids.tolist()}")
    for ch in ("é", "—"):
        print(f"  {ch!r} is {len(tok.encode(ch))} tokens: {tok.encode(ch).tolist()}")
    return text, tok


def batch_rows(tokens, tok, rows: int = 4, width: int = 40) -> None:
    """The first ``width`` bytes of the first ``rows`` rows of a batch, as text."""
    for r in range(min(rows, tokens.shape[0])):
        print(f"  row {r}: {tok.decode(tokens[r, :width])!r}")


# --------------------------------------------------------------------------- 3. clipping
def clip_on_paper(seed: int = 0) -> None:
    """One process, no ranks: a gradient of a column-split linear (``[4, 3]``, two TP shards of
    two rows) and of a LayerNorm weight (``[3]``, replicated on both TP ranks). The norm of the
    whole model's gradient, beside three wrong ways a mesh could compute it."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    w, ln = torch.randn(4, 3, generator=gen), torch.randn(3, generator=gen)
    shards = w.chunk(INNER)                                       # TP rank r holds rows of w
    whole = math.sqrt(float((w ** 2).sum() + (ln ** 2).sum()))
    per_rank = [math.sqrt(float((s ** 2).sum() + (ln ** 2).sum())) for s in shards]
    twice = math.sqrt(float(sum((s ** 2).sum() + (ln ** 2).sum() for s in shards)))
    rows = [("one device: the whole gradient", whole),
            ("each TP rank its own squares, no sum", per_rank),
            ("every square summed over the TP group (the LayerNorm twice)", twice)]
    for name, value in rows:
        shown = ", ".join(f"{v:.4f}" for v in value) if isinstance(value, list) else \
            f"{value:.4f}"
        print(f"  {name:<62} {shown}")


def lr_figure(lr_at, setup):
    """The reference schedule (``capstone_train.reference_lr``) and yours, where it runs."""
    import plotly.graph_objects as go

    from workbook.capstone.capstone_train import reference_lr
    steps = list(range(setup.steps + 2))
    fig = go.Figure(go.Scatter(x=steps, y=[reference_lr(s, setup) for s in steps],
                               name="the reference", line=dict(color="#555", width=6),
                               opacity=0.4))
    try:
        fig.add_trace(go.Scatter(x=steps, y=[lr_at(s, setup) for s in steps], mode="markers",
                                 name="your lr_at", marker=dict(size=8)))
    except Exception as exc:                          # noqa: BLE001 - not written yet
        print(f"your lr_at: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    fig.update_layout(title="the learning rate of each step", xaxis_title="step",
                      yaxis_title="lr", height=320, plot_bgcolor="white")
    return fig


# --------------------------------------------------------------------------- 4. as_world
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


# --------------------------------------------------------------------------- 6-9. the runs
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

    from workbook.capstone.capstone_report import implementation, sent_by_group, traced_picture
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

    from workbook.capstone.capstone_report import loss_traces
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
    from workbook.capstone.capstone_report import figure
    link = next((r.get("link") for r in results[0]["traced"].values() if r.get("link")), "")
    return figure(results, title="One step of each configuration, 4 ranks as a 2 × 2 mesh — "
                  + link.replace("simulated", "SIMULATED", 1))


def ops_table(traced: list[dict]) -> None:
    """What rank 0's link carried in each configuration's traced step: per group and operation,
    how many and their bus bytes (MB; the scalars' all-reduces among them)."""
    from workbook.capstone.capstone_report import groups_of
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
    from workbook.capstone.capstone_report import hidden_rows
    print(f"{'step':<10}{'group':>6}{'link ms':>10}{'exposed':>10}{'hidden':>8}")
    for kind in KINDS:
        for row in hidden_rows([r[kind] for r in traced], kind):
            pct = "-" if row["pct"] is None else f"{row['pct']:.0f}%"
            print(f"{NAMES[kind]:<10}{row['group']:>6}{row['comm_ms']:>10.0f}"
                  f"{row['exposed_ms']:>10.0f}{pct:>8}")


# --------------------------------------------------------------------------- 10. plan
def plan(*options: str) -> None:
    """``workbook plan OPTIONS`` from a cell (``plan_cli``, the command's own code): what it
    prints (whether the split fits in memory is its last line; a broken rule, one line)."""
    import argparse

    from workbook.capstone.plan_cli import add_arguments, run
    parser = argparse.ArgumentParser(prog="workbook plan")
    add_arguments(parser)
    try:
        run(parser.parse_args(list(options)))
    except ValueError as exc:
        print(f"workbook plan: {exc}")


#: the options every row of docs/plan-llama3.md shares (Llama 3 405B on H100s)
LLAMA3 = ("--model", "llama3-405b", "--peak-tflops", "989", "--tp", "8", "--pp", "16",
          "--virtual-stages", "4", "--global-batch-tokens", "16M", "--embedding-as-layer",
          "--loss-as-layer", "--recompute", "selective")


def plan_rows(rows: dict, efficiency: float) -> None:
    """One line per ``{name: extra workbook plan options}`` at ``efficiency``: the step, its
    bubble and exposed communication, TFLOP/s per GPU and MFU (``plan.predict``)."""
    import argparse

    from workbook.capstone.plan import bubble_fraction, predict
    from workbook.capstone.plan_cli import add_arguments, build
    from workbook.capstone.plan_shapes import micro_batches, resolve
    parser = argparse.ArgumentParser(prog="workbook plan")
    add_arguments(parser)
    print(f"{'':<28}{'m':>4}{'bubble':>8}{'step s':>8}{'exposed s (tp pp dp)':>24}"
          f"{'TFLOP/s':>9}{'MFU':>6}")
    for name, extra in rows.items():
        args = parser.parse_args([*LLAMA3, "--efficiency", str(efficiency), *extra])
        model, cluster, split = build(args)
        p = predict(model, cluster, split)
        s = resolve(model, cluster, split)
        m = micro_batches(s)
        exposed = " ".join(f"{p.parts[k]:.2f}" for k in ("tp", "pp", "dp"))
        print(f"{name:<28}{m:>4}{bubble_fraction(s.pp, m, s.virtual):>8.1%}{p.step_s:>8.2f}"
              f"{exposed:>24}{p.tflops:>9.0f}{p.mfu:>6.0%}")


def plan_explorer(efficiency: float = 0.627):
    """Llama 3 405B on H100s (``LLAMA3``, 8 192-token sequences) under dropdowns: the GPUs, the
    virtual stages, the recomputation and the overlaps; the step's parts as one stacked bar
    (``plan.predict``), TFLOP/s per GPU and memory printed above it."""
    import argparse

    import ipywidgets as W
    import plotly.graph_objects as go

    from workbook.capstone.plan import predict
    from workbook.capstone.plan_cli import add_arguments, build
    from workbook.measure.lesson_figures import live_figure
    from workbook.trace import colors
    parser = argparse.ArgumentParser(prog="workbook plan")
    add_arguments(parser)
    controls = {
        "nodes": W.Dropdown(options=[("4,096 GPUs", 512), ("8,192 GPUs", 1024),
                                     ("16,384 GPUs", 2048)], value=1024, description="GPUs"),
        "virtual": W.Dropdown(options=[1, 2, 4, 8], value=4, description="v"),
        "recompute": W.Dropdown(options=["selective", "full"], value="selective",
                                description="recompute"),
        "overlap": W.Dropdown(options=[("every overlap", "tp,pp,dp"), ("TP's off", "pp,dp"),
                                       ("PP's off", "tp,dp"), ("DP's off", "tp,pp"),
                                       ("none", "none")], value="tp,pp,dp",
                              description="overlaps")}
    tint = {"compute": colors.COMPUTE, "bubble": colors.IDLE, "tp": colors.COMMUNICATION,
            "pp": colors.MEMCPY, "dp": "#56B4E9"}

    def draw(nodes, virtual, recompute, overlap):
        options = [*LLAMA3, "--seq", "8192", "--nodes", str(nodes), "--efficiency",
                   str(efficiency), "--overlap", overlap, "--virtual-stages", str(virtual),
                   "--recompute", recompute]                     # the last of each wins
        try:
            p = predict(*build(parser.parse_args(options)))
        except ValueError as exc:
            print(f"workbook plan: {exc}")
            return None
        print(f"{p.split.describe()}: step {p.step_s:.2f} s, {p.tflops:.0f} TFLOP/s per GPU, "
              f"MFU {p.mfu:.0%}; memory per GPU {p.memory.verdict()}")
        fig = go.Figure([go.Bar(y=["step"], x=[p.parts[k]], name=k if k in ("compute", "bubble")
                                else f"{k} exposed", orientation="h", marker_color=tint[k])
                         for k in ("compute", "bubble", "tp", "pp", "dp") if k in p.parts])
        fig.update_layout(barmode="stack", height=220, xaxis_title="seconds of one step",
                          plot_bgcolor="white", margin=dict(l=10, r=10, t=30, b=40),
                          title="Llama 3 405B, 8 192-token sequences, 16M tokens a step")
        return fig
    return live_figure(draw, controls, [["nodes", "virtual"], ["recompute", "overlap"]])
