"""Lesson 14 on paper: the mesh's layout and why TP is innermost, the text and its tokens,
clipping on a mesh, the learning-rate schedule, and ``workbook plan`` on Llama 3 405B (its
command, a table of variants, and an explorer). The runs on ranks are in
``capstone_lesson_ranks``.
"""
from __future__ import annotations

import math

INNER = 2                          # the TP group on paper


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
