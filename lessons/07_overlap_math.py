# %% [markdown]
# # Lesson 7 — Overlap math: will the communication hide?
#
# Lessons 3 to 6 overlapped communication with compute and read the result from a trace. This
# lesson answers the question *before* running anything: for one transformer layer, under data
# parallelism (DP), ZeRO-3, tensor parallelism (TP) and pipeline parallelism (PP), how long does
# the layer compute, how long does its communication take, and which is larger?
#
# The whole lesson rests on one number per strategy,
#
# $$ r = \frac{T_\text{comm}}{T_\text{compute}} . $$
#
# If $r < 1$ (equivalently, compute/communication $> 1$) there is enough compute to hide the
# communication, *provided the schedule runs the two at the same time*. If $r > 1$ no schedule
# can hide it: at least $T_\text{comm} - T_\text{compute}$ stays exposed.
#
# The formulas are your lab, `labs/overlap_math.py`. This notebook uses your functions where
# they are written and falls back to the reference implementation, saying so, where they are not.

# %%
import tempfile
from pathlib import Path

import ipywidgets as W
import plotly.graph_objects as go
from IPython.display import display
from plotly.subplots import make_subplots

from workbook import link, trace
from workbook.trace import colors
from workbook.grading.labs import load_lab
from workbook.lessons import (check_your_work, on_ranks, reference_lab, show_in,
                             yours_reference_or_recorded)

RANKS = 2
PRESET = "dgx-h100"

SHOWN = yours_reference_or_recorded("overlap_math")   # "yours", "reference", or "recorded" (a release)

# %%
ref = reference_lab("overlap_math")
FELL_BACK: set = set()
try:
    mine = load_lab("overlap_math", "labs")
except Exception as exc:                      # a syntax error in the lab must not stop the lesson
    print(f"labs/overlap_math.py does not import ({type(exc).__name__}: {exc}); "
          "using the reference implementation (solutions/) throughout.")
    mine = ref
    FELL_BACK.add("every")


def use(name):
    """Your lab's function `name`; the reference's when yours raises NotImplementedError."""
    def call(*args, **kwargs):
        try:
            return getattr(mine, name)(*args, **kwargs)
        except NotImplementedError:
            if name not in FELL_BACK:
                print(f"`{name}` in labs/overlap_math.py is not written yet: "
                      "using the reference implementation (solutions/) instead.")
                FELL_BACK.add(name)
            return getattr(ref, name)(*args, **kwargs)
    return call


def whose() -> str:
    """Label for figure titles: whose formulas drew it."""
    if not FELL_BACK:
        return "your labs/overlap_math.py"
    if "every" in FELL_BACK:
        return "reference implementation"
    return f"reference implementation for {len(FELL_BACK)} function{'s' * (len(FELL_BACK) > 1)}"


linear_flops, layer_params, layer_forward_flops = (use(n) for n in
                                                   ("linear_flops", "layer_params", "layer_forward_flops"))
compute_time, collective_time = use("compute_time"), use("collective_time")
dp_layer, zero3_layer, tp_layer, pp_stage = (use(n) for n in
                                             ("dp_layer", "zero3_layer", "tp_layer", "pp_stage"))

# %% [markdown]
# ## Compute: FLOPs of one layer
#
# A linear layer $y = xW^\top$ with $x$ of shape $[T, d_\text{in}]$ does one multiply and one
# add per weight per token: $2\,T\,d_\text{in}\,d_\text{out}$ FLOPs. So a layer's linear
# layers cost **2 FLOPs per parameter per token**.
#
# A GPT layer of hidden size $H$ holds $4H^2$ attention weights ($Q, K, V$ and the output
# projection) and $2 \cdot H \cdot 4H = 8H^2$ MLP weights, $12H^2$ in all (a Llama SwiGLU MLP has
# three matrices, $3Hf$). With $B$ sequences of $S$ tokens, $T = BS$, the linear layers cost
# $2 \cdot BS \cdot 12H^2 = 24\,BSH^2$. Attention adds the score matrix $QK^\top$ and the
# weighted sum $AV$: each is $S \times S$ dot products of length $H$ per sequence, $2BS^2H$
# FLOPs, so
#
# $$ F_\text{fwd} \approx 24\,BSH^2 + 4\,BS^2H, \qquad F_\text{bwd} \approx 2F_\text{fwd} $$
#
# (the backward pass computes a gradient for the input *and* one for the weights). The second
# term matters only when $S$ is comparable to $6H$. Time is FLOPs over the device's rate $F$; we
# use the peak bf16 rate, so every prediction here is a best case.

# %%
hw = use("hardware")(PRESET)
ly = ref.Layer(hidden=8192, ffn_hidden=4 * 8192, batch=1, seq=4096)
fwd = layer_forward_flops(ly)
print(f"{layer_params(ly) / 1e6:.0f} M weights per layer = 12 H^2 = {12 * 8192 ** 2 / 1e6:.0f} M")
print(f"one H x H projection: {linear_flops(4096, 8192, 8192) / 1e12:.3f} TFLOP; "
      f"12 of them: {12 * linear_flops(4096, 8192, 8192) / 1e12:.2f} TFLOP")
print(f"forward: {fwd / 1e12:.2f} TFLOP (24BSH^2 = {24 * 4096 * 8192 ** 2 / 1e12:.2f}, "
      f"attention 4BS^2H = {4 * 4096 ** 2 * 8192 / 1e12:.2f})")
print(f"on one H100 at {hw.flops / 1e12:.0f} TFLOP/s: {compute_time(fwd, hw) * 1e3:.2f} ms forward, "
      f"{compute_time(3 * fwd, hw) * 1e3:.2f} ms forward + backward")

# %% [markdown]
# ## Communication: bytes over bandwidth
#
# Lesson 2's alpha–beta model, with the bus factors of nccl-tests ($n$ ranks, $M$ bytes, the size
# of the full buffer):
#
# $$ T = \alpha + \frac{M \cdot \text{busfactor}}{\beta}, \qquad
#    \text{busfactor} = \tfrac{2(n-1)}{n} \text{ (all-reduce)},\;
#    \tfrac{n-1}{n} \text{ (all-gather, reduce-scatter)},\; 1 \text{ (send)} $$
#
# What each strategy moves per layer, with $e$ bytes per element ($e = 2$ for bf16):
#
# | strategy | what travels | $T_\text{comm}$ | hidden behind |
# |---|---|---|---|
# | DP ($d$ ranks) | the layer's gradients, once | all-reduce of $12H^2e$ | the backward of the layer below it (next in backward order), $2F_\text{fwd}$ |
# | ZeRO-3 ($d$ ranks) | weights gathered in forward and again in backward, gradients reduce-scattered | 2 all-gathers + 1 reduce-scatter of $12H^2e$ | forward + backward, $3F_\text{fwd}$ |
# | TP ($t$ ranks) | activations after attention and after the MLP | 2 all-reduces of $BSHe$ (forward) | the layer's forward, $F_\text{fwd}/t$ |
# | PP ($L$ layers per stage) | one micro-batch's activations to the next stage | 1 send of $BSHe$ | the stage's forward, $L \cdot F_\text{fwd}$ |
#
# Divide, drop the latency and the attention term, and most symbols cancel (for large $n$,
# $\tfrac{n-1}{n} \approx 1$):
#
# $$ r_\text{DP} = r_\text{ZeRO-3} \approx \frac{e}{2BS}\cdot\frac{d-1}{d}\cdot\frac{F}{\beta},\qquad
#    r_\text{TP} \approx \frac{e\,(t-1)}{6H}\cdot\frac{F}{\beta},\qquad
#    r_\text{PP} \approx \frac{e}{24\,L\,H}\cdot\frac{F}{\beta}. $$
#
# Read them as scaling laws:
#
# * $F/\beta$ is the hardware's side: FLOPs the GPU does in the time one byte crosses the link.
#   An H100 on NVLink: $790\text{e}12 / 900\text{e}9 \approx 880$; over InfiniBand about 2000;
#   on PCIe about 12 000. A faster GPU on the same link makes *every* ratio worse.
# * **DP and ZeRO-3** move weights, whose size does not depend on the batch, while compute grows
#   with the tokens $BS$: more tokens per rank, better overlap. $H$ cancels. ZeRO-3 moves 1.5×
#   DP's bytes but spreads them over forward and backward, so the ratio is the same.
# * **TP** moves activations, which grow with $BS$ exactly as compute does: the batch and the
#   sequence cancel, and **a larger batch does not help TP**. Only a larger $H$ helps; and the
#   ratio grows about linearly with $t$, because each rank's compute shrinks as $1/t$ while the
#   activations it all-reduces do not shrink at all.
# * **PP** sends one activation per stage, behind $L$ layers of compute: tiny ratios; PP's
#   trouble is the pipeline bubble, not bandwidth.
#
# A ratio below 1 is necessary, not sufficient. DP's gradients are ready while earlier layers
# still run backward, so independent compute comes for free. TP's all-reduce result is needed by
# the very next operation: it hides only if the layer is split into independent pieces (Domino,
# lesson 6). That is why TP communication shows up on the critical path even where $r_\text{TP}<1$.

# %% [markdown]
# ## How the ratios scale
#
# Below, the lab's functions (attention and latency included) on a DGX-H100: left, the ratio as
# the micro-batch grows; right, as the hidden size grows. The dashed line is $r = 1$.

# %%
def predict(hidden, tp, dp, seq, batch, layers_per_stage, hw_):
    layer = ref.Layer(hidden=hidden, ffn_hidden=4 * hidden, batch=batch, seq=seq)
    return {"DP": dp_layer(layer, dp, hw_), "ZeRO-3": zero3_layer(layer, dp, hw_),
            "TP": tp_layer(layer, tp, hw_), "PP": pp_stage(layer, layers_per_stage, hw_)}


STRATEGY_STYLE = {"DP": ("solid", "circle"), "ZeRO-3": ("dot", "x"), "TP": ("dash", "square"),
                  "PP": ("dashdot", "diamond")}
batches, hiddens = [1, 2, 4, 8, 16, 32, 64], [1024, 2048, 4096, 8192, 16384]
fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(
    "vs micro-batch B (H = 4096, S = 512)", "vs hidden size H (B = 4, S = 512)"))
for name, (dash, symbol) in STRATEGY_STYLE.items():
    for col, xs, kw in ((1, batches, lambda b: dict(hidden=4096, batch=b)),
                        (2, hiddens, lambda h: dict(hidden=h, batch=4))):
        ys = [predict(tp=8, dp=8, seq=512, layers_per_stage=4, hw_=hw, **kw(x))[name].ratio for x in xs]
        fig.add_trace(go.Scatter(x=xs, y=ys, name=name, legendgroup=name, showlegend=col == 1,
                                 mode="lines+markers+text", text=[""] * (len(xs) - 1) + [name],
                                 textposition="top left" if name == "ZeRO-3" else "bottom left",
                                 line=dict(color=colors.COMMUNICATION, dash=dash),
                                 marker=dict(symbol=symbol, size=8)), row=1, col=col)
for col in (1, 2):
    fig.add_hline(y=1, line=dict(color=colors.EXPOSED, dash="dash"), row=1, col=col)
fig.update_xaxes(type="log", title_text="micro-batch B", row=1, col=1)
fig.update_xaxes(type="log", title_text="hidden size H", row=1, col=2)
fig.update_yaxes(type="log", title_text="comm / compute (below 1: can hide)", row=1, col=1)
fig.update_yaxes(type="log", row=1, col=2)
fig.update_layout(height=420, title=f"predicted ratio per layer, DGX-H100, tp = dp = 8, "
                  f"4 layers per PP stage ({whose()})")
fig

# %% [markdown]
# DP and ZeRO-3 fall as $1/B$ and ignore $H$ (their curves lie on top of each other); TP and PP
# ignore $B$ and fall as $1/H$.
#
# ## The calculator
#
# Set a model and a machine; the bars are one layer's compute (blue) and communication (orange)
# per strategy, each strategy on its own (for PP, one stage of that many layers and one
# micro-batch). Things to try: raise the micro-batch and watch DP and ZeRO-3 improve while TP
# stays put; switch to `pcie-h100` and watch TP become hopeless; drop the hidden size to 2048
# at `tp = 8`.

# %%
style = {"description_width": "110px"}
c_hidden = W.SelectionSlider(options=[1024, 2048, 4096, 8192, 12288, 16384], value=8192,
                             description="hidden H", style=style)
c_tp = W.SelectionSlider(options=[2, 4, 8, 16], value=8, description="TP degree t", style=style)
c_dp = W.SelectionSlider(options=[2, 4, 8, 16, 64, 256], value=8, description="DP degree d",
                         style=style)
c_seq = W.SelectionSlider(options=[256, 512, 1024, 2048, 4096, 8192, 16384], value=4096,
                          description="sequence S", style=style)
c_batch = W.SelectionSlider(options=[1, 2, 4, 8, 16, 32], value=1, description="micro-batch B",
                            style=style)
c_layers = W.IntSlider(value=4, min=1, max=16, description="layers/PP stage", style=style)
c_preset = W.Dropdown(options=list(link.PRESETS), value=PRESET, description="hardware", style=style)
calc_out = W.Output()


def calculator(change=None):
    hw_ = use("hardware")(c_preset.value)
    preds = predict(c_hidden.value, c_tp.value, c_dp.value, c_seq.value, c_batch.value,
                    c_layers.value, hw_)
    names = list(preds)
    verdict = [f"r = {p.ratio:.2g}: {'hides' if p.hides else 'EXPOSED'}" for p in preds.values()]
    fig = go.Figure([
        go.Bar(name="compute", x=names, y=[p.compute_s * 1e3 for p in preds.values()],
               marker_color=colors.COMPUTE, hovertemplate="%{x}: compute %{y:.3g} ms<extra></extra>"),
        go.Bar(name="communication", x=names, y=[p.comm_s * 1e3 for p in preds.values()],
               marker_color=colors.COMMUNICATION, text=verdict, textposition="outside",
               hovertemplate="%{x}: communication %{y:.3g} ms<extra></extra>")])
    fig.update_layout(barmode="group", height=420, yaxis=dict(type="log", title="ms per layer"),
                      title=f"{c_preset.value} (real hardware, predicted; {whose()})")
    show_in(calc_out, fig)


controls = (c_hidden, c_tp, c_dp, c_seq, c_batch, c_layers, c_preset)
for w in controls:
    w.observe(calculator, names="value")
calculator()
display(W.VBox([W.HBox([W.VBox(controls[:4]), W.VBox(controls[4:])]), calc_out]))


# %% [markdown]
# ## Prediction against measurement
#
# A formula is only worth something if a trace agrees with it. On 2 CPU ranks with the simulated
# DGX-H100 link (lesson 3: the real machine in slow motion), each rank starts an asynchronous
# all-reduce, runs a fixed amount of matmul work, then waits; we repeat for buffers of several
# sizes, so the predicted ratio $r$ sweeps from about 0.4 to 4.5. Each point runs inside a
# `record_function` range, so the trace can be asked about each one separately.
#
# Two predictions, both from the lab's functions evaluated on the *simulated* machine
# (`simulated_hardware`: the CPU's matmul rate, the calibrated bandwidth and latency):
# the all-reduce takes `collective_time(...)`, and since compute starts when the all-reduce does,
# the hidden share is $\min(1, 1/r)$.

# %%
def overlap_sweep(run_dir: str, sizes: list, reps: int) -> dict:
    import time

    import torch
    import torch.distributed as dist
    from torch.profiler import record_function

    from workbook import link
    from workbook.trace.capture import rank_trace
    n = 384                                                # the size link calibration measures
    q = torch.linalg.qr(torch.randn(n, n))[0]              # orthogonal: products stay bounded
    b = torch.randn(n, n)
    points = []
    dist.barrier()
    with rank_trace(run_dir, lab="lesson7"):
        for i, size in enumerate(sizes):
            buf = torch.ones(size // 4)
            with record_function(f"point_{i}"):
                work = dist.all_reduce(buf, async_op=True)     # starts at once
                t0 = time.perf_counter()
                for _ in range(reps):                          # independent compute
                    b = q @ b
                compute_s = time.perf_counter() - t0
                work.wait()
            points.append({"bytes": size, "compute_s": compute_s})
    return {"points": points, "local_flops": link.current_link().local_flops,
            "flops": reps * 2.0 * n ** 3}


def calibration() -> float:
    from workbook import link
    return link.current_link().local_flops


local_flops = on_ranks(calibration, RANKS, link=PRESET)[0]     # rank 0 measured this CPU
sim = link.make_link(PRESET, local_flops)
sim_hw = use("simulated_hardware")(sim)
reps = max(4, round(2.5 * sim.latency_s * local_flops / (2.0 * 384 ** 3)))  # compute ≈ 2.5 latencies
t_compute = compute_time(reps * 2.0 * 384 ** 3, sim_hw)
targets = [0.4, 0.6, 0.8, 1.0, 1.4, 2.0, 3.0, 4.5]
sizes = [4 * max(1024, int((r * t_compute - sim.latency_s) * sim.bandwidth_Bps
                           / link.bus_factor("all_reduce", RANKS) / 4)) for r in targets]
print(sim.label)
print(f"simulated latency {sim.latency_s * 1e3:.1f} ms, bandwidth {sim.bandwidth_Bps / 1e6:.1f} MB/s; "
      f"compute per point {reps} matmuls = {t_compute * 1e3:.0f} ms predicted")

runs = Path(tempfile.mkdtemp(prefix="lesson7-"))
res = on_ranks(overlap_sweep, RANKS, str(runs / "sweep"), sizes, reps, link=PRESET)
run = trace.load_run(runs / "sweep")

# %% [markdown]
# The link track of the trace holds one span per all-reduce; its length is the measured
# communication time. `trace.overlap(run, rank=r, within="point_i")` gives, for the collectives
# issued in that range, the communication time and how much of it the rank's compute covered.

# %%
pred_comm = [collective_time("all_reduce", s, RANKS, sim_hw) for s in sizes]
ratio = [c / t_compute for c in pred_comm]
mib = [s / 2 ** 20 for s in sizes]
measured = {r: [trace.overlap(run, rank=r, within=f"point_{i}") for i in range(len(sizes))]
            for r in range(RANKS)}

fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(
    "time per point", "share of the all-reduce hidden"))
fig.add_trace(go.Scatter(x=mib, y=[c * 1e3 for c in pred_comm], mode="lines",
                         name="communication, predicted", line_color=colors.COMMUNICATION), 1, 1)
fig.add_trace(go.Scatter(x=mib, y=[t_compute * 1e3] * len(mib), mode="lines",
                         name="compute, predicted", line=dict(color=colors.COMPUTE, dash="dash")), 1, 1)
r_axis = [10 ** (k / 20) for k in range(-20, 21)]                  # 0.1 ... 10
fig.add_trace(go.Scatter(x=r_axis, y=[100 * min(1.0, 1 / r) for r in r_axis], mode="lines",
                         name="hidden, predicted: min(1, 1/r)", line_color=colors.OTHER), 1, 2)
for r, symbol in zip(range(RANKS), ("circle", "diamond")):
    fig.add_trace(go.Scatter(x=mib, y=[m.comm_us / 1e3 for m in measured[r]], mode="markers",
                             marker=dict(color=colors.COMMUNICATION, symbol=symbol, size=9),
                             name=f"communication, measured rank {r}"), 1, 1)
    fig.add_trace(go.Scatter(x=mib, y=[p["compute_s"] * 1e3 for p in res[r]["points"]],
                             mode="markers", marker=dict(color=colors.COMPUTE, symbol=symbol, size=9),
                             name=f"compute, measured rank {r}"), 1, 1)
    r_meas = [m.comm_us / 1e6 / p["compute_s"] for m, p in zip(measured[r], res[r]["points"])]
    fig.add_trace(go.Scatter(x=r_meas, y=[m.overlap_pct for m in measured[r]], mode="markers",
                             marker=dict(color=colors.EXPOSED, symbol=symbol, size=9),
                             name=f"hidden, measured rank {r}"), 1, 2)
fig.update_xaxes(title_text="all-reduce buffer (MiB)", row=1, col=1)
fig.update_xaxes(title_text="comm / compute r (measured points: measured r)", type="log", row=1, col=2)
fig.update_yaxes(title_text="ms", row=1, col=1)
fig.update_yaxes(title_text="% of communication hidden", range=[0, 110], row=1, col=2)
fig.update_layout(height=450, title=f"predicted vs measured, {RANKS} ranks, SIMULATED {PRESET} "
                  f"({whose()})")
fig

# %%
print(f"{'MiB':>6}{'comm pred':>11}{'meas':>7}{'compute pred':>14}{'meas':>7}{'r pred':>8}"
      f"{'meas':>6}{'hidden pred':>13}{'meas':>6}   (rank 0; ms, %)")
for i, m in enumerate(measured[0]):
    c = res[0]["points"][i]["compute_s"]
    print(f"{mib[i]:>6.2f}{pred_comm[i] * 1e3:>11.1f}{m.comm_us / 1e3:>7.1f}{t_compute * 1e3:>14.1f}"
          f"{c * 1e3:>7.1f}{ratio[i]:>8.2f}{m.comm_us / 1e6 / c:>6.2f}"
          f"{100 * min(1, 1 / ratio[i]):>13.0f}{m.overlap_pct:>6.0f}")

# %% [markdown]
# How to read it:
#
# * **Communication** matches to within rounding. On the simulated link that is expected:
#   the link *charges* the alpha–beta formula, so this checks your arithmetic and your bus
#   factors, not physics. On real hardware the measured time is longer, because real
#   collectives reach only part of the nominal bandwidth; measure what yours reaches with
#   `workbook bench all_reduce` and put *that* $\beta$ into the formulas.
# * **Compute** is a real measurement, and it scatters: the CPU is shared by two ranks (and
#   whatever else runs on this machine), and its matmul rate was measured once, on one size.
#   Predictions of compute time are good to a few tens of percent, on GPUs too.
# * **Hidden share** follows $\min(1, 1/r)$ once $r$ is taken from the measured times (right
#   panel): all of it while $r < 1$, then only the part the compute covers. Against the
#   *predicted* $r$ (the table) it inherits the compute error: where the matmuls ran faster than
#   predicted, less of the all-reduce hid than predicted, and the other way round.
#
# ## Nodes: why tensor parallelism stays inside one
#
# Every figure so far used one bandwidth for every pair of ranks. A cluster has two fabrics.
# Inside a DGX-H100 node the eight GPUs share NVLink through NVSwitch, 900 GB/s of bus
# bandwidth per GPU; between nodes each GPU has its own 400 Gb/s InfiniBand card, 50 GB/s:
# **18 times less**. The simulated link knows this when ranks are started as nodes
# (`launch.run(fn, 4, nnodes=2)`, `workbook run LAB --nnodes 2 --nproc-per-node 2`, or real
# `torchrun --nnodes 2`): each collective is costed by the ranks it involves
# (`workbook/topology.py`). With $k$ nodes and $m$ ranks of the group on each:
#
# * all on one node ($k = 1$): $\alpha_\text{in} + S \cdot \text{bus}(n) / B_\text{in}$, NVLink;
# * one rank per node ($m = 1$): $\alpha_\text{net} + S \cdot \text{bus}(n) / B_\text{net}$, one card;
# * both: the hierarchical all-reduce, a reduce-scatter inside each node, an all-reduce of
#   each rank's $S/m$ piece across nodes (the $m$ cards of a node work at once), an all-gather
#   inside: $2\,(\alpha_\text{in} + \tfrac{m-1}{m} S / B_\text{in}) + \alpha_\text{net} +
#   \tfrac{2(k-1)}{k} \tfrac{S}{m} / B_\text{net}$.
#
# Below, your 4 ranks form 2 nodes of 2 and run one training step's communication for a
# 2 x 2 job, tensor parallelism times data parallelism, placed two ways. Per step, TP
# all-reduces the activations, $[\text{tokens}, h]$, after each attention and MLP block,
# forward and backward ($4L$ all-reduces); DP all-reduces the gradients once
# ($12h^2/\text{TP}$ parameters per layer). TP's bytes grow with the tokens of a step, DP's only
# with the model.

# %%
from workbook.runtime import node_placement

TOKENS, HIDDEN, LAYERS = 1024, 128, 2
sizes = node_placement.step_bytes(TOKENS, HIDDEN, LAYERS)
print(f"per step and rank: TP {sizes['tp_count']} all-reduces of {sizes['tp'] / 2**10:.0f} KiB "
      f"= {sizes['tp_count'] * sizes['tp'] / 2**20:.1f} MiB; DP one of "
      f"{sizes['dp'] / 2**10:.0f} KiB")
placed = on_ranks(node_placement.measure_layouts, 4, TOKENS, HIDDEN, LAYERS, repeats=1,
                  link=PRESET, nnodes=2)
print(placed[0]["label"])
print(node_placement.table(placed))

# %%
fig = go.Figure()
for kind, color in (("tp", colors.COMMUNICATION), ("dp", colors.LINK)):
    fig.add_bar(name=f"{kind.upper()} all-reduces (measured)", marker_color=color,
                x=list(node_placement.LAYOUTS),
                y=[max(r[name][f"{kind}_ms"] for r in placed) for name in node_placement.LAYOUTS])
fig.update_layout(barmode="stack", yaxis_title="ms per step (slowest rank, simulated)",
                  title="One step's communication on 2 nodes of 2: TP inside vs across nodes",
                  height=360)
fig

# %% [markdown]
# Measured and modelled agree (the link charges the model; the gap is real gloo time). The
# layout decides the cost: TP's many activation all-reduces on NVLink and DP's one gradient
# all-reduce on the network (`tp_inside`, Megatron-LM's order, TP innermost) costs a fraction
# of the other way round (about 2.5x less at 1024 tokens a step; the gap grows with the tokens,
# since only TP's bytes do). And only DP's all-reduce can hide (behind the backward
# pass, lesson 9); every TP all-reduce is waited on before the next layer can start, unless a
# schedule like Domino's (lesson 6) splits the batch. That is why the Domino paper's
# multi-node runs, with TP spanning two nodes, leave more exposed than its single-node ones:
# `workbook bench domino --nproc 4 --nnodes 2` measures it on your ranks.
#
# ## Exercise: the `overlap_math` lab
#
# Open `labs/overlap_math.py`: its docstrings are the spec of each function, and this lesson's
# sections derive every term ("Compute: FLOPs of one layer" for the FLOPs and the weights,
# "Communication: bytes over bandwidth" for a collective's time and each strategy's row of the
# table). Write the compute functions first, then the collective's time, then the four
# strategies. Stuck? `workbook hint overlap_math N` shows one hint at a time. Re-run this
# notebook: the messages about the reference go away and the figures' titles name your file. The grader checks your numbers against hand-computed values, then runs
# 5 TP-like steps on 3 ranks of the simulated link and requires every all-reduce span in the
# trace to last what your `collective_time` predicts (±2%), your `compute_time` to be the FLOPs
# over the rate the rank measured (±2%), and the measured compute within a factor of 10 of it. Grade it with `workbook grade --lab overlap_math`, or below.

# %%
check_your_work("overlap_math")
