"""Lesson 9's helpers (lab ``dp_overlap``): the training steps it measures on ranks, and the
figures and tables it draws from them, so that the notebook keeps the story and the experiments.

* ``check``: is the learner's lab usable yet (two steps of every variant against one device)?
* ``training_step``: on every rank, profiled steps of one trainer with their times: when the
  forward pass ends, when each layer's gradients are ready, when each layer asks for, gets and
  finishes with its weights (ZeRO-3), when the rank waits, and the link's log of the step;
* ``timeline`` (naive and bucketed DP), ``zero3_timeline``: rank 0's step drawn from them;
* ``bucket_sweep``, ``predict_exposed``, ``sweep_rows`` (printed with ``SWEEP_COLUMNS``),
  ``sweep_figure``: the bucket size against the alpha-beta model;
* ``condition_table``: the overlap condition, predicted and measured; ``traffic_table``: the
  bytes each variant moves; ``memory_run`` / ``memory_figure``: what a rank holds, against
  ``predicted_memory``; ``zero3_table``: ZeRO-3's per-layer gathers against the compute before;
* ``dp_exposed``, ``zero3_ratio``, ``real_scale_panel``: the same questions, modelled at the
  real machine's speed, with widgets.

The shared bars, verdicts and the link's log are ``workbook.measure.lesson_figures``.
"""
from __future__ import annotations

import numpy as np

from workbook import link, trace
from workbook.measure import lesson_figures as lf
from workbook.trace import colors

KINDS = {"parameters": colors.COMPUTE, "gradients": colors.COMMUNICATION,
         "optimizer": colors.MEMCPY}


def unit_names(n_layers: int) -> list[str]:
    """The names of ``layer_units(model)``, in order: the embedding, the blocks, norm, head."""
    return ["embed", *[f"block {i}" for i in range(n_layers)], "final norm", "head"]


# --------------------------------------------------------------------------- on the ranks
def check(impl) -> dict:
    """On every rank: two steps of every variant of the lab on a tiny fp64 model, against one
    device trained on the whole batch: ``{variant: "ok" | "WRONG: ..." | the error}``."""
    import torch

    from workbook.data_parallel import train_reference
    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig, make_batch, params_by_name
    cfg = ModelConfig(hidden=32, heads=2, ffn_hidden=64, n_layers=2, seq_len=8, vocab_size=64,
                      dtype="float64")
    batches = [make_batch(cfg, batch=4, seed=s) for s in (1, 2)]
    want = params_by_name(train_reference(cfg, batches))
    verdicts = {}
    for name, make in load_lab("dp_overlap", impl).VARIANTS.items():
        try:
            trainer = make(cfg)
            for step, (x, y) in enumerate(batches):
                trainer.train_step(x, y, step)
            got = (trainer.full_parameters() if hasattr(trainer, "full_parameters")
                   else params_by_name(trainer.model))
            bad = [k for k in want if not torch.allclose(got[k], want[k], rtol=1e-7, atol=1e-9)]
            verdicts[name] = (f"WRONG: {bad[0]} differs from one device after 2 steps"
                              if bad else "ok")
        except Exception as exc:                 # noqa: BLE001 - unfinished work is expected here
            verdicts[name] = lf.verdict_of(exc)
    return verdicts


def training_step(run_dir, impl, variant, model: dict, batch: int, bucket_bytes=None,
                  steps: int = 1) -> dict:
    """On every rank: recalibrate the link to this CPU's speed now, build the trainer
    (``BucketedDP`` with ``bucket_bytes`` if given), take a warm-up step, then ``steps`` steps,
    the first under the profiler into ``run_dir`` (None: no profiler). Hooks that change nothing
    note the times, in ms since the step began: ``marks`` (start, forward_end, backward_end,
    sync_end, optimizer_start, end), ``ready`` (each layer's last gradient accumulated), ``units``
    (``asked``/``runs``/``done`` of each layer's forward, before and after ZeRO's own hooks), and
    ``ops``, the link's log of the step. Also the buckets (``[(layer, bytes)]`` each), the
    calibrated FLOP rate and each layer's number of parameters."""
    from contextlib import nullcontext

    import torch.distributed as dist

    from workbook.grading.labs import load_lab
    from workbook.measure.calibration import recalibrate
    from workbook.model import ModelConfig, make_batch
    from workbook.trace.capture import rank_trace
    lab, cfg = load_lab("dp_overlap", impl), ModelConfig(**model)
    local_flops = recalibrate()                  # the link, scaled to this CPU's speed right now
    trainer = (lab.BucketedDP(cfg, bucket_bytes=bucket_bytes) if bucket_bytes
               else lab.VARIANTS[variant](cfg))
    tokens, targets = make_batch(cfg, batch=batch, seed=0)
    marks, ready, starts = {}, {}, {}
    unit_of = {id(p): i for i, u in enumerate(trainer.units) for p in u.parameters()}

    def note(table, key, first=True):            # a hook that returns None: it changes nothing
        def hook(*_):
            if not first or key not in table:
                table[key] = lf.ms_now()
        return hook

    for i, unit in enumerate(trainer.units):
        unit.register_forward_pre_hook(note(starts, f"asked{i}"), prepend=True)  # before ZeRO's
        unit.register_forward_pre_hook(note(starts, f"runs{i}"))                 # after ZeRO's
        unit.register_forward_hook(note(starts, f"done{i}"))
        for p in unit.parameters():                  # the last one to fire: the layer is done
            p.register_post_accumulate_grad_hook(note(ready, i, first=False))
    trainer.model.register_forward_hook(note(marks, "forward_end", first=False))
    sync, opt = trainer.finish_gradient_sync, trainer.optimizer_step

    def timed_sync():
        marks["backward_end"] = lf.ms_now()
        sync()
        marks["sync_end"] = lf.ms_now()

    def timed_opt():
        marks["optimizer_start"] = lf.ms_now()
        opt()

    trainer.finish_gradient_sync, trainer.optimizer_step = timed_sync, timed_opt
    trainer.train_step(tokens, targets, 0)                             # warm-up
    out = []
    for step in range(1, steps + 1):
        marks.clear(), ready.clear(), starts.clear()
        with rank_trace(run_dir, lab="lesson9") if run_dir and step == 1 else nullcontext():
            dist.barrier()                           # both ranks start the step together
            before, t0 = len(link.op_log()), lf.ms_now()
            marks["start"] = t0
            trainer.train_step(tokens, targets, step)
            marks["end"] = lf.ms_now()
        out.append({"marks": {k: v - t0 for k, v in marks.items()},
                    "ready": {i: v - t0 for i, v in ready.items()},
                    "units": {k: v - t0 for k, v in starts.items()},
                    "ops": lf.link_ops(before, t0)})
    buckets = [[(unit_of[id(p)], p.numel() * p.element_size()) for p in b.params]
               for b in getattr(trainer, "buckets", [])]
    return {"steps": out, "buckets": buckets, "local_flops": local_flops,
            "unit_numels": [sum(p.numel() for p in u.parameters()) for u in trainer.units]}


def bucket_sweep(impl, model: dict, batch: int, sizes) -> dict:
    """On every rank: ``training_step`` of ``BucketedDP`` for each bucket size, two measured steps
    each, no profiler: ``{bucket_bytes: result}``."""
    return {b: training_step(None, impl, "bucketed", model, batch, bucket_bytes=b, steps=2)
            for b in sizes}


def memory_run(model: dict, variants: dict) -> dict:
    """On every rank: the bytes it holds after one step of each variant (``{name: impl}``), by
    kind (``memory_by_kind``), and each layer's number of parameters."""
    from workbook.data_parallel import memory_by_kind
    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig, make_batch
    cfg = ModelConfig(**model)
    tokens, targets = make_batch(cfg, batch=4, seed=0, seq_len=16)
    out = {}
    for name, impl in variants.items():
        trainer = load_lab("dp_overlap", impl).VARIANTS[name](cfg)
        trainer.train_step(tokens, targets, 0)
        out[name] = {"measured": memory_by_kind(trainer),
                     "unit_numels": [sum(p.numel() for p in u.parameters()) for u in trainer.units]}
        del trainer
    return out


# --------------------------------------------------------------------------- naive and bucketed
def _phase_bars(fig, m: dict, row, y: str) -> None:
    """The step's phases on row ``y``: forward, backward, waiting in the sync (red), optimizer."""
    spans = [("forward", m["start"], m["forward_end"], "compute"),
             ("backward", m["forward_end"], m["backward_end"], "compute"),
             ("waiting", m["backward_end"], m["sync_end"], "exposed"),
             ("optimizer", m.get("optimizer_start", m["sync_end"]), m["end"], "other")]
    for name, a, b, kind in spans:
        wide = b - a > 0.07 * (m["end"] - m["start"])
        lf.add(fig, lf.span(a, b, y, colors.color(kind), f"{name}: {b - a:.0f} ms",
                            name if wide else ""), row)


def _ready_marks(ready: dict, gap: float, units):
    """Diamonds where layers' gradients became ready; layers closer than ``gap`` share a label."""
    import plotly.graph_objects as go
    groups = []
    for i, t in sorted(ready.items(), key=lambda kv: kv[1]):
        if groups and t - groups[-1][1] < gap:
            groups[-1][0].append(units[i])
        else:
            groups.append(([units[i]], t))
    return go.Scatter(x=[t for _, t in groups], y=["compute"] * len(groups), mode="markers+text",
                      text=[" + ".join(names) for names, _ in groups], textposition="top center",
                      marker=dict(symbol="diamond", size=9, color="black"), showlegend=False,
                      hovertemplate="gradients of %{text} ready at %{x:.0f} ms<extra></extra>")


def timeline(results: dict, title: str, units):
    """Rank 0's step of each trainer (``{subplot title: training_step's results}``): on the compute
    row the phases and a diamond where each layer's gradients were ready; on the link row each
    all-reduce, queued (dotted) then carried, red once the backward pass is over."""
    from plotly.subplots import make_subplots
    fig = make_subplots(rows=len(results), cols=1, shared_xaxes=True, vertical_spacing=0.14,
                        subplot_titles=list(results))
    for row, res in enumerate(results.values(), start=1):
        step = res[0]["steps"][0]
        m = step["marks"]
        names = [f"bucket {k}: " + ", ".join(dict.fromkeys(units[u] for u, _ in b))
                 for k, b in enumerate(res[0]["buckets"])]
        _phase_bars(fig, m, row, "compute")
        lf.link_bars(fig, step["ops"], "link", row=row, exposed_from=lambda o: m["backward_end"],
                     names=names or None)
        lf.add(fig, _ready_marks(step["ready"], 0.04 * (m["end"] - m["start"]), units), row)
        fig.update_yaxes(categoryorder="array", categoryarray=["link", "compute"], row=row, col=1)
    fig.update_xaxes(title_text="ms since the step began (rank 0)", row=len(results), col=1)
    fig.update_layout(title=title, height=200 + 170 * len(results), barmode="overlay",
                      margin=dict(l=10, r=10, t=80, b=40), plot_bgcolor="white")
    return fig


# --------------------------------------------------------------------------- the bucket size
def predict_exposed(buckets, backward_ms: float, lk, n: int = 2) -> float:
    """Alpha-beta model of one bucketed backward pass: the ms of all-reduce left after it. A
    bucket is ready when its layers' share of the backward FLOPs is done (the embedding's share
    is zero: a lookup); the link carries the buckets one after the other."""
    work = [[0 if u == 0 else nbytes for u, nbytes in b] for b in buckets]
    total, done, end = sum(map(sum, work)), 0, 0.0
    for b, w in zip(buckets, work):
        done += sum(w)                                       # this bucket's last gradient is ready
        end = max(end, backward_ms * done / total) + lk.op_time(
            "all_reduce", sum(nbytes for _, nbytes in b), n) * 1e3      # then the link carries it
    return max(0.0, end - backward_ms)


def sweep_rows(sweep: dict, preset: str) -> list[dict]:
    """One row per measured step of ``bucket_sweep``'s rank 0: the buckets, the backward pass,
    the link's time and its latency part, the exposed wait and its model (ms)."""
    rows = []
    for b, res in sweep.items():
        lk = link.make_link(preset, res["local_flops"])              # as the ranks calibrated it
        k = len(res["buckets"])
        for s in res["steps"]:
            m = s["marks"]
            backward = m["backward_end"] - m["forward_end"]
            rows.append(dict(mib=b / 2**20, size=f"{b / 2**20:g} MiB<br>{k} buckets", k=k,
                             backward=backward, latency=k * lk.latency_s * 1e3,
                             busy=sum(o["modelled"] for o in s["ops"]),
                             exposed=m["sync_end"] - m["backward_end"],
                             exposed_model=predict_exposed(res["buckets"], backward, lk)))
    return rows


SWEEP_COLUMNS = [("bucket_bytes", 12, "{mib:.2f}MiB"), ("buckets", 9, "{k:d}"),
                 ("backward ms", 13, "{backward:.0f}"), ("link ms", 9, "{busy:.0f}"),
                 ("of it K·α", 11, "{latency:.0f}"), ("exposed ms", 12, "{exposed:.0f}"),
                 ("model", 7, "{exposed_model:.0f}")]


def sweep_figure(rows, title: str):
    """Left, what the link carried per step (latency and bytes); right, the exposed time per
    measured step against the alpha-beta model (the mean of the two steps')."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(
        "what the link carries per step", "exposed after the backward pass"))
    first = rows[::2]                                    # one per size: the link carries the same
    for name, ys, color in (("latency, K·α", [r["latency"] for r in first], colors.LINK),
                            ("bytes / bandwidth", [r["busy"] - r["latency"] for r in first],
                             colors.COMMUNICATION)):
        fig.add_trace(go.Bar(x=[r["size"] for r in first], y=ys, name=name, marker_color=color,
                             hovertemplate=name + ": %{y:.0f} ms<extra></extra>"), 1, 1)
    fig.add_trace(go.Scatter(x=[r["size"] for r in rows], y=[r["exposed"] for r in rows],
                             mode="markers", name="exposed, measured (2 steps)",
                             marker=dict(color=colors.EXPOSED, size=9),
                             hovertemplate="%{y:.0f} ms<extra></extra>"), 1, 2)
    fig.add_trace(go.Scatter(x=[r["size"] for r in first],
                             y=[(a["exposed_model"] + b["exposed_model"]) / 2
                                for a, b in zip(rows[::2], rows[1::2])],
                             mode="lines", name="exposed, alpha-beta model",
                             line=dict(color=colors.EXPOSED, dash="dash")), 1, 2)
    fig.update_yaxes(title_text="ms", rangemode="tozero")
    fig.update_layout(title=title, height=420, barmode="stack", margin=dict(l=10, r=10, t=80, b=40))
    return fig


# --------------------------------------------------------------------------- predicted, measured
def condition_table(sim, res, run_dir, pred_comm: float, pred_backward: float,
                    tokens_per_rank: int) -> None:
    """The overlap condition of bucketed DP: the prediction (link ``sim``, ms) beside rank 0's
    trace of the ``backward`` range and its hooks, with the hidden share and the skew."""
    step = res[0]["steps"][0]
    meas = trace.overlap(trace.load_run(run_dir), rank=0, within="backward")
    backward = step["marks"]["backward_end"] - step["marks"]["forward_end"]
    print(sim.label)
    print(f"alpha = {sim.latency_s * 1e3:.1f} ms, beta = {sim.bandwidth_Bps / 1e6:.0f} MB/s, "
          f"F = {sim.local_flops / 1e9:.0f} GFLOP/s; T = {tokens_per_rank} tokens per rank, "
          f"Psi = {sum(res[0]['unit_numels']) / 1e6:.2f} M")
    print(f"{'':24s}{'comm ms':>9}{'backward ms':>13}{'ratio':>7}")
    for name, comm, bwd in (("predicted (alpha-beta)", pred_comm, pred_backward),
                            ("measured (trace, rank 0)", meas.comm_us / 1e3, backward)):
        print(f"{name:24s}{comm:9.0f}{bwd:13.0f}{comm / bwd:7.2f}")
    print(f"measured: {meas.overlap_pct:.0f}% of the link time hidden "
          f"({meas.overlap_pct_ex_skew:.0f}% counting the {meas.skew_us / 1e3:.0f} ms of skew as "
          f"hidden), {meas.exposed_comm_us / 1e3:.0f} ms exposed")


def traffic_table(results: dict, n: int = 2) -> None:
    """Per variant, the bytes rank 0's step put on the link by collective, in units of the
    model's gradients Psi·e, what crossed the wire per rank, and what the ZeRO table expects."""
    psi_b = 4 * sum(results["naive"][0]["unit_numels"])
    head_b = 4 * results["naive"][0]["unit_numels"][-1]
    expected = {"naive": "AR Ψ", "bucketed": "AR Ψ", "zero1": "RS Ψ + AG Ψ",
                "zero2": "RS Ψ + AG Ψ", "zero3": "AG Ψ + AG (Ψ - head) + RS Ψ"}
    print(f"Psi e = {psi_b / 2**20:.2f} MiB (the head: {head_b / 2**20:.2f} MiB); per step on "
          f"rank 0:\n{'variant':10s}{'ops':>5}{'all_reduce':>12}{'reduce_scat':>12}"
          f"{'all_gather':>12}{'wire/rank':>11}   expected")
    for v, res in results.items():
        ops = res[0]["steps"][0]["ops"]
        by = {op: sum(o["bytes"] for o in ops if o["op"] == op) / psi_b
              for op in ("all_reduce", "reduce_scatter", "all_gather")}
        wire = sum(o["bytes"] * link.bus_factor(o["op"], n) for o in ops) / psi_b
        print(f"{v:10s}{len(ops):5d}" + "".join(f"{by[op]:11.2f}Ψ" for op in by)
              + f"{wire:10.2f}Ψ   {expected[v]}")


def memory_figure(memory: dict, title: str):
    """Per rank count (``{n: memory_run's rank 0}``), each variant's bytes by kind, measured and
    (hatched) as ``predicted_memory`` says, stacked."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from workbook.data_parallel import STAGE, predicted_memory
    fig = make_subplots(rows=1, cols=len(memory), shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=[f"{n} ranks" for n in memory])
    for col, (n, res) in enumerate(memory.items(), start=1):
        x = [[v for v in res for _ in (0, 1)], ["measured", "predicted"] * len(res)]
        for kind, color in KINDS.items():
            y = []
            for v, r in res.items():
                pred = predicted_memory(r["unit_numels"], n, STAGE[v], 4)
                y += [r["measured"][kind] / 2**20, pred[kind] / 2**20]
            fig.add_trace(go.Bar(x=x, y=y, name=kind, marker_color=color, showlegend=col == 1,
                                 marker_pattern_shape=["", "/"] * len(res),
                                 hovertemplate=kind + ": %{y:.2f} MiB<extra></extra>"), 1, col)
    fig.update_layout(barmode="stack", title=title, height=430, margin=dict(l=10, r=10, t=80, b=40))
    fig.update_yaxes(title_text="MiB", col=1)
    return fig


# --------------------------------------------------------------------------- ZeRO-3
def zero3_timeline(res, title: str, units):
    """Rank 0's ZeRO-3 step: per layer of the forward pass, the wait for its weights (red) and
    its compute (blue); the step's phases; on the link row each all-gather and reduce-scatter."""
    import plotly.graph_objects as go
    step = res[0]["steps"][0]
    m, u = step["marks"], step["units"]
    fig = go.Figure()
    for i, name in enumerate(units):
        waited, ran = u[f"runs{i}"] - u[f"asked{i}"], u[f"done{i}"] - u[f"runs{i}"]
        fig.add_trace(lf.span(u[f"asked{i}"], u[f"asked{i}"] + max(waited, 0.3),
                              "forward, by layer", colors.EXPOSED,
                              f"{name} waits {waited:.1f} ms for its weights"))
        fig.add_trace(lf.span(u[f"runs{i}"], u[f"runs{i}"] + max(ran, 0.3), "forward, by layer",
                              colors.COMPUTE, f"{name} computes for {ran:.1f} ms",
                              name if ran > 0.1 * (m["forward_end"] - m["start"]) else ""))
    _phase_bars(fig, m, None, "whole step")
    tint = {"all_gather": colors.COMMUNICATION, "reduce_scatter": colors.LINK}
    lf.link_bars(fig, step["ops"], "link", tint=tint)
    lf.legend_keys(fig, "link", {"all-gather": colors.COMMUNICATION, "reduce-scatter": colors.LINK,
                                 "waiting (exposed)": colors.EXPOSED})
    fig.update_yaxes(categoryorder="array",
                     categoryarray=["link", "whole step", "forward, by layer"])
    fig.update_layout(title=title, height=360, barmode="overlay", plot_bgcolor="white",
                      xaxis_title="ms since the step began (rank 0)",
                      margin=dict(l=10, r=10, t=60, b=40))
    return fig


def zero3_table(res, run_dir, preset: str, tokens_per_rank: int, units) -> None:
    """How much of each pass's traffic rank 0's trace finds hidden; then per layer its gather
    (modelled) against the compute of the layer before it, predicted from its FLOPs and measured,
    and the time the layer waited for its weights."""
    run3, step = trace.load_run(run_dir), res[0]["steps"][0]
    numels, u = res[0]["unit_numels"], step["units"]
    sim = link.make_link(preset, res[0]["local_flops"])              # as the ranks calibrated it
    for phase in ("forward", "backward"):
        m3 = trace.overlap(run3, rank=0, within=phase)
        print(f"ZeRO-3 {phase:8s}: link busy {m3.comm_us / 1e3:5.0f} ms, hidden "
              f"{m3.overlap_pct:3.0f}% ({m3.overlap_pct_ex_skew:3.0f}% with skew as hidden), "
              f"exposed {m3.exposed_comm_us / 1e3:4.0f} ms")
    print(f"\n{'gathered':12s}{'behind':12s}{'gather ms':>10}{'behind: model':>15}{'measured':>10}"
          f"{'ratio':>7}{'waited ms':>11}")
    for i in range(len(units)):
        gather = sim.op_time("all_gather", 4 * numels[i], 2) * 1e3
        waited = u[f"runs{i}"] - u[f"asked{i}"]
        if i == 0:
            print(f"{units[0]:12s}{'(nothing)':12s}{gather:10.1f}{'':>32}{waited:11.1f}")
            continue
        flops = 0 if i == 1 else 2 * tokens_per_rank * numels[i - 1]      # the embedding: a lookup
        compute = u[f"done{i - 1}"] - u[f"runs{i - 1}"]
        print(f"{units[i]:12s}{units[i - 1]:12s}{gather:10.1f}"
              f"{flops / sim.local_flops * 1e3:15.1f}{compute:10.1f}{gather / compute:7.2f}"
              f"{waited:11.1f}")


# --------------------------------------------------------------------------- at full speed
def dp_exposed(preset: str, hidden: int, layers: int, tokens: int, n: int, bucket_mb: float,
               vocab: int = 50_000, e: int = 2) -> tuple[float, float, float]:
    """Bucketed DP at full speed, modelled: (exposed, backward pass, link busy), in seconds. A
    GPT-like model of ``layers`` blocks of 12 H^2 weights plus an embedding and a head of
    ``vocab`` x H each; gradients arrive at the rate the backward pass makes them (the
    embedding's last, at no cost) and the buckets queue on the link."""
    lk = lf.full_speed(preset)
    psi_c, psi_e = layers * 12 * hidden**2 + vocab * hidden, vocab * hidden    # computed; lookup
    backward = 4 * tokens * (psi_c + psi_e) / lk.local_flops
    b = bucket_mb * 2**20
    k = np.arange(int(np.ceil((psi_c + psi_e) * e / b)))
    size = np.minimum(b, (psi_c + psi_e) * e - k * b)
    ready = backward * np.minimum(1.0, (k * b + size) / (psi_c * e))
    t = lk.latency_s + size * link.bus_factor("all_reduce", n) / lk.bandwidth_Bps
    end = np.maximum.accumulate(ready - np.cumsum(t) + t) + np.cumsum(t)   # the link's queue
    return max(0.0, end[-1] - backward), backward, float(t.sum())


def zero3_ratio(preset: str, hidden: int, tokens: int, n: int, e: int = 2) -> float:
    """ZeRO-3 at full speed: a block's all-gather over its forward pass (below 1: it hides)."""
    lk = lf.full_speed(preset)
    block = 12 * hidden**2
    return lk.op_time("all_gather", block * e, n) / (2 * tokens * block / lk.local_flops)


BUCKETS_MB = [2 ** (k / 2) for k in range(0, 21)]                     # 1 MiB .. 1 GiB
T_AXIS = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]


def real_scale_figure(preset: str, hidden: int, layers: int, tokens: int, n: int):
    """Left, DP's link time and its exposed part against the bucket size (DDP's 25 MiB dotted,
    the backward pass dashed); right, the ZeRO-3 ratio against the tokens per rank."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    model = [dp_exposed(preset, hidden, layers, tokens, n, mb) for mb in BUCKETS_MB]
    backward = model[0][1]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        f"DP: the link against a {backward * 1e3:.0f} ms backward pass (dashed)",
        "ZeRO-3: gather of a block / its forward pass"))
    for i, name, color in ((2, "link busy", colors.COMMUNICATION), (0, "exposed", colors.EXPOSED)):
        fig.add_trace(go.Scatter(x=BUCKETS_MB, y=[x[i] * 1e3 for x in model], mode="lines+markers",
                                 line_color=color, name=f"DP {name}", hovertemplate="%{x:.0f} MiB "
                                 f"buckets: %{{y:.2f}} ms {name}<extra></extra>"), 1, 1)
    fig.add_hline(y=backward * 1e3, line_dash="dash", line_color=colors.COMPUTE, row=1, col=1)
    fig.add_vline(x=25, line_dash="dot", line_color=colors.OTHER, row=1, col=1)
    fig.add_trace(go.Scatter(x=T_AXIS, y=[zero3_ratio(preset, hidden, t, n) for t in T_AXIS],
                             mode="lines+markers", line_color=colors.COMMUNICATION,
                             showlegend=False,
                             hovertemplate="T = %{x}: ratio %{y:.2f}<extra></extra>"), 1, 2)
    fig.add_hline(y=1, line_dash="dash", line_color=colors.OTHER, row=1, col=2)
    fig.update_xaxes(type="log", title_text="bucket size (MiB); dotted: DDP's 25", row=1, col=1)
    fig.update_xaxes(type="log", title_text="tokens per rank T", row=1, col=2)
    lows = [x[0] * 1e3 for x in model if x[0] > 0] or [backward * 1e3 / 100]
    highs = [backward * 1e3] + [x[2] * 1e3 for x in model]
    fig.update_yaxes(title_text="ms", type="log", row=1, col=1,       # the dashed line in view
                     range=[np.log10(min(lows)) - 0.3, np.log10(max(highs)) + 0.3])
    fig.update_yaxes(title_text="ratio (below 1 hides)", type="log", row=1, col=2)
    params = (layers * 12 * hidden**2 + 2 * 50_000 * hidden) / 1e9
    fig.update_layout(title=f"MODELLED, {preset} at full speed: {layers} blocks of hidden {hidden} "
                      f"({params:.1f} B parameters), T = {tokens}, n = {n}",
                      height=420, legend=dict(x=0.01, y=0.99), margin=dict(l=10, r=10, t=80, b=40))
    return fig


def real_scale_panel(preset: str):
    """``real_scale_figure`` with widgets: the link, the width, the depth, the tokens per rank
    and the number of DP ranks."""
    import ipywidgets as W
    style = {"description_width": "110px"}
    slider = lambda options, value, text: W.SelectionSlider(             # noqa: E731
        options=options, value=value, description=text, style=style)
    controls = {"preset": W.Dropdown(options=list(link.PRESETS), value=preset, description="link",
                                     style=style),
                "n": slider([2, 8, 64, 512], 8, "DP ranks n"),
                "hidden": slider([2048, 4096, 8192], 4096, "hidden H"),
                "layers": slider([8, 16, 32, 64], 32, "blocks L"),
                "tokens": slider([512, 1024, 2048, 4096, 8192, 16384], 4096, "tokens/rank T")}
    return lf.live_figure(real_scale_figure, controls,
                          [["preset", "n"], ["hidden", "layers"], ["tokens"]])
