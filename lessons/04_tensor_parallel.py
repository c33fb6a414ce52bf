# %% [markdown]
# # Lesson 4 — Tensor parallelism (Megatron-LM)
#
# A transformer block is mostly matrix products. When one GPU cannot hold a layer's weights, or
# is too slow to multiply them, we can cut every weight matrix into *n* pieces and give one
# piece to each of *n* ranks. Each rank then stores 1/n of the weights and does 1/n of the
# arithmetic. The price is communication: partial results have to be combined.
#
# Megatron-LM (Shoeybi et al. 2019, [arXiv 1909.08053](https://arxiv.org/abs/1909.08053), §3)
# showed how to cut a block so that this price is as small as possible: **one all-reduce in the
# forward pass and one in the backward pass for each half of the block** (attention, MLP).
#
# This lesson:
# 1. column- and row-parallel linear layers, and why the MLP wants one of each;
# 2. the two conjugate operators **f** and **g**, and where they sit in a block;
# 3. attention, biases, the vocabulary;
# 4. what it costs, with a calculator;
# 5. your `tp` lab on 2 ranks: the planned schedule next to the measured trace.

# %%
import tempfile
from pathlib import Path

import ipywidgets as W
import plotly.graph_objects as go
import torch
from IPython.display import display

from workbook import link, trace
from workbook.trace import colors
from workbook.lessons import check_your_work, on_ranks, show_in, yours_reference_or_recorded
from workbook.trace.analyse import phase_ranges

RANKS = 2
PRESET = "dgx-h100"

SHOWN = yours_reference_or_recorded("tp")   # "yours", "reference", or "recorded" (a release)


# %% [markdown]
# ## Splitting a linear layer
#
# A linear layer computes `Y = X A`, with `X` of shape `[tokens, in]` and `A` of shape
# `[in, out]`. There are two ways to cut `A` in two:
#
# * **by columns**, `A = [A₁ A₂]`: rank *i* computes `Y_i = X A_i`, a slice of the *output
#   features*. Each rank needs the whole input `X`, and ends with a different slice of `Y`.
# * **by rows**, `A = [A₁; A₂]`: rank *i* multiplies its slice of the *input features*,
#   `X_i A_i`, and `Y = X₁A₁ + X₂A₂` is the **sum** of the ranks' partial products.
#
# The MLP is `Y = GeLU(X A) B`. Split `A` by columns, and each rank applies the GeLU to its own
# slice `X A_i` with no communication, because GeLU acts on each element separately. That slice
# is exactly the input a row-split `B` wants, so each rank computes `GeLU(X A_i) B_i`, and
# **one all-reduce** adds the partial sums. (Split `A` by rows instead and the ranks would need to add their
# partial sums *before* the GeLU, because `GeLU(a + b) ≠ GeLU(a) + GeLU(b)`: an extra
# all-reduce.) The check below runs on one process, with the two "ranks" as list entries.

# %%
torch.manual_seed(0)
X, A, B, b = torch.randn(6, 8), torch.randn(8, 16), torch.randn(16, 8), torch.randn(8)
full = torch.nn.functional.gelu(X @ A) @ B + b

A_cols, B_rows = A.chunk(RANKS, dim=1), B.chunk(RANKS, dim=0)        # rank i keeps A_i, B_i
partial = [torch.nn.functional.gelu(X @ A_cols[i]) @ B_rows[i] for i in range(RANKS)]
print("column then row, one sum, bias once:   ", torch.allclose(sum(partial) + b, full))
print("bias added on every rank before the sum:", torch.allclose(sum(p + b for p in partial), full))
A_rows = A.chunk(RANKS, dim=0)
wrong = sum(torch.nn.functional.gelu(X[:, i * 4:(i + 1) * 4] @ A_rows[i]) for i in range(RANKS)) @ B
print("A split by rows, GeLU before the sum:   ", torch.allclose(wrong + b, full))

# %% [markdown]
# The second line is the **bias rule**: `B`'s bias is replicated on every rank, so it is added
# once, *after* the reduction. Added before, it would be counted *n* times.
#
# ## The conjugate pair f and g
#
# Megatron writes the communication as two autograd operators that are mirror images:
#
# | operator | forward | backward | where |
# |---|---|---|---|
# | **f** | identity | all-reduce (sum) | entering a parallel region (before the column layer) |
# | **g** | all-reduce (sum) | identity | leaving it (after the row layer) |
#
# *Why f all-reduces the gradient.* The input `X` is the same on every rank, and each rank uses
# it for its own slice of the output. Rank *i*'s gradient `dL/dX` therefore only counts the paths
# through `A_i`; the true gradient is the sum over ranks.
# *Why g is the identity backward.* The output of g is the same on every rank, so every rank
# already holds the full `dL/dY`, which is also the gradient of its partial sum.
#
# Two more pairs finish the set, for a layer that must *start* from a replicated tensor's slice
# or *end* with every rank's slice joined:
#
# | operator | forward | backward |
# |---|---|---|
# | **scatter** | keep this rank's slice of the last dim (no communication) | ? |
# | **gather** | all-gather the slices along the last dim | ? |
#
# Each backward is forced by its forward, as g's was: the backward must hand back the gradient
# of the forward's *input*, in the form that input had on this rank (whole and the same on
# every rank, or this rank's slice). Every operator of this section is a *pair of functions*,
# one per pass, with f and g as the first two rows.
#
# **Think it through.** Fill in the two question marks. Scatter's input was replicated: what
# must its gradient be, and where are its pieces after the backward of the layers that follow?
# Gather's output is whole on every rank: which part of its gradient did this rank's input
# produce?
#
# A column-parallel layer therefore enters its region with f and ends with this rank's features
# (or gathers them, when a caller needs the whole output); a row-parallel layer starts from this
# rank's features (or scatters a whole input first) and leaves its region with g, then adds its
# bias. Where several column layers read the same input, as `W_q`, `W_k` and `W_v` do, the caller
# applies f *once* for all of them: one all-reduce of the summed gradients instead of three.
#
# In a pre-norm block, each half (attention, MLP) gets one f and one g:

# %%
def block_figure():
    fig = go.Figure()
    lanes = {"all": (-0.3, 0.3), 0: (0.45, 1.05), 1: (-1.05, -0.45)}

    def box(x0, x1, text, color, lane="all"):
        y0, y1 = lanes[lane]
        fig.add_shape(type="rect", x0=x0, x1=x1, y0=y0, y1=y1, fillcolor=color, opacity=0.9,
                      line=dict(color="black", width=1))
        fig.add_annotation(x=(x0 + x1) / 2, y=(y0 + y1) / 2, text=text, showarrow=False,
                           font=dict(color="white" if color != colors.IDLE else "black", size=11))

    fig.add_shape(type="line", x0=-0.2, x1=16.6, y0=0, y1=0, line=dict(color="grey"))
    qkv = "W<sub>q</sub> W<sub>k</sub> W<sub>v</sub>"
    for start, name, first, mid, last in ((0, "attention", qkv, "attention", "W<sub>o</sub>"),
                                          (8.4, "MLP", "A = fc1", "GeLU", "B = fc2")):
        fig.add_shape(type="rect", x0=start + 1.45, x1=start + 6.2, y0=-1.2, y1=1.2,
                      fillcolor="#F2F2F2", line_width=0)
        for y in (0.75, -0.75):                       # the fork after f and the join before g
            fig.add_shape(type="line", x0=start + 1.4, x1=start + 1.6, y0=0, y1=y,
                          line=dict(color="grey"))
            fig.add_shape(type="line", x0=start + 6.0, x1=start + 6.3, y0=y, y1=0,
                          line=dict(color="grey"))
        fig.add_annotation(x=start + 3.8, y=1.45, text=f"{name}: parallel region (rank 0 above, "
                           "rank 1 below)", showarrow=False, font=dict(size=11))
        box(start, start + 0.9, "Layer<br>Norm", colors.IDLE)
        box(start + 1.0, start + 1.4, "f", colors.COMMUNICATION)
        for r in (0, 1):
            piece = f"heads {2 * r}–{2 * r + 1}" if name == "attention" else f"cols {r}"
            box(start + 1.6, start + 2.9, f"{first}<br>{piece}", colors.COMPUTE, r)
            box(start + 3.0, start + 4.6, f"{mid}<br>{piece}", colors.COMPUTE, r)
            box(start + 4.7, start + 6.0, f"{last}<br>rows {r}", colors.COMPUTE, r)
        box(start + 6.3, start + 6.7, "g", colors.COMMUNICATION)
        box(start + 6.8, start + 8.1, "+ bias<br>+ x", colors.IDLE)
    for x, text in ((1.2, "f: forward identity<br>backward all-reduce"),
                    (6.5, "g: forward all-reduce<br>backward identity")):
        fig.add_annotation(x=x, y=-0.3, ax=x, ay=-1.55, axref="x", ayref="y", text=text,
                           showarrow=True, arrowhead=2, font=dict(size=11))
    fig.update_xaxes(visible=False, range=[-0.3, 16.7])
    fig.update_yaxes(visible=False, range=[-2.0, 1.7])
    fig.update_layout(title="One tensor-parallel block on 2 ranks: where f and g sit", height=330,
                      plot_bgcolor="white", margin=dict(l=10, r=10, t=50, b=10))
    return fig


block_figure()

# %% [markdown]
# ## Attention and the vocabulary
#
# **Attention** splits the same way, by heads. `W_q`, `W_k`, `W_v` are column-parallel and
# their output features are grouped by head, so rank *i* gets whole heads and runs attention on
# `heads/n` of them with no communication at all. `W_o` is row-parallel: its input is the
# concatenation of the heads, of which each rank holds its own. One f before, one g after.
#
# **The vocabulary** is large (50–250 k tokens), so the embedding table and the output layer are
# split by *vocabulary rows*: rank *i* holds tokens `i·V/n … (i+1)·V/n`. The embedding looks up
# the tokens it owns, writes zeros for the others, and a g adds the pieces. At the output, each
# rank holds the logits of its own tokens, `[B, S, V/n]`, and the cross-entropy
# `log Σ exp(z) − z_target` is assembled from three all-reduces of only `B·S` numbers (the max,
# the sum of exponentials, the target's logit), so no rank ever builds the full `[B, S, V]`.
# The max is only there for numerical stability: `log Σ exp(z − m) − (z_target − m)` is the same
# loss for any `m`, so the loss does not depend on it and it needs no gradient. The target's
# logit lives on one rank only (the one holding its id), and the embedding has the same problem
# the other way round: a rank can look up only the ids it holds.
#
# **Think it through.** Which of the three all-reduces must carry a gradient back, and which
# of this lesson's operators gives it the right one? What do the ranks that do not hold the
# target's id (or a token's id, in the embedding) contribute to the sum, so that the total is
# right?
#
# ## What it costs
#
# Per block and per training step: **2 all-reduces forward** (the g's) and **2 backward** (the
# f's), each of the full activation, `B × S × H` elements. The message does not shrink as you add
# ranks, while each rank's compute does (1/n of the matmuls): tensor parallelism pays off inside
# a node with a fast link, and is rarely stretched across nodes. The calculator below counts the
# bytes and compares the modelled all-reduce time on a real link with the compute of one block
# (GPT block, F = 4H, bf16, at the GPU's peak rate; forward + backward ≈ 3 × forward).

# %%
def tp_cost(hidden, seq, batch, tp, layers, preset, dtype_bytes=2):
    p = link.PRESETS[preset]
    msg = batch * seq * hidden * dtype_bytes                               # one all-reduce
    t_ar = p.latency_us * 1e-6 + msg * link.bus_factor("all_reduce", tp) / (p.bandwidth_GBps * 1e9)
    flops = 3 * (24 * batch * seq * hidden ** 2 + 4 * batch * seq ** 2 * hidden) / tp
    return {"msg": msg, "step_bytes": 4 * layers * msg, "comm_s": 4 * t_ar,
            "compute_s": flops / (p.peak_tflops * 1e12)}


sliders = dict(
    hidden=W.SelectionSlider(options=[512, 1024, 2048, 4096, 8192, 12288, 16384], value=4096,
                             description="hidden H"),
    seq=W.SelectionSlider(options=[512, 1024, 2048, 4096, 8192], value=2048, description="seq S"),
    batch=W.IntSlider(value=4, min=1, max=16, description="batch B"),
    tp=W.SelectionSlider(options=[2, 4, 8], value=8, description="TP n"),
    layers=W.IntSlider(value=32, min=1, max=96, description="layers L"),
    preset=W.Dropdown(options=list(link.PRESETS), value=PRESET, description="link"),
)
cost_out = W.Output()


def show_cost(change=None):
    v = {k: w.value for k, w in sliders.items()}
    c = tp_cost(**v)
    fig = go.Figure(go.Bar(
        y=["all-reduces (4)", f"compute (1/{v['tp']})"], x=[c["comm_s"] * 1e3, c["compute_s"] * 1e3],
        orientation="h", marker_color=[colors.COMMUNICATION, colors.COMPUTE],
        text=[f"{c['comm_s'] * 1e3:.2f} ms", f"{c['compute_s'] * 1e3:.2f} ms"], textposition="auto"))
    fig.update_layout(title=f"one block, forward + backward, on {v['preset']} (modelled)",
                      xaxis_title="ms per rank", height=230, margin=dict(l=10, r=10, t=50, b=40))
    show_in(cost_out,
            f"one all-reduce: B·S·H = {v['batch'] * v['seq'] * v['hidden']:,} elements = "
            f"{c['msg'] / 2**20:,.1f} MiB;  per step, {4 * v['layers']} all-reduces = "
            f"{c['step_bytes'] / 2**30:,.2f} GiB;  communication is "
            f"{c['comm_s'] / (c['comm_s'] + c['compute_s']):.0%} of the block if nothing overlaps",
            fig)


for w in sliders.values():
    w.observe(show_cost, names="value")
show_cost()
display(W.VBox([W.HBox([sliders["hidden"], sliders["seq"], sliders["batch"]]),
                W.HBox([sliders["tp"], sliders["layers"], sliders["preset"]]), cost_out]))

# %% [markdown]
# Compute grows as `H²/n` and the message as `H`: a wide model spends a smaller share of its
# time in all-reduces than a narrow one, and a larger `n` a larger share. Nothing overlaps yet:
# every all-reduce stops the rank until it is done. Lesson 5 changes the shape of these
# collectives; lesson 6 (Domino) hides them behind compute.
#
# ## Your block on 2 ranks
#
# The `tp` lab builds all of the above from the reference model's weights. Its figures
# (`workbook.tensor_parallel.tp_report`, what `workbook run tp` prints after the grader's checks) run one TP
# block (fp64, `B=2, S=16, H=64`), trace a forward and a backward pass
# (`record_function("forward")` and `"backward"`), and measure the activation memory each rank
# keeps for backward. Below they run on warm ranks over the simulated DGX-H100 link: first
# **your** `labs/tp.py`; if that is not finished, the reference in `solutions/tp.py`. (Whether
# your numbers are *right* is the grader's question: the last cell of this lesson.)

# %%
from workbook.tensor_parallel import tp_report as report

runs = Path(tempfile.mkdtemp(prefix="lesson4-"))
source, results = "your labs/tp.py", None
try:
    results = on_ranks(report.run, RANKS, str(runs / "labs"), "labs", link=PRESET)
except Exception as exc:                    # not implemented yet, or a half-written lab failing
    status = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
if results is None:
    print(f"Your lab is not done yet ({status}).\nShowing the REFERENCE run "
          "(solutions/tp.py) instead; come back after the exercise to see your own.\n")
    source = "the reference solutions/tp.py"
    results = on_ranks(report.run, RANKS, str(runs / "solutions"), "solutions", link=PRESET)
    run_dir = runs / "solutions"
else:
    run_dir = runs / "labs"
print(report.describe(results))

# %% [markdown]
# ### Planned
#
# Before looking at the trace, write down what *should* happen on each rank. Forward: compute
# the attention half, g, compute the MLP half, g. Backward, in reverse: the MLP's gradients, the
# f before it, the attention's gradients, the f before it. Every all-reduce is synchronous, so
# the rank computes nothing while it runs: all of it is exposed (red).

# %%
def planned_figure():
    steps = [("LN, W<sub>qkv</sub>, attention, W<sub>o</sub>", "compute"), ("g", "all-reduce"),
             ("LN, fc1, GeLU, fc2", "compute"), ("g", "all-reduce"),
             ("MLP grads", "compute"), ("f", "all-reduce"),
             ("attention grads", "compute"), ("f", "all-reduce")]
    order = [f"rank {r} · {row}" for r in range(RANKS) for row in ("thread", "link", "exposed")]
    fig, t = go.Figure(), 0.0

    def bar(row, width, color, text="", thin=False):
        fig.add_trace(go.Bar(orientation="h", base=[t], x=[width], y=[row], marker_color=color,
                             width=0.35 if thin else 0.8, text=[text], textposition="inside",
                             insidetextanchor="middle", showlegend=False, hoverinfo="skip"))

    for label, kind in steps:
        width = 2.0 if kind == "compute" else 1.5
        for r in range(RANKS):
            if kind == "compute":
                bar(f"rank {r} · thread", width, colors.COMPUTE, label)
            else:                                 # the thread waits while the link carries it
                bar(f"rank {r} · thread", width, colors.WAIT, "wait")
                bar(f"rank {r} · link", width, colors.COMMUNICATION, f"{label}: all-reduce")
                bar(f"rank {r} · exposed", width, colors.EXPOSED, thin=True)
        t += width
    fig.add_vline(x=7.0, line_dash="dash")
    fig.add_annotation(x=7.0, y=1.0, yref="paper", yanchor="bottom", showarrow=False,
                       text="forward ←  → backward")
    fig.update_layout(title=f"PLANNED schedule of one block, {RANKS} ranks (order only, not to scale)",
                      barmode="overlay", height=300, xaxis=dict(title="time →", showticklabels=False),
                      yaxis=dict(autorange="reversed", categoryorder="array", categoryarray=order),
                      margin=dict(l=10, r=10, t=70, b=40))
    return fig


planned_figure()

# %% [markdown]
# ### Measured
#
# The same block, read from its trace: blue compute, orange communication on the `link` row,
# purple the compute thread waiting for it (here inside the f and g operators, which block on
# their all-reduce), red the exposed communication.

# %%
run = trace.load_run(run_dir)
measured = trace.timeline_figure(
    run, title=f"MEASURED: one TP block from {source}, {RANKS} ranks (SIMULATED {PRESET})")
r0 = run.traces[0]
backward_at = phase_ranges(r0, "backward")[0][0][0] + r0.origin_us - min(
    t.origin_us + t.ts.min() for t in run.traces)
measured.add_vline(x=backward_at, line_dash="dash")
measured.add_annotation(x=backward_at, y=1.0, yref="paper", yanchor="bottom", showarrow=False,
                        text="forward ←  → backward (rank 0)")
measured

# %% [markdown]
# The order is the planned one; the proportions are not. At this toy width (`H = 64`) each
# all-reduce is almost pure link latency and the matmuls are slivers, as the calculator predicts
# for a narrow model. The collectives per phase, read from rank 0's trace, against the plan of
# 2 all-reduces of `B·S·H` fp64 numbers per phase:

# %%
expected_bytes = 2 * results[0]["elements_BSH"] * 8
print(f"{'phase':<10}{'collective':<14}{'count':>6}{'bytes':>9}   planned")
for phase in ("forward", "backward"):
    calls = trace.collectives(run, rank=0, within=phase)
    for name, c in calls.items():
        print(f"{phase:<10}{name:<14}{c['count']:>6}{c['bytes'] or 0:>9}   2 all_reduce, "
              f"{expected_bytes} bytes")
    if not calls:
        print(f"{phase:<10}(none)   planned: 2 all_reduce, {expected_bytes} bytes")

# %% [markdown]
# ## Exercise: the `tp` lab
#
# Open `labs/tp.py` and replace each `raise NotImplementedError`, in this order (each step uses
# the ones before):
#
# 1. the four operators: f, g, scatter and gather ("The conjugate pair f and g");
# 2. the column- and row-parallel linears ("Splitting a linear layer", and the bias rule);
# 3. the MLP and the attention ("Splitting a linear layer", "Attention and the vocabulary");
# 4. the block;
# 5. the vocab-parallel embedding, the loss and the model ("Attention and the vocabulary").
#
# The task list at the top of `labs/tp.py` gives the same steps with the points each carries,
# and each task's docstring is its spec. Stuck? `workbook hint tp N` shows the next hint for
# task N (the idea, then the steps, then near-code).
#
# Run it with `workbook run tp --nproc 2 --trace-dir runs/tp` (then open `runs/tp/report.html`),
# and re-run this notebook's "your block" cells to see your own timeline. The grader compares
# outputs and gradients with the single-device model on several world sizes, and reads from
# your trace that a block makes exactly 2 all-reduces forward and 2 backward:
# `workbook grade --lab tp`.

# %%
check_your_work("tp")
