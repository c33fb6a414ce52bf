# %% [markdown]
# # Lesson 2 — The ring all-reduce
#
# How does an all-reduce of a 1 GB gradient finish quickly on 8 GPUs? Not by sending everything
# to one rank: that rank's link would carry `(n-1)` GB in and out. The **ring** algorithm keeps
# every link equally busy. The ranks stand in a circle, each talks only to its right-hand
# neighbour, and the buffer is cut into `n` chunks:
#
# 1. **reduce-scatter** phase, `n-1` steps: in each step every rank sends one chunk to the right
#    and adds the chunk arriving from the left into its own copy. After `n-1` steps, rank *r*
#    holds the complete sum of chunk `(r+1) mod n`;
# 2. **all-gather** phase, `n-1` more steps: the finished chunks travel around the ring once
#    more, this time copied, not added.
#
# In every step a rank sends and receives at the same time, so both messages are started
# without blocking (lesson 1, "Building them from messages") and waited for together. And a
# receive overwrites its destination, while in phase 1 the arriving chunk must be *combined*
# with the rank's own copy, not replace it.
#
# **Think it through.** In phase 1, where can the arriving chunk land so that nothing the rank
# still needs is overwritten, and how large must that place be when `n` does not divide the
# buffer? Why can phase 2 do without it?
#
# Each rank sends `2(n-1)` messages of `S/n` bytes: `2(n-1)/n · S` in total, *whatever* `n` is.
# That number is the bus factor of lesson 1.

# %%
import math

import ipywidgets as W
import plotly.graph_objects as go
from IPython.display import display

from workbook.trace import colors
from workbook.lessons import check_your_work
from workbook.lessons import live_output


# %% [markdown]
# ## Step through the ring
#
# Each cell below is one chunk on one rank; its label lists the ranks whose contributions it
# already contains. The arrows mark what is sent during the chosen step. Drag the slider.

# %%
def ring_states(n: int) -> list[dict]:
    """The state before each step (and after the last): contents[r][c] = ranks summed in."""
    contents = [[{r} for _ in range(n)] for r in range(n)]
    states = []
    for step in range(2 * (n - 1)):
        reduce_phase = step < n - 1
        s = step if reduce_phase else step - (n - 1)
        sends = [(r, (r - s) % n if reduce_phase else (r + 1 - s) % n) for r in range(n)]
        states.append({"contents": [[set(c) for c in row] for row in contents], "sends": sends,
                       "phase": "reduce-scatter" if reduce_phase else "all-gather", "step": step})
        new = [[set(c) for c in row] for row in contents]
        for r, c in sends:
            right = (r + 1) % n
            new[right][c] = contents[right][c] | contents[r][c] if reduce_phase else set(contents[r][c])
        contents = new
    states.append({"contents": contents, "sends": [], "phase": "done", "step": 2 * (n - 1)})
    return states


def ring_figure(n: int, step: int):
    st = ring_states(n)[step]
    z = [[len(c) for c in row] for row in st["contents"]]
    text = [["+".join(map(str, sorted(c))) for c in row] for row in st["contents"]]
    fig = go.Figure(go.Heatmap(z=z, text=text, texttemplate="%{text}", zmin=1, zmax=n,
                               colorscale=[[0, "#f2f2f2"], [1, colors.COMPUTE]], showscale=False,
                               xgap=3, ygap=3, hovertemplate="rank %{y}, chunk %{x}<extra></extra>"))
    for r, c in st["sends"]:
        right = (r + 1) % n
        fig.add_annotation(x=c, y=right, ax=c, ay=r, xref="x", yref="y", axref="x", ayref="y",
                           showarrow=True, arrowhead=3, arrowwidth=2, arrowcolor=colors.COMMUNICATION,
                           standoff=8, startstandoff=8)
    what = {"reduce-scatter": "send one chunk right, add the incoming one",
            "all-gather": "send a finished chunk right, copy the incoming one",
            "done": "every rank holds every chunk, fully summed"}[st["phase"]]
    title = (f"{n} ranks, step {st['step']} of {2 * (n - 1)} ({st['phase']}): {what}"
             if st["phase"] != "done" else f"{n} ranks, after {2 * (n - 1)} steps: {what}")
    fig.update_layout(title=title, height=120 + 55 * n, xaxis=dict(title="chunk", dtick=1),
                      yaxis=dict(tickvals=list(range(n)), ticktext=[f"rank {r}" for r in range(n)],
                                 autorange="reversed"), margin=dict(l=10, r=10, t=60, b=40))
    return fig


ranks = W.IntSlider(value=4, min=2, max=8, description="ranks")
step = W.IntSlider(value=0, min=0, max=2 * (ranks.value - 1), description="step")


def ring_view():
    step.max = 2 * (ranks.value - 1)
    return ring_figure(ranks.value, min(step.value, step.max))


# live_output draws ring_view() now and again whenever a slider moves
ring_out = live_output(ring_view, (ranks, step))
display(W.VBox([W.HBox([ranks, step]), ring_out]))

# %% [markdown]
# ## The alpha–beta model
#
# A message of `m` bytes costs `α + m/β`: a fixed latency `α` (software, synchronisation, the
# first byte's trip) plus the bytes at bandwidth `β`. An algorithm made of rounds, in which the
# messages of one round travel side by side over different links, costs the sum of its rounds,
# each priced at its largest message. So pricing an algorithm is counting: how many rounds, and
# how many bytes in the largest message of each.
#
# **A worked example: the naive gather** of lesson 1. The root receives one chunk of `S/n`
# bytes from each of the other `n-1` ranks, one after another (its link carries them in turn):
#
# $$T_\text{gather} = (n-1)\left(\alpha + \frac{S}{n\,\beta}\right)$$
#
# Both terms grow with `n`: `n-1` latencies, and almost the whole buffer through the root's link.
#
# The ring and the binomial-tree all-reduce (lesson 1: reduce to rank 0, then broadcast, each in
# `⌈log2 n⌉` rounds) are priced the same way, and the comparison is the point of this section.
# The ring pays more latencies than the tree (from four ranks on) and moves fewer bytes, so it
# is slower for small `S` and faster for large `S`; NCCL switches algorithms by size for exactly
# this reason. The size at which both times are equal is the **crossover**, and one line of
# algebra finds it. Two edge cases: when the ring pays no more latencies than the tree (two or
# three ranks) it is never the slower one, and a ring that saved nothing per byte would never
# win.
#
# **Think it through.** How many steps does the ring take in all, and how large is the message
# each rank sends in one step? How many rounds do the two trees take, and how large is each
# round's message? Which of the two times keeps growing with `n` in its bandwidth term, and
# which does not? And the naive all-reduce of lesson 1 (reduce to the root, then broadcast, the
# root handling one whole-tensor message at a time): how many messages does its root handle?
#
# The figure below draws the worked example, and your `ring_time` and `tree_time` from
# `labs/ring_allreduce.py` once you have written them (rerun the cell). The sliders start at
# NVLink-like values.

# %%
from workbook.grading.labs import load_lab


def gather_time(S, n, alpha, beta):                       # the worked example above
    return (n - 1) * (alpha + S / (n * beta))


def your_models():
    """Your lab's ring_time and tree_time, or None while they are not written yet."""
    try:
        lab = load_lab("ring_allreduce")
        lab.ring_time(1 << 20, 4, 1e-6, 1e9), lab.tree_time(1 << 20, 4, 1e-6, 1e9)
    except Exception:                                         # NotImplementedError, until written
        return None
    return lab.ring_time, lab.tree_time


sizes = [2 ** k for k in range(10, 31)]
n_pick = W.IntSlider(value=8, min=2, max=64, description="ranks")
alpha_us = W.FloatLogSlider(value=5, base=10, min=-1, max=2, description="α (µs)")
beta_gbs = W.FloatLogSlider(value=400, base=10, min=0, max=3, description="β (GB/s)")


def model():
    a, b, n = alpha_us.value * 1e-6, beta_gbs.value * 1e9, n_pick.value
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=sizes, y=[gather_time(S, n, a, b) * 1e6 for S in sizes],
                             name="naive gather (worked example)", line=dict(dash="dot")))
    mine = your_models()
    if mine is None:
        title = f"{n} ranks: write ring_time and tree_time in the lab, then rerun this cell"
    else:
        ring_time, tree_time = mine
        fig.add_trace(go.Scatter(x=sizes, y=[ring_time(S, n, a, b) * 1e6 for S in sizes],
                                 name="ring all-reduce (yours)"))
        fig.add_trace(go.Scatter(x=sizes, y=[tree_time(S, n, a, b) * 1e6 for S in sizes],
                                 name="tree all-reduce (yours)"))
        title = f"modelled time, {n} ranks"
    fig.update_layout(title=title, xaxis=dict(type="log", title="bytes"),
                      yaxis=dict(type="log", title="µs"), height=380)
    return fig


model_out = live_output(model, (n_pick, alpha_us, beta_gbs))
display(W.VBox([W.HBox([n_pick, alpha_us, beta_gbs]), model_out]))

# %% [markdown]
# ## Measured: algorithm and bus bandwidth
#
# nccl-tests reports two rates: **algbw** = `S / time`, and **busbw** = algbw × bus factor
# (`2(n-1)/n` for all-reduce), the rate the busiest link really ran at. busbw is the number to
# compare with the hardware's link bandwidth, and it should not depend on `n`.
#
# `workbook.communication.bandwidth_bench` measures it the same way. Here: the built-in all-reduce on 2 CPU ranks over
# the *simulated* DGX-H100 link (lesson 3 explains the simulation; the numbers are those of the
# CPU-calibrated model, not of a GPU). Small buffers are latency-bound; large ones approach the
# link's bandwidth.

# %%
from workbook.communication.bandwidth_bench import run_bench

doc = run_bench("all_reduce", 2, link="dgx-h100", sizes=[1 << k for k in (12, 15, 18, 20, 22)],
                iters=2, warmup=1, progress=False)
rows = doc["rows"]
fig = go.Figure()
fig.add_trace(go.Scatter(x=[r["size_bytes"] for r in rows], y=[r["busbw_gbps"] * 1e3 for r in rows],
                         mode="lines+markers", name="busbw", line=dict(color=colors.COMMUNICATION)))
fig.add_trace(go.Scatter(x=[r["size_bytes"] for r in rows], y=[r["algbw_gbps"] * 1e3 for r in rows],
                         mode="lines+markers", name="algbw", line=dict(color=colors.LINK, dash="dot")))
fig.update_layout(title=f"all_reduce on 2 CPU ranks, {doc['link']} (SIMULATED)",
                  xaxis=dict(type="log", title="bytes"), yaxis_title="MB/s", height=360)
fig

# %% [markdown]
# For your own ring (once the lab below is done), the same measurement from a terminal:
# `workbook bench all_reduce --nproc 4 --impl labs --link dgx-h100`.
#
# ## Exercise: build the ring
#
# Open `labs/ring_allreduce.py`: the reduce-scatter phase, the all-gather phase, then the whole
# ring, for any number of ranks and sizes that `n` does not divide, with `isend`/`irecv` only
# (the grader reads your calls and fails a ring built on the built-in all-reduce). Then the cost
# model. Each task's docstring is its spec; `workbook hint ring_allreduce N` shows the next hint
# for task `N` of the lab's task list. Grade it with `workbook grade --lab ring_allreduce`, or:

# %%
check_your_work("ring_allreduce")
