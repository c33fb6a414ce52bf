# %% [markdown]
# # Lesson 5 — Sequence-parallel tensor parallelism
#
# Vanilla tensor parallelism (lesson 4) splits the attention heads and the MLP's inner width over
# *t* ranks. Everything *between* those two regions (the LayerNorms, the dropouts, the residual
# adds) is not split: every rank runs it on the whole `[S, B, H]` activation and keeps its own
# identical copy of whatever backward needs. That part of the activation memory does not shrink
# as *t* grows.
#
# Korthikanti et al. (2022), *Reducing Activation Recomputation in Large Transformer Models*
# ([arXiv 2205.05198](https://arxiv.org/abs/2205.05198), §4.2.2) observed that these operations
# act on each sequence position independently, so rank *r* can run them on its own *S/t*
# positions only. This is **sequence parallelism** (SP). This lesson:
#
# 1. which tensors are sharded how, and why the communication volume does not change;
# 2. the two new duties: partial LayerNorm gradients and reproducible dropout; the embedding and
#    the head at the ends of the model;
# 3. a calculator of activation memory per layer, TP against SP;
# 4. your `sp` lab on 2 ranks: its timeline next to the planned schedule, its collectives read
#    from the trace, and its measured activation memory against the prediction.

# %%
import tempfile
from pathlib import Path

import ipywidgets as W
import plotly.graph_objects as go
import torch
from IPython.display import display
from plotly.subplots import make_subplots

from workbook import trace
from workbook.trace import colors
from workbook.lessons import (buffers_figure, check_your_work, on_ranks, show_in,
                             yours_reference_or_recorded)
from workbook.link import bus_factor

RANKS = 2
PRESET = "dgx-h100"
SHARDED = "rgba(0, 114, 178, 0.45)"          # the compute blue, lighter: sequence-sharded work

SHOWN = yours_reference_or_recorded("sp")   # "yours", "reference", or "recorded" (a release)


# %% [markdown]
# ## Two ways to shard one block
#
# Top: vanilla TP. `f` is the identity going in (all-reduce in backward), `g` the all-reduce
# coming out (identity in backward); grey boxes are **replicated**. Bottom: SP. The same boxes
# now hold `[S/t, B, H]` (light blue: each rank has its own positions), and the region boundaries
# change collective: `f` becomes an **all-gather** along the sequence (every rank needs every
# position for its heads), `g` a **reduce-scatter** (sum the partial outputs, keep your
# positions). The paper calls this pair *g* and *ḡ*.
#
# **Which dim the collectives cut.** The single-tensor collectives of `torch.distributed`
# (`all_gather_into_tensor`, `reduce_scatter_tensor`) join and cut a buffer along **dim 0**.
# Megatron-LM keeps activations `[S, B, H]`, so the sequence is dim 0 and they cut it directly.
# The lab's tensors are `[B, S, H]`, a shard is `x[:, s0:s1]`, and a collective reads its
# buffer's memory in order, whatever the tensor's strides say. A reduce-scatter also needs a
# sequence length that splits over the *t* ranks; the model checks that once, at construction
# (`ModelConfig.validate(tp, sequence_parallel=True)`).
#
# **Think it through.** If you handed a `[B, S, H]` tensor to a collective that joins along
# dim 0, what would rank 1's positions end up next to? What layout must the buffer have for
# the join to fall along the sequence, and what must the tensor you return look like to the
# layers that read it (see also "How much memory it saves" below)?

# %%
def block_figure():
    steps = {
        "vanilla TP": [("LayerNorm", "[S, B, H]", "rep"), ("f<br>identity", "[S, B, H]", "id"),
                       ("attention", "[S, B, H/t]", "tp"), ("g<br>all-reduce", "[S, B, H]", "comm"),
                       ("dropout<br>+ residual", "[S, B, H]", "rep"), ("LayerNorm", "[S, B, H]", "rep"),
                       ("f<br>identity", "[S, B, H]", "id"), ("MLP", "[S, B, F/t]", "tp"),
                       ("g<br>all-reduce", "[S, B, H]", "comm"),
                       ("dropout<br>+ residual", "[S, B, H]", "rep")],
        "sequence-parallel TP": [
            ("LayerNorm", "[S/t, B, H]", "seq"), ("all-gather", "[S, B, H]", "comm"),
            ("attention", "[S, B, H/t]", "tp"), ("reduce-<br>scatter", "[S/t, B, H]", "comm"),
            ("dropout<br>+ residual", "[S/t, B, H]", "seq"), ("LayerNorm", "[S/t, B, H]", "seq"),
            ("all-gather", "[S, B, H]", "comm"), ("MLP", "[S, B, F/t]", "tp"),
            ("reduce-<br>scatter", "[S/t, B, H]", "comm"), ("dropout<br>+ residual", "[S/t, B, H]", "seq")],
    }
    fill = {"rep": colors.IDLE, "id": "white", "tp": colors.COMPUTE, "seq": SHARDED,
            "comm": colors.COMMUNICATION}
    fig = go.Figure()
    for row, (name, boxes) in enumerate(steps.items()):
        y = 1 - row
        fig.add_annotation(x=-0.1, y=y + 0.48, text=f"<b>{name}</b>", showarrow=False, xanchor="left")
        for i, (label, shape, kind) in enumerate(boxes):
            x0 = i * 1.15
            fig.add_shape(type="rect", x0=x0, x1=x0 + 1, y0=y - 0.3, y1=y + 0.3, fillcolor=fill[kind],
                          line=dict(color=colors.COMMUNICATION if kind == "id" else "white"))
            dark = kind in ("tp", "comm")
            fig.add_annotation(x=x0 + 0.5, y=y + 0.08, text=label, showarrow=False,
                               font=dict(size=11, color="white" if dark else "black"))
            fig.add_annotation(x=x0 + 0.5, y=y - 0.2, text=shape, showarrow=False,
                               font=dict(size=10, color="white" if dark else "black"))
    fig.update_xaxes(visible=False, range=[-0.15, 11.6])
    fig.update_yaxes(visible=False, range=[-0.45, 1.6])
    fig.update_layout(title="one transformer block on t ranks: what each rank holds "
                      "(grey: replicated, light blue: own S/t positions, blue: own heads/columns)",
                      height=330, margin=dict(l=10, r=10, t=60, b=10), plot_bgcolor="white")
    return fig


block_figure()

# %% [markdown]
# ## Same bytes: an all-reduce is a reduce-scatter plus an all-gather
#
# A ring all-reduce (lesson 2) *is* a reduce-scatter followed by an all-gather. SP simply stops
# between the two halves: it reduce-scatters at the end of one parallel region, does the
# per-position work on the shard, and all-gathers at the start of the next. In the nccl-tests
# convention each rank sends `2(t-1)/t · N` bytes for an all-reduce of an `N`-byte buffer and
# `(t-1)/t · N` for a reduce-scatter or an all-gather, so per block SP's 2 all-gathers + 2
# reduce-scatters (forward, and again in backward) move exactly the bytes of TP's 2 + 2
# all-reduces.
#
# Here on 2 real ranks: each holds partial sums for 6 positions (one number per position), the
# reduce-scatter leaves each rank the total of its 3 positions, and the all-gather rebuilds the
# all-reduce's result.

# %%
def sequence_collectives():
    import torch
    import torch.distributed as dist

    from workbook.runtime.ranks import device
    r, n, dev = dist.get_rank(), dist.get_world_size(), device()    # NCCL: tensors on the GPU
    partial = torch.arange(1.0, 7.0, device=dev) * (r + 1)   # this rank's partial output, 6 positions
    shard = torch.empty(6 // n, device=dev)
    dist.reduce_scatter_tensor(shard, partial)           # sum, keep positions r*3 .. r*3+2
    full = torch.empty(6, device=dev)
    dist.all_gather_into_tensor(full, shard)             # every rank: every position
    summed = partial.clone()
    dist.all_reduce(summed)
    return partial.tolist(), shard.tolist(), full.tolist(), bool(torch.equal(full, summed))


res = on_ranks(sequence_collectives, RANKS)
display(buffers_figure([r[0] for r in res], [r[1] for r in res], "reduce-scatter along the sequence",
                       ("before: partial sums, all 6 positions",
                        "after: the sum; rank 0 positions 0-2, rank 1 positions 3-5")))
display(buffers_figure([r[1] for r in res], [r[2] for r in res], "all-gather along the sequence",
                       ("before: own 3 positions", "after: all 6 positions")))
print("reduce-scatter then all-gather == all-reduce on every rank:", all(r[3] for r in res))

# %% [markdown]
# The backward pass swaps them, as `f` and `g` swapped identity and all-reduce. The all-gathered
# input feeds every rank's slice of heads, so each rank's gradient for it is a *partial* sum, and
# each rank needs only its own positions of the total: a reduce-scatter. The reduce-scattered
# output holds *S/t* positions, while the matmul before it produced all *S*: its gradient is the
# all-gather of the shards' gradients.
#
# | operator | forward | backward |
# |---|---|---|
# | enter a parallel region (TP's `f`) | all-gather along S | reduce-scatter along S |
# | leave a parallel region (TP's `g`) | reduce-scatter along S | all-gather along S |
#
# ## Two new duties
#
# **LayerNorm gains and biases get partial gradients.** They are replicated, but each rank now
# applies them to *S/t* positions only, and the gradient of a shared parameter is a sum over all
# positions. Each rank's gradient is one term of that sum; without an all-reduce over the TP
# ranks, the copies drift apart at the first optimizer step. (In vanilla TP every rank saw every
# position: no sync was needed.) The same holds for the row-parallel bias, added after the
# reduce-scatter, and for learned position embeddings.
#
# **Dropout masks differ per shard, but are reproducible.** Each rank must drop *its* positions
# exactly as a single device would. The course draws the whole `[B, S, H]` mask of a site from a
# seed of (site, step), and each rank keeps the columns `s0:s1`: different masks per rank,
# identical to the reference when put together. (Megatron instead gives each TP rank its own
# random stream for sequence-parallel regions: also reproducible, not bit-equal to one device.)

# %%
from workbook.model import ModelConfig, dropout_mask

torch.manual_seed(0)
ln = torch.nn.LayerNorm(8, dtype=torch.float64)
x, dy = torch.randn(2, 6, 8, dtype=torch.float64), torch.randn(2, 6, 8, dtype=torch.float64)
ln(x).backward(dy)
whole = ln.weight.grad.clone()
shards = []
for s in (slice(0, 3), slice(3, 6)):                     # two ranks, three positions each
    ln.weight.grad = None
    ln(x[:, s]).backward(dy[:, s])
    shards.append(ln.weight.grad.clone())
print("LayerNorm gain gradient (first 3 of 8) from positions 0-2:", shards[0][:3].numpy().round(2))
print("                                      from positions 3-5:", shards[1][:3].numpy().round(2))
print("                                  from all six positions:", whole[:3].numpy().round(2))
print("the two partial gradients sum to the whole:", torch.allclose(sum(shards), whole))

cfg = ModelConfig(dropout=0.5, dtype="float64")
mask = dropout_mask(cfg, "blocks.0.attn.dropout", (1, 6, 4), step=1)
print("same site and step, drawn twice, same mask:", torch.equal(mask, dropout_mask(
    cfg, "blocks.0.attn.dropout", (1, 6, 4), step=1)))
print("rank 0's positions and rank 1's positions get different masks:",
      not torch.equal(mask[:, :3], mask[:, 3:]))

# %% [markdown]
# ## The ends of the model: embedding and head
#
# **The embedding ends in shards.** Lab 4's vocab-parallel embedding let each rank look up the
# token ids it holds (zeros for the others) and added the ranks' partial lookups with g, an
# all-reduce. The first block now wants shards, so the sum and the sharding become *one*
# reduce-scatter along the sequence: each rank receives the total for its own positions only.
# Learned positions (gpt) are added after it, to the shard: rank *r* adds rows `s0:s1` of the
# position table, so that table's gradient is partial on each rank, like a norm's gain: tag it.
#
# **The head starts from shards.** The final norm runs on the shard; the head is a column-parallel
# layer (split by vocabulary, no bias) entered like any other: one all-gather along the sequence,
# and logits `[B, S, V/n]` that stay split, for lab 4's vocab-parallel loss (given in
# `workbook.tensor_parallel.mappings`, so this lab never depends on your lab 4).
#
# **After backward, one sync.** Every tagged parameter's gradient (norm gains and biases,
# row-parallel biases, positions) is a partial sum; one all-reduce over the TP ranks makes each the
# reference's. They are small (`6H` numbers per block), and a small collective costs mostly its
# latency (lesson 3's link model), so they travel *together*, in one buffer, rather than one
# collective per parameter.
#
# ## How much memory it saves
#
# Korthikanti et al. (§4) count the bytes one transformer layer keeps for backward (16-bit
# activations, 1-byte dropout masks; *s* sequence, *b* batch, *h* hidden, *a* heads, *t* TP size):
#
# * no parallelism: `sbh (34 + 5as/h)`;
# * tensor parallelism: `sbh (10 + 24/t + 5as/(ht))`. The 10 is what stays
#   replicated: the two LayerNorm inputs (4), the inputs of the QKV and first MLP matmuls (2 + 2)
#   and the two dropout masks (1 + 1);
# * tensor + sequence parallelism: `sbh/t (34 + 5as/h)`: everything divided by t.
#
# The last assumes the QKV and MLP inputs are stored as sequence shards and all-gathered *again*
# in backward (Megatron overlaps that extra all-gather with the input-gradient matmul). The lab
# keeps the gathered inputs instead, so its traffic stays exactly TP's and its memory is
# `sbh (4 + 30/t + 5as/(ht))`. The defaults are GPT-3 175B with t = 8.
#
# Two details decide whether a real block meets this count. A *view* keeps its whole base
# tensor alive: a rank's slice `mask[:, s0:s1]` of the full dropout mask, saved for backward by
# the product it feeds, keeps the whole `[B, S, H]` mask, so copy the slice. And a gathered input
# that is a transposed view is not contiguous: each of `W_q`, `W_k`, `W_v` flattens its input for
# the matmul and would save its own contiguous copy, three where one would do; the all-gather
# should hand back a contiguous tensor.

# %%
def activation_bytes(h, s, b, a, t):
    sbh = s * b * h
    return {"no parallelism": sbh * (34 + 5 * a * s / h),
            "TP": sbh * (10 + 24 / t + 5 * a * s / (h * t)),
            "SP, keeping gathered inputs (the lab)": sbh * (4 + 30 / t + 5 * a * s / (h * t)),
            "TP + SP": sbh / t * (34 + 5 * a * s / h)}


style = {"description_width": "60px"}
hid = W.IntSlider(value=12288, min=1024, max=16384, step=1024, description="hidden h", style=style)
seq = W.IntSlider(value=2048, min=512, max=8192, step=512, description="seq s", style=style)
bat = W.IntSlider(value=1, min=1, max=16, description="batch b", style=style)
heads = W.IntSlider(value=96, min=8, max=128, step=8, description="heads a", style=style)
tp = W.SelectionSlider(options=[1, 2, 4, 8, 16, 32], value=8, description="TP t", style=style)
mem_out = W.Output()
lines = [(colors.OTHER, "dot"), (colors.OTHER, "solid"), (SHARDED, "solid"), (colors.COMPUTE, "solid")]


def redraw_memory(change=None):
    ts = list(tp.options)
    curves = [activation_bytes(hid.value, seq.value, bat.value, heads.value, t) for t in ts]
    fig = go.Figure()
    for name, (c, dash) in zip(curves[0], lines):
        fig.add_trace(go.Scatter(x=ts, y=[m[name] / 1e6 for m in curves], name=name,
                                 mode="lines+markers", line=dict(color=c, width=3, dash=dash)))
    fig.add_vline(x=tp.value, line_dash="dot")
    now = activation_bytes(hid.value, seq.value, bat.value, heads.value, tp.value)
    fig.update_layout(title=f"activation memory per layer at t = {tp.value}: TP "
                      f"{now['TP'] / 1e6:,.0f} MB, SP {now['TP + SP'] / 1e6:,.0f} MB "
                      f"({now['TP + SP'] / now['TP']:.2f}x)",
                      xaxis=dict(title="TP size t", type="log", tickvals=ts), yaxis_title="MB per layer",
                      height=400, margin=dict(l=10, r=10, t=60, b=40))
    show_in(mem_out, fig)


for w in (hid, seq, bat, heads, tp):
    w.observe(redraw_memory, names="value")
redraw_memory()
display(W.VBox([W.HBox([hid, seq, bat]), W.HBox([heads, tp]), mem_out]))

# %% [markdown]
# TP alone levels off at `10 sbh` (plus the attention scores, which shrink with t); SP keeps
# falling as 1/t. The paper pairs SP with *selective recomputation* of the `5as/h` term (the
# attention scores, cheap to recompute); together they remove most of the need to recompute
# whole layers.
#
# ## Your lab on 2 ranks
#
# The cell below runs the lab's figures (`workbook.tensor_parallel.sp_report`, what `workbook run sp` prints
# after the grader's checks) on your `labs/sp.py`, on 2 warm ranks over the simulated DGX-H100
# link: one SP block forward, backward and gradient sync under the profiler (one trace per
# rank), and the bytes its autograd saves measured against lab 4's TP block. Until the lab is
# done it says so, and the rest of the lesson shows the **reference** solution's run instead,
# labelled as such. (Whether your numbers are *right* is the grader's question: the last cell.)

# %%
from workbook.tensor_parallel import sp_report as report

runs = Path(tempfile.mkdtemp(prefix="lesson5-"))
who = "your labs/sp.py"
try:
    results = on_ranks(report.run, RANKS, str(runs / "labs"), "labs", link=PRESET)
except Exception as exc:                    # not implemented yet, or a half-written lab failing
    print(f"Your labs/sp.py does not run to the end yet ({type(exc).__name__}: "
          f"{str(exc).splitlines()[0] if str(exc) else ''}).\n"
          "What follows is the REFERENCE solution (solutions/sp.py); finish the lab and run this "
          "cell again to see your own run.")
    results = on_ranks(report.run, RANKS, str(runs / "reference"), "solutions", link=PRESET)
    who = "REFERENCE solutions/sp.py"
print(f"{who}:")
print(report.describe(results))
run = trace.load_run(runs / ("labs" if who.startswith("your") else "reference"))

# %% [markdown]
# ### The timeline next to the plan
#
# Top: the schedule the block should follow, one collective at a time, each as long as the
# simulated link models it and the phase's measured compute shared out roughly among the
# compute steps. Below: what the ranks actually did, read from the traces. Every collective
# here waits for its result at once (in red: exposed), so the steps follow one another; hiding
# them is lesson 6. (On the thread rows the waits, in purple, sit inside the autograd functions
# `_GatherFromSequenceParallelRegion` and `_ReduceScatter…`, which block on their collective.)

# %%
def link_in_use():
    from workbook import link
    return link.current_link()


lk = on_ranks(link_in_use, RANKS, link=PRESET)[0]
n, first = RANKS, results[0]
buffer_bytes = first["elements_BSH"] * first["elsize"]               # one full [B, S, H] buffer
plan = {"forward": [("LN1", 1), ("all_gather", 0), ("attention", 4), ("reduce_scatter", 0),
                    ("dropout+res", 1), ("LN2", 1), ("all_gather", 0), ("MLP", 4),
                    ("reduce_scatter", 0), ("dropout+res", 1)],
        "backward": [("dropout", 1), ("all_gather", 0), ("MLP bwd", 8), ("reduce_scatter", 0),
                     ("LN2 bwd", 2), ("dropout", 1), ("all_gather", 0), ("attention bwd", 8),
                     ("reduce_scatter", 0), ("LN1 bwd", 2)],
        "grad_sync": [("all_reduce", 0)]}
short = {"all_gather": "AG", "reduce_scatter": "RS", "all_reduce": "AR"}
bars, clock = [], 0.0
for phase, ops in plan.items():
    weight = sum(w for _, w in ops) or 1
    for name, w in ops:
        if name in short:
            size = buffer_bytes if phase != "grad_sync" else \
                trace.collectives(run, rank=0, within="grad_sync")["all_reduce"]["bytes"]
            dur, row, kind = lk.op_time(name, size, n) * 1e6, "plan · link", "communication"
        else:
            dur, row, kind = first["block"][phase]["compute_ms"] * 1e3 * w / weight, "plan · compute", "compute"
        bars.append((row, clock, dur, kind, short.get(name, ""), f"{phase}: {name}<br>{dur:,.0f} µs"))
        clock += dur

timeline = trace.timeline_figure(run)
fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.25, 0.75], vertical_spacing=0.1,
                    subplot_titles=("planned schedule", f"the run: {who}"))
for kind in ("compute", "communication"):
    sel = [b for b in bars if b[3] == kind]
    fig.add_trace(go.Bar(orientation="h", y=[b[0] for b in sel], base=[b[1] for b in sel],
                         x=[b[2] for b in sel], text=[b[4] for b in sel], hovertext=[b[5] for b in sel],
                         hoverinfo="text", marker_color=colors.color(kind), showlegend=False),
                  row=1, col=1)
for tr in timeline.data:
    fig.add_trace(tr, row=2, col=1)
fig.update_yaxes(autorange="reversed", row=1, col=1)
fig.update_yaxes(tickvals=timeline.layout.yaxis.tickvals, ticktext=timeline.layout.yaxis.ticktext,
                 autorange="reversed", row=2, col=1)
fig.update_xaxes(title_text="time (µs)", row=2, col=1)
fig.update_layout(title=f"one SP block on {n} ranks: plan and trace (SIMULATED {PRESET})",
                  barmode="overlay", height=560, margin=dict(l=10, r=10, t=80, b=40),
                  legend=dict(orientation="h", y=1.06, yanchor="bottom", x=1, xanchor="right"))
print(f"planned {clock / 1e3:.0f} ms, traced step {trace.summary(run)['ranks'][0]['step_us'] / 1e3:.0f} ms "
      f"(rank 0); the link models one {buffer_bytes:,}-byte all-gather as {lk.op_time('all_gather', buffer_bytes, n) * 1e3:.1f} ms")
fig

# %% [markdown]
# ### The collectives, read from the trace
#
# Per phase, what rank 0's trace recorded, and the bytes each rank sends (nccl-tests
# convention) against what vanilla TP's two all-reduces of the same `[B, S, H]` buffer send.

# %%
print(f"{'phase':<10}{'collectives in the trace':<56}{'bus bytes':>10}{'TP bus bytes':>14}")
for phase in plan:
    calls = trace.collectives(run, rank=0, within=phase)
    text = ", ".join(f"{c['count']}x {k} ({c['bytes']:,} B)" for k, c in calls.items())
    bus = sum(c["bytes"] * bus_factor(k, n) for k, c in calls.items())
    tp_bus = f"{2 * buffer_bytes * bus_factor('all_reduce', n):,.0f}" if phase != "grad_sync" else "-"
    print(f"{phase:<10}{text:<56}{bus:>10,.0f}{tp_bus:>14}")

# %% [markdown]
# All-gathers and reduce-scatters instead of all-reduces, the same bytes, plus one small
# all-reduce of the partial LayerNorm and bias gradients (it is `6H` numbers, not `S·B·H`).
#
# ### Activation memory: measured against predicted
#
# The figures counted the bytes autograd saved for backward in one block, split into the
# parallel regions (attention, MLP) and the rest (norms, dropout, residual). SP should keep the
# first and divide the second by t: `predicted = TP parallel + TP rest / t`. (This is the lab's
# float64 block, so the constants are not the paper's 16-bit ones; the split is the same.)

# %%
m = first["memory"]
names = ["TP block (lab 4)", "SP block, measured", "SP block, predicted"]
par = [m["tp"]["parallel"], m["sp"]["parallel"], m["tp"]["parallel"]]
rest = [m["tp"]["sequence"], m["sp"]["sequence"], m["tp"]["sequence"] / n]
mem = go.Figure([go.Bar(x=names, y=par, name="attention + MLP", marker_color=colors.COMPUTE),
                 go.Bar(x=names, y=rest, name="norms, dropout, residual", marker_color=SHARDED)])
mem.update_layout(barmode="stack", yaxis_title="bytes saved for backward, rank 0", height=380,
                  title=f"activation memory of one block, {n} ranks ({who}; SIMULATED {PRESET} run)")
sp_total = m["sp"]["parallel"] + m["sp"]["sequence"]
print(f"TP {par[0] + rest[0]:,} B, SP measured {sp_total:,} B, predicted {m['predicted_sp']:,.0f} B: "
      f"{sp_total / (par[0] + rest[0]):.2f}x of TP")
mem

# %% [markdown]
# With 4 ranks the rest shrinks to a quarter (measured 151,936 B against TP's 250,624 B, 0.61x):
# the saving grows with t, as the calculator said.
#
# ## Exercise: the `sp` lab
#
# Open `labs/sp.py` and replace each `raise NotImplementedError`:
#
# 1. the two collectives along the sequence and the two operators that pair them ("Two ways to
#    shard one block", "Same bytes");
# 2. the column- and row-parallel linears on shards ("Two ways to shard one block", "Two new
#    duties");
# 3. attention, MLP, the tagged norm and the block with its sharded dropout ("Two new duties",
#    "How much memory it saves");
# 4. the embedding, the model and the gradient sync ("The ends of the model").
#
# Each task's docstring is its spec; stuck, `workbook hint sp N` shows the next hint for task N.
#
# Run it with `workbook run sp --nproc 2 --link dgx-h100 --trace-dir runs/sp` (then open
# `runs/sp/report.html`), and re-run the cells above to see your own timeline. The grader checks
# your block and model against the single-device reference on several rank counts, reads the
# all-gathers and reduce-scatters from your trace, and measures your activation memory against
# what a TP block saves (predicted from the single-device block: lab 5 is graded on its own, and
# the vocab-parallel loss it needs is given in `workbook.tensor_parallel.mappings`).

# %%
check_your_work("sp")
