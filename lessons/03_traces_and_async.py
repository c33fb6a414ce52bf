# %% [markdown]
# # Lesson 3 — Traces, asynchronous collectives and the simulated link
#
# Overlap is a claim about *time*: "this all-reduce ran while that matmul ran". The only honest
# way to check such a claim is to record what each rank did and when. That is what a
# **profiler trace** is: PyTorch's profiler writes every operator (and, on a GPU, every kernel)
# with its start and duration, in the Chrome trace format that Perfetto and `chrome://tracing`
# open. The course reads these traces with `workbook.trace`.
#
# This lesson:
# 1. why a CPU run needs a **simulated link** to show anything, and what its presets are;
# 2. capture a trace of a synchronous all-reduce followed by compute, and read it;
# 3. the same step with an **asynchronous** all-reduce overlapped with the compute, and the
#    overlap read from the trace.

# %%
import tempfile
from pathlib import Path

import ipywidgets as W
import plotly.graph_objects as go
from IPython.display import display

from workbook import link, trace
from workbook.trace import colors
from workbook.lessons import check_your_work, on_ranks, show_in

RANKS = 2
PRESET = "dgx-h100"

# %% [markdown]
# ## The link, and why it is simulated
#
# Two CPU processes on one machine exchange tensors through memory: an all-reduce costs about
# as much as a copy, so there is no communication time to hide. On a DGX-H100 the same bytes
# cross NVLink, and communication is a large share of a tensor-parallel step.
#
# The workbook therefore wraps gloo in a *link model* (`workbook.link`): each operation gets a
# modelled duration `latency + bytes × bus factor / bandwidth`; the link carries one operation
# at a time, in issue order; and the modelled time is paid inside `work.wait()`. Work done
# between starting an operation and waiting on it really runs during the modelled transfer.
#
# A CPU computes roughly ten thousand times slower than an H100, so each preset is *calibrated*:
# the bandwidth is scaled down (and the latency up) by the ratio of this machine's matmul rate
# to the GPU's. The ratio of communication to compute is the real machine's; everything just
# runs in slow motion. Every number measured on it is a **simulated** number.

# %%
local = link.measure_local_flops()
rows = []
for name, p in link.PRESETS.items():
    sim = link.make_link(name, local)
    rows.append((name, p.bandwidth_GBps, p.latency_us, sim.bandwidth_Bps / 1e6, sim.latency_s * 1e3,
                 p.description))
print(f"this CPU: {local / 1e9:.0f} GFLOP/s (fp32 matmul, one thread)\n")
print(f"{'preset':<12}{'GB/s':>7}{'µs':>6}  |{'sim MB/s':>10}{'sim ms':>8}  hardware")
for r in rows:
    print(f"{r[0]:<12}{r[1]:>7.0f}{r[2]:>6.0f}  |{r[3]:>10.1f}{r[4]:>8.2f}  {r[5]}")

# %% [markdown]
# How long does an all-reduce take on each *real* interconnect, and how much compute would
# hide it? Choose the ranks and the buffer size (a tensor-parallel layer's activations are
# `batch × sequence × hidden × 2` bytes: 8 × 4096 × 8192 × 2 = 512 MiB).

# %%
mib = W.IntSlider(value=64, min=1, max=1024, description="MiB")
n_hw = W.IntSlider(value=8, min=2, max=8, description="ranks")
hw_out = W.Output()


def hide_what(change=None):
    size = mib.value << 20
    names = list(link.PRESETS)
    ms, tflop = [], []
    for name in names:
        p = link.PRESETS[name]
        t = p.latency_us * 1e-6 + size * link.bus_factor("all_reduce", n_hw.value) / (p.bandwidth_GBps * 1e9)
        ms.append(t * 1e3)
        tflop.append(t * p.peak_tflops)
    fig = go.Figure(go.Bar(x=names, y=ms, marker_color=colors.COMMUNICATION,
                           text=[f"hidden by {f:.1f} TFLOP" for f in tflop], textposition="outside",
                           hovertemplate="%{x}: %{y:.2f} ms<extra></extra>"))
    fig.update_layout(title=f"all-reduce of {mib.value} MiB on {n_hw.value} ranks (real hardware, "
                      "modelled)", yaxis_title="ms", height=380)
    show_in(hw_out, fig)


for w in (mib, n_hw):
    w.observe(hide_what, names="value")
hide_what()
display(W.VBox([W.HBox([mib, n_hw]), hw_out]))


# %% [markdown]
# ## A traced step: all-reduce, then compute
#
# The function below runs on every rank. It all-reduces a 256 KiB "gradient", then does some
# independent compute (a chain of matrix products lasting about twice the modelled all-reduce).
# `rank_trace(run_dir)` profiles the block and writes `rank{r}.trace.json` per rank, with the
# link's modelled operations added on a track of their own, named `link`.

# %%
def step(run_dir: str, overlap: bool) -> dict:
    import time

    import torch
    import torch.distributed as dist
    from torch.profiler import record_function

    from workbook import link
    from workbook.trace.capture import rank_trace
    grad = torch.ones(1 << 16)
    comm_s = link.current_link().op_time("all_reduce", grad.numel() * 4, dist.get_world_size())
    a = torch.randn(384, 384) / 20

    def compute():
        b, t0 = a, time.perf_counter()
        while time.perf_counter() - t0 < 2 * comm_s:
            b = torch.tanh(a @ b)
        return b

    dist.barrier()
    with rank_trace(run_dir, lab="lesson3"):
        t0 = time.perf_counter()
        with record_function("step"):
            if overlap:
                work = dist.all_reduce(grad, async_op=True)   # returns at once
                compute()                                     # runs during the transfer
                work.wait()                                   # the sum is needed now
            else:
                dist.all_reduce(grad)                         # blocks for the transfer
                compute()
        elapsed = time.perf_counter() - t0
    return {"step_ms": elapsed * 1e3, "modelled_ms": comm_s * 1e3, "ok": bool((grad == 2).all())}


runs = Path(tempfile.mkdtemp(prefix="lesson3-"))
sync = on_ranks(step, RANKS, str(runs / "sync"), False, link=PRESET)
print(sync)

# %% [markdown]
# ## Reading the trace
#
# `trace.load_run(dir)` loads every rank's file; `trace.timeline_figure` draws one row per rank
# and thread: compute in blue, communication in orange (the `link` row), the compute thread's
# *waits* in purple, and in red the **exposed** communication: time in which the rank
# communicates and computes nothing. `trace.summary` gives the numbers.

# %%
sync_run = trace.load_run(runs / "sync")
trace.timeline_figure(sync_run, title="synchronous all-reduce, then compute (SIMULATED dgx-h100)")

# %%
for r in trace.summary(sync_run)["ranks"]:
    print(f"rank {r['rank']}: step {r['step_us'] / 1e3:.1f} ms, comm {r['comm_us'] / 1e3:.1f} ms, "
          f"overlap {r['overlap_pct']:.0f}%, exposed {r['exposed_comm_us'] / 1e3:.1f} ms")

# %% [markdown]
# Every microsecond of the all-reduce is exposed: the rank waits, then computes.
#
# ## The same step, asynchronous
#
# `dist.all_reduce(t, async_op=True)` returns a *work* handle immediately; `work.wait()` blocks
# until the result is there. Compute that does not touch `t` can run in between. (Do not read
# or write `t` before the wait: on a GPU it is being reduced in place, and you would see a mix
# of old and new values.)

# %%
overlapped = on_ranks(step, RANKS, str(runs / "async"), True, link=PRESET)
async_run = trace.load_run(runs / "async")
print(f"step time, rank 0: synchronous {sync[0]['step_ms']:.1f} ms, "
      f"overlapped {overlapped[0]['step_ms']:.1f} ms (modelled all-reduce {sync[0]['modelled_ms']:.1f} ms)")
for r in range(RANKS):
    print(f"rank {r}: {trace.overlap_pct(async_run, rank=r):.0f}% of communication hidden, "
          f"{trace.exposed_comm_us(async_run, rank=r) / 1e3:.1f} ms exposed")
trace.timeline_figure(async_run, title="async all-reduce overlapped with compute (SIMULATED dgx-h100)")

# %% [markdown]
# ## A pipeline of all-reduces
#
# One all-reduce hides only if independent compute is at hand when it starts. Often the compute
# that follows needs the result: in tensor parallelism a row-parallel layer's output is summed
# over the ranks, and the next layer reads the sum. The way out is to cut the batch into chunks.
# The chunks are independent of each other, so while chunk *k*'s output travels, chunk *k+1* can
# be computed; chunk *k*'s sum is needed only later. Each chunk's all-reduce then hides behind
# the next chunk's compute. That is the heart of Domino (lesson 6) and of much of what follows.
#
# Two constraints shape such a pipeline. The link carries one operation at a time, in issue
# order, so a second all-reduce started while the first still travels simply queues behind it.
# And every handle must be waited on before its sum is read, but not earlier than needed: a
# wait issued too soon turns the pipeline back into the synchronous step above.
#
# **Think it through.** Draw the timeline of three chunks on one rank, a compute row and a link
# row. Which pieces have nothing running beside them? After chunk *k*'s compute has ended and
# its all-reduce has started, which handle can you afford to wait on, and which one is still
# travelling when the loop is over?
#
# ## Predicting the pipeline
#
# The step time of such a pipeline can be predicted from three figures of the link and the
# shapes, before anything runs. A simulated link is a `workbook.link.Link`; its fields are the
# alpha-beta model's figures on this machine: `latency_s` (alpha, seconds per operation) and
# `bandwidth_Bps` (bus bytes per second), and `local_flops`, the matmul rate this machine
# measured when the link was calibrated. The model has three parts:
#
# * **compute**: a matmul of an $[m, k]$ by a $[k, n]$ matrix does $m\,k\,n$ multiply-adds,
#   and counts **2 FLOPs per multiply-add**; its time is its FLOPs over the measured rate;
# * **communication**: lesson 2's model, $\alpha + \text{bus bytes} / \text{bandwidth}$, where
#   the bus bytes are the payload times the collective's bus factor (`link.bus_factor`, the
#   factor the explorer above used), not the payload itself (float32: 4 bytes per element);
# * **the schedule**: which of those pieces run one after the other, and which run side by
#   side, so that only the longer of the two counts. A piece is **exposed** when nothing runs
#   beside it: the step pays for it in full.
#
# Which term dominates changes with the link and the shapes: on the calibrated links alpha is
# tens of milliseconds, so small messages are all latency.
#
# ### A worked example: the chunks without overlap
#
# Take the *synchronous* way of running chunks: each chunk is computed, then its all-reduce is
# issued and waited on before the next chunk starts. Nothing ever runs side by side, so every
# piece is exposed and the step is simply the sum of all of them: $c \times (t_\text{compute} +
# t_\text{all-reduce})$ for $c$ chunks. Here it is for three chunks of $[128, 2048]$ through a
# $[2048, 2048]$ weight on two ranks of the simulated link:

# %%
sim = link.make_link(PRESET, local)
print(sim.label)
print(f"latency_s = {sim.latency_s * 1e3:.2f} ms, bandwidth_Bps = {sim.bandwidth_Bps / 1e6:.2f} MB/s, "
      f"local_flops = {sim.local_flops / 1e9:.1f} GFLOP/s")

n_ex, c_ex, rows_ex, d_ex = 2, 3, 128, 2048
t_compute = 2 * rows_ex * d_ex * d_ex / sim.local_flops                      # FLOPs over the rate
payload = 4 * rows_ex * d_ex                                                 # one output, float32
t_comm = sim.latency_s + payload * link.bus_factor("all_reduce", n_ex) / sim.bandwidth_Bps
print(f"one chunk: compute {t_compute * 1e3:.1f} ms, all-reduce {t_comm * 1e3:.1f} ms "
      f"({payload / 2**20:.1f} MiB payload)")
print(f"synchronous, {c_ex} chunks: {c_ex * (t_compute + t_comm) * 1e3:.1f} ms, all of it exposed")

# %% [markdown]
# The pipelined schedule runs some of these pieces side by side, and that is the figure the lab
# asks you to predict. **Think it through.** In your timeline of the pipeline, which compute and
# which all-reduce are exposed whatever the chunk sizes? Between them, what does one step of the
# pipeline cost when the compute is longer than the all-reduce, and when it is shorter? Check
# your answer on the example above (is the pipeline faster, and by how much?), then against the
# report: it prints your number beside the model's and the measured step.

# %% [markdown]
# ## Explore
#
# The explorer shows any run: pick ranks, zoom in, read the metrics per rank. The same files
# open in [Perfetto](https://ui.perfetto.dev) (`workbook trace merge DIR merged.json` makes one
# file for all ranks) and as a standalone HTML report (`workbook trace report DIR`).

# %%
trace.explorer(async_run)

# %% [markdown]
# ## Exercise: the `async_overlap` lab
#
# Open `labs/async_overlap.py`: its docstrings are the spec of three tasks, the overlapped
# all-reduce of "The same step, asynchronous", the pipeline of "A pipeline of all-reduces", and
# the pipeline's predicted step time of "Predicting the pipeline". Stuck? `workbook hint
# async_overlap 1` shows one hint at a time.
#
# Try it with `workbook run async_overlap --nproc 2 --link dgx-h100 --trace-dir runs/async`
# (then open `runs/async/report.html`). The grader checks your numbers against the synchronous
# all-reduce on 1–4 ranks, reads from your trace that at least 70% of the communication
# hides behind compute on the simulated DGX-H100 link, and compares your prediction with the
# model on several links and shapes. A grader's spy delivers an async result only when you
# wait on it, as a GPU would, so forgetting a wait shows up as wrong numbers.

# %%
check_your_work("async_overlap")
