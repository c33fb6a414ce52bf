# %% [markdown]
# # Lesson 6 — Domino: hiding tensor-parallel communication
#
# In Megatron tensor parallelism (lesson 4) each sublayer computes `Y = X·A·B`. `A` is split by
# columns (q/k/v and attention, or fc1 and its activation), `B` by rows (`wo` or `fc2`), so each
# rank ends up with a *partial sum* of `Y`. An all-reduce adds the partial sums. The residual add
# and the next norm need the whole sum, so every rank waits for that all-reduce: two per block in
# the forward pass and two in the backward pass, all of them **on the critical path**. Wang et
# al. measured this communication at up to 43–47% of a GPT-3 13B training iteration on 1–4
# DGX-H100 nodes ([Domino, arXiv 2409.15241](https://arxiv.org/abs/2409.15241)).
#
# Domino breaks the dependency by cutting the work into independent pieces, so that one piece's
# all-reduce can travel while another piece computes. This lesson covers:
# 1. the schedule as a pure function (your `schedule`), and a *planner* that draws it for a
#    model size and a link preset;
# 2. the row (batch) split, and the two kinds of overlap it gives: inside a layer and across layers;
# 3. the backward pass, where autograd sets the order, and how a no-op function steers it;
# 4. the column split of `B`, as a contrast;
# 5. predicting, with a pencil, how much communication your schedule leaves exposed;
# 6. a real 2-rank run on the simulated link, planned against measured, read from the trace.

# %%
import ipywidgets as W
import plotly.graph_objects as go
import torch
from IPython.display import display

from workbook import link, trace
from workbook.trace import colors
from workbook.tensor_parallel import domino_measure, domino_plan
from workbook.grading.labs import load_lab
from workbook.lessons import (check_your_work, on_ranks, reference_lab, show_in, sized,
                             yours_reference_or_recorded)
from workbook.tensor_parallel.layer_stack import stages

RANKS, PRESET, P, BATCH = 2, "dgx-h100", 4, sized(16, in_tests=8)
MODEL = dict(hidden=1024, heads=16, ffn_hidden=4096, n_layers=1, seq_len=128, vocab_size=1024)
torch.set_num_threads(1)                      # a rank computes on one core: calibrate like one
LOCAL = link.measure_local_flops()
print(f"this CPU: {LOCAL / 1e9:.0f} GFLOP/s (one thread); model {MODEL}, batch {BATCH}")

SHOWN = yours_reference_or_recorded("domino")   # "yours", "reference", or "recorded" (a release)


# %% [markdown]
# ## The schedule: your `schedule` from `labs/domino.py`
#
# The lab's core is a pure function, `schedule(stages, p, lookahead, inter_layer)`: the order in
# which one forward pass runs its *events*. The stages are attention and MLP of every layer,
# then the head (final norm, LM head, loss); a *unit* is a stage of one batch chunk. Each unit
# has two events: a `prepare`, everything that must be done before the chunk's matmuls can
# start, and a `compute`, the chunk's share of the sublayer, whose all-reduce it leaves in flight
# for later computes to hide. The lab's executor, `domino_forward`, runs these events on the
# ranks; everything below plans and draws *your* order. Until your `schedule` runs, the
# reference's is used.
#
# > **Think it through** (the executor's events). A chunk's sublayer output is a partial sum
# > until its all-reduce has arrived: what is the latest event at which the chunk must wait for
# > it, and what else has to happen to that sum before the next sublayer's matmuls may read it?
# > And which event must create the backward pass's no-op (next sections), given that the
# > backward replays the forward's creation order in reverse?

# %%
mine, reference = load_lab("domino", "labs"), reference_lab("domino")
try:
    mine.schedule(stages(1), 2)
    schedule, whose = mine.schedule, "your schedule"
except Exception as exc:                             # noqa: BLE001 - not written yet, or broken
    schedule, whose = reference.schedule, "the REFERENCE schedule"
    print(f"Your schedule: {type(exc).__name__}: {exc}. This lesson uses the reference.")
for kind, stage, k in schedule(stages(1), 2, lookahead=1):
    print(f"{kind:<8} {stage} chunk {k}")

# %% [markdown]
# ## A planner: the schedule on paper
#
# Before running anything, we can predict a schedule. A rank has two resources: its **compute
# thread** and the **link**, which carries one operation at a time in issue order (as in lesson
# 3). Compute time is FLOPs divided by a FLOP rate; an all-reduce costs `link.op_time`
# (latency + bytes × bus factor / bandwidth). The planner (`workbook/domino_plan.py`) replays
# vanilla TP, the column split, and Domino *in the order of the schedule above*, and records
# when each resource is busy. The backward pass does the same matmuls twice (input and weight
# gradients), so it costs twice the forward FLOPs. Messages are fp32, as in the lab.
#
# The clock is this CPU's by default: the link calibrated to this machine, so the plan can be
# compared with a measured run. With `flops_rate` = the preset's TFLOP/s and the link made for that
# rate (`link.make_link(preset, rate)`), it becomes the real hardware's clock.

# %%
SETUP = dict(model=MODEL, batch=BATCH, p=P, flops_rate=LOCAL, lk=link.make_link(PRESET, LOCAL))


def plan(variant, **changes):
    """A planned step of `variant` with this lesson's settings (and `changes`)."""
    return domino_plan.plan(variant, schedule, **{**SETUP, **changes})


def plan_figure(pl, title):
    return domino_plan.plan_figure(pl, title, ranks=RANKS)


hidden_pct = domino_plan.hidden_pct


# %% [markdown]
# ## Vanilla TP: every all-reduce on the critical path
#
# One block (attention, MLP) and the LM head, planned on this CPU's clock for a DGX-H100 link. The
# compute row stops at every all-reduce (red): nothing else may run, because the next operation
# needs the sum.

# %%
vanilla = plan("vanilla")
plan_figure(vanilla, f"PLANNED vanilla TP — SIMULATED {PRESET}, {RANKS} ranks, this CPU's clock")

# %% [markdown]
# ## The row split: intra-layer and inter-layer overlap
#
# Cut the batch into `p` chunks. Rows of `X` do not interact in a linear layer, in a norm, or in
# attention (which mixes tokens of one sequence, never sequences of a batch), so chunk *k*'s
# result depends on chunk *k* alone. Two kinds of overlap follow:
#
# * **intra-layer**: chunk *k*'s all-reduce travels while chunk *k+1* of the *same* sublayer
#   computes;
# * **inter-layer**: the last chunk's all-reduce of one sublayer travels while chunk 0 starts the
#   *next* sublayer, since chunk 0's own all-reduce arrived long ago. (The paper calls attention
#   and MLP each a "layer".) At no layer boundary does every chunk have to stop.
#
# In `schedule`, `inter_layer=True` makes all stages one run of units; `inter_layer=False` (the
# intra-layer-only variant) ends every layer with a `wait` event per chunk, so that no
# all-reduce is in flight across a layer boundary.
#
# A chunk's forward all-reduce is started from inside the autograd graph (the lab's
# `StartAllReduce`, Megatron's `g` made asynchronous), and it overwrites its input *in place*
# after the function has returned. An autograd function that modifies an input in place must
# declare it to autograd, or autograd may keep a stale view of it for the backward pass.
#
# The paper reports Domino up to 1.3× faster than Megatron-LM for GPT models (1.2× for Llama), and
# close to the no-communication optimum in several settings. A port to nanotron measured over
# 99% of the forward communication hidden on one node.

# %%
domino = plan("domino")
print(f"planned step: vanilla {vanilla.t * 1e3:.0f} ms, Domino p={P} {domino.t * 1e3:.0f} ms, "
      f"no communication {plan('no_comm').t * 1e3:.0f} ms (this CPU's clock)")
plan_figure(domino, f"PLANNED Domino ({whose}), p={P} — SIMULATED {PRESET}, this CPU's clock")

# %% [markdown]
# Smaller chunks are not free: each all-reduce pays the link's latency again, and `p` of them
# carry the same bytes as one. The explorer further down lets you see this for several `p`.
#
# ## The backward pass: steering autograd
#
# In the backward pass the all-reduce belongs to Megatron's `f`: the gradient flowing into the
# column-parallel half is a partial sum, and the norm's backward needs the whole of it. We do not
# write the layer's backward by hand; autograd builds it from the forward. Two identity functions
# in the forward graph decide where the backward starts and waits:
#
# * `AsyncCopyToTP` (an asynchronous `f`): in the backward it *starts* the all-reduce of the input
#   gradient and files the handle under a name such as `layer0.mlp.chunk3.bwd`;
# * `WaitInBackward`, a **no-op** placed just before it (the paper's no-operation module): in the
#   backward it *waits* for that handle, right before the norm's backward.
#
# On CPU, autograd runs the ready node created last first, so the backward runs roughly in the
# **reverse of the order in which the forward created its nodes**. Whatever the forward creates
# between the no-op and `f` runs, in the backward, between the start and the wait. A plain loop
# creates nothing there, and the backward waits right after it starts. The schedule therefore
# **prepares one unit ahead** (lookahead 1): the prepare of unit *n+1* (normalise, insert the
# no-op) comes right before the compute of unit *n*, so that in the backward unit *n*'s gradient
# computation hides unit *n+1*'s all-reduce. The forward pays for it: an all-reduce now hides behind `p − 1 − lookahead` later
# chunks of its own sublayer instead of `p − 1`, so choose `p ≥ 3` (and always `p > lookahead`).
# The Domino authors point out the same tension: the best forward and backward orders conflict.
# The planner below calls your `schedule` with each lookahead: if it ignores the argument, the
# three lines are the same.

# %%
for la in (0, 1, 2):
    pl = plan("domino", lookahead=la)
    print(f"lookahead {la}: planned hidden forward {hidden_pct(pl, 'fwd'):5.1f}%, "
          f"backward {hidden_pct(pl, 'bwd'):5.1f}%, step {pl.t * 1e3:.0f} ms")

# %% [markdown]
# ## The handle registry
#
# Handles must survive from the forward pass (or from one backward node) to a later wait. The lab
# keeps them in a `HandleRegistry`, keyed by readable names: starting a key twice, waiting on an
# unknown key, or ending a step with an open handle is an error that names the key. The learner's
# `labs/domino.py` is used below if its parts are written, else the reference.

# %%
PretendWork = domino_measure.PretendWork
problem = domino_measure.registry_problem(mine)
lab, whose_registry = (mine, "your labs/domino.py") if problem is None else \
    (reference, "the REFERENCE solutions/domino.py")
if problem:
    print(f"Your HandleRegistry: {problem}. This lesson uses the reference, solutions/domino.py.")

reg = lab.HandleRegistry()
for k in range(2):
    reg.put(lab.handle_key(0, "mlp", k, "fwd"), PretendWork(f"chunk {k}"))
print("open:", reg.pending())
reg.wait("layer0.mlp.chunk0.fwd")
try:
    reg.check_empty()
except RuntimeError as exc:
    print("check_empty():", exc)
reg.wait("layer0.mlp.chunk1.fwd")
reg.check_empty()
print(f"registry of {whose_registry}: empty at the end")

# %% [markdown]
# ## The contrast: splitting B by columns
#
# Domino can instead split `B`'s *output features* into `p` pieces: piece *j*'s all-reduce
# travels while piece *j+1* of `X·A·B` is computed. Within the layer that overlaps too. But the next
# norm needs **every feature of every token**, so all pieces must arrive before the residual add:
# each sublayer ends with a wait, and only part of the communication can hide (the last piece's
# never does). That is why the paper's main method is the batch split, whose chunks do not need
# to meet at layer boundaries.

# %%
column = plan("column")
print(f"planned forward: column split {column.fwd_end * 1e3:.0f} ms, hides "
      f"{hidden_pct(column, 'fwd'):.0f}%; row split {domino.fwd_end * 1e3:.0f} ms, hides "
      f"{hidden_pct(domino, 'fwd'):.0f}%")
plan_figure(column, f"PLANNED column split of B, p={P}, forward only — SIMULATED {PRESET}")


# %% [markdown]
# ## Predict before you run
#
# The planner replays a schedule; you can also reason it out with a pencil, and the lab asks you
# to (`predict_exposed_ms`): how much communication does *your* Domino step leave exposed, that
# is, how long does the link carry an all-reduce while the rank computes nothing?
#
# The model is the one of lesson 2 ("The alpha–beta model") and lesson 7. An operation on the
# link costs its latency `α` (`link.latency_s`) plus the bytes it moves over the bandwidth
# (`link.bandwidth_Bps`). A ring all-reduce on `n` ranks moves the *bus* bytes, not the payload:
# each byte of the message crosses the link `2(n−1)/n` times. A compute costs its FLOPs
# (lesson 7, "Compute: FLOPs of one layer") over the measured matmul rate (`link.local_flops`).
# The link carries one operation at a time, in issue order, and an all-reduce is *exposed* for
# as long as it is in flight while the rank's compute thread has nothing to do.
#
# **A worked example, for a different figure: one all-reduce of vanilla TP.** Vanilla TP sums a
# sublayer's output for the whole batch at once: every sequence, every token, every hidden
# feature, in fp32. The cell below prices that one message from the link's figures alone, for
# this lesson's model and for a wider one on a faster clock, and sets it beside the sublayer's
# compute of the same batch. Domino's question is different: it cuts that message into chunks,
# and asks which of them find nothing to hide behind.
#
# The rule to reason with: an all-reduce is hidden when the computes between its start and its
# wait last at least as long as it. Call a setting **compute-bound** when every chunk's compute of
# a stage (the head's included) outlasts one chunk's all-reduce; the lab's grader only uses such
# settings, with `p ≥ 3`.
#
# > **Think it through.** (1) In a compute-bound setting, which all-reduces of one step have
# > *no* compute between their start and their wait? Look at the ends of the runs of units, in
# > the forward and in the backward pass, remembering the order in which autograd replays the
# > forward. (2) What changes in that count when `inter_layer=False` closes every layer with a
# > wait? (3) What does one of those exposed all-reduces cost: what is in its message?

# %%
def vanilla_all_reduce(lk, model, batch, ranks):
    """One vanilla-TP all-reduce (a sublayer's output, the whole batch, fp32), priced by hand."""
    payload = 4 * batch * model["seq_len"] * model["hidden"]          # bytes of the message
    bus = payload * 2 * (ranks - 1) / ranks                            # what the ring moves
    return lk.latency_s + bus / lk.bandwidth_Bps


demo = dict(model=dict(hidden=2048, heads=16, ffn_hidden=8192, n_layers=2, seq_len=256, vocab_size=8192),
            batch=8, p=4)
demo_link = link.make_link(PRESET, 100e9)             # a fixed calibration: 100 GFLOP/s
for name, model, batch, rate, lk in (("this lesson's model on this CPU", MODEL, BATCH, LOCAL, SETUP["lk"]),
                                     ("a wider model at 100 GFLOP/s", demo["model"], demo["batch"], 100e9,
                                      demo_link)):
    ar = vanilla_all_reduce(lk, model, batch, RANKS)
    mlp = sum(domino_plan.sublayer_flops(model, batch * model["seq_len"], RANKS)["mlp"]) / rate
    print(f"{name}: one vanilla all-reduce {ar * 1e3:.1f} ms (alpha {lk.latency_s * 1e3:.2f} ms), "
          f"the MLP's compute of the same batch {mlp * 1e3:.1f} ms")
for inter in (True, False):
    try:
        mine_ms = f"{mine.predict_exposed_ms(demo_link, demo['model'], demo['batch'], demo['p'], RANKS, inter):.1f} ms"
    except Exception as exc:                         # noqa: BLE001 - not written yet, or broken
        mine_ms = f"- ({type(exc).__name__}: predict_exposed_ms is not written yet, or fails)"
    print(f"the wider model, p={demo['p']}, inter_layer={inter}: your prediction {mine_ms}")

# %% [markdown]
# Your prediction is checked after you make it: the grader compares it with the planner on
# settings you do not know in advance and names the term of a known wrong derivation, and the
# report (`workbook run domino`) prints it beside the planner's figure and the exposed time
# measured in your own run. Where a setting is not compute-bound (this lesson's own model on a
# CPU, where the latency, scaled up by the slow-motion calibration, makes small chunks'
# all-reduces long), a count of unhidden all-reduces is only a lower bound: the planner also
# charges the link time that queues behind computes too short to hide it.

# %% [markdown]
# ## Planned vs measured: a real run on 2 ranks
#
# First a quick numerical check that the implementation agrees with vanilla TP (fp64, a tiny
# model). Then on 2 ranks, over the simulated link, two rounds of one step each of vanilla TP, no
# communication (vanilla's compute with every collective skipped: the optimum) and Domino: a
# warm-up round, then one under the profiler. Just before measuring, the link is recalibrated to
# the CPU's speed at that moment, as the grader does (a busy machine slows compute, not the
# modelled link).

# %%
try:
    status = on_ranks(domino_measure.agrees, RANKS, "labs", timeout=60)[0]
except Exception as exc:                             # noqa: BLE001 - e.g. a hang: use the reference
    status = f"did not finish ({type(exc).__name__}: {exc})"
impl = "labs" if status == "ok" else "solutions"
if status != "ok":
    print(f"Your domino_forward: {status}. The measurements below use the REFERENCE.")
who = "your code" if impl == "labs" else "REFERENCE"
print(f"check against vanilla TP: {status}; measuring {who}")


def run_measured(p, preset, model, batch=BATCH):
    return domino_measure.run_measured(impl, p, preset, model, batch, ranks=RANKS)


res, run_dir = run_measured(P, PRESET, MODEL)
LOCAL = res[0]["local_flops"]
dom_run = trace.load_run(run_dir / "domino")
trace.timeline_figure(dom_run, title=f"MEASURED Domino ({who}), p={P} — SIMULATED {PRESET}, 2 CPU ranks")

# %% [markdown]
# The same step as planned, with the link calibrated to the rate the ranks just measured:

# %%
plan_figure(plan("domino", lk=link.make_link(PRESET, LOCAL), flops_rate=LOCAL),
            f"PLANNED Domino ({whose}), p={P} — SIMULATED {PRESET}, calibrated to {LOCAL / 1e9:.0f} GFLOP/s")

# %% [markdown]
# The shapes agree; the measured compute is slower than planned: chunked matmuls, norms, softmax
# and GELU reach only part of the calibrated matmul rate, and other processes share the two
# cores. (Slower compute hides communication *more* easily.) The overlap read from the trace, per
# pass (communication issued in that pass, hidden behind any compute).
#
# One more thing the plan cannot show: the two ranks drift apart. Over a backward pass of a few
# seconds, one CPU rank can fall a few hundred ms behind the other; the rank ahead then reaches a
# wait whose all-reduce its peer has not even issued, and blocks, however good its schedule. The
# timeline draws that time on the yellow `link: peers late` row, and `skew_us` counts the exposed
# communication it caused. On GPUs the same straggler effect shows as long NCCL kernels. The
# grader holds only the rest against your schedule:

# %%
van_run = trace.load_run(run_dir / "vanilla_tp")
for name, run in (("vanilla TP", van_run), (f"Domino p={P}", dom_run)):
    for r in run.ranks:
        fwd, bwd = (trace.overlap(run, rank=r, within=ph) for ph in ("forward", "backward"))
        print(f"{name:<12} rank {r}: forward {fwd.overlap_pct:5.1f}% hidden, backward "
              f"{bwd.overlap_pct:5.1f}% hidden ({bwd.overlap_pct_ex_skew:5.1f}% not counting "
              f"{bwd.skew_us / 1e3:.0f} ms behind a late peer), "
              f"exposed {trace.exposed_comm_us(run, rank=r) / 1e3:6.0f} ms")

# %%
lk_now = link.make_link(PRESET, LOCAL)
labels = {"vanilla_tp": ("vanilla", "vanilla TP"), "domino": ("domino", f"Domino p={P}"),
          "no_comm": ("no_comm", "no communication")}
bars = {"compute": [], "exposed": [], "idle": []}            # per (variant, planned/measured)
for variant, (variant_plan, _) in labels.items():
    planned = domino_plan.busy_ms(plan(variant_plan, lk=lk_now, flops_rate=LOCAL))
    slowest = max(trace.summary(run_dir / variant)["ranks"], key=lambda r: r["step_us"])
    ms = [*planned, slowest["compute_us"] / 1e3, slowest["exposed_comm_us"] / 1e3]
    bars["compute"] += [ms[0], ms[2]]
    bars["exposed"] += [ms[1], ms[3]]
    bars["idle"] += [0.0, slowest["step_us"] / 1e3 - ms[2] - ms[3]]
x = [[n for _, n in labels.values() for _ in (0, 1)], ["planned", "measured"] * len(labels)]
fig = go.Figure([go.Bar(name=name, x=x, y=bars[key], marker_color=colors.color(key))
                 for key, name in (("compute", "compute"), ("exposed", "exposed communication"),
                                   ("idle", "other waiting (the other rank, gloo)"))])
fig.update_layout(title=f"one training step, slowest rank — SIMULATED {PRESET}, {who}",
                  yaxis_title="ms", barmode="stack", height=380)
fig

# %% [markdown]
# The red part is what Domino is for: most of the link time now runs under compute. Compare the
# blue parts too. Cutting the batch has costs the planner leaves out: each GEMM is `p` times
# smaller and runs less efficiently, and `p` times as many messages go through gloo, whose real
# work shares the two cores with the compute. With small chunks (try `p = 8` or a narrow model
# below) they can eat the gain. Vanilla TP may pay in grey as well: a synchronous all-reduce also
# waits for the slower rank, and on shared cores the ranks drift apart. Timings here are noisy
# (other processes share the machine): re-run the measuring cell, or use `workbook bench domino`
# for medians of several steps. On GPUs, the paper measured up to 1.3× over Megatron-LM.
#
# ## Explore
#
# Change the chunk count, the link and the model width (the batch above × 128 tokens, one
# block). The plan redraws at once. The button runs the real thing for those settings on 2 ranks
# (widths up to 2048; each step takes seconds) and draws the measured timeline beneath.

# %%
p_w = W.ToggleButtons(options=[2, 4, 8], value=P, description="chunks p")
preset_w = W.Dropdown(options=list(link.PRESETS), value=PRESET, description="link")
hidden_w = W.SelectionSlider(options=[512, 1024, 1536, 2048, 4096, 8192], value=MODEL["hidden"],
                             description="hidden")
sched_w = W.Dropdown(options=[("Domino (row split)", "domino"), ("Domino, intra-layer only", "domino_intra"),
                              ("column split of B", "column"), ("vanilla TP", "vanilla")],
                     value="domino", description="schedule")
clock_w = W.ToggleButtons(options=[("this CPU", "cpu"), ("real hardware", "hw")], description="clock")
button = W.Button(description="measure these settings", icon="play")
plan_out, run_out = W.Output(), W.Output()


def model_of(hidden):
    return dict(MODEL, hidden=hidden, heads=hidden // 64, ffn_hidden=4 * hidden)


def redraw(_=None):
    preset, model = preset_w.value, model_of(hidden_w.value)
    hw = clock_w.value == "hw"
    rate = link.PRESETS[preset].peak_tflops * 1e12 if hw else LOCAL
    lk = link.make_link(preset, rate)                # calibrated to `rate`: the chosen clock
    settings = dict(p=p_w.value, model=model, flops_rate=rate, lk=lk)
    plans = {s: plan(s, **settings) for s in ("vanilla", "domino", "no_comm")}
    pl = plans.get(sched_w.value) or plan(sched_w.value, **settings)
    clock = f"real {preset} clock" if hw else "this CPU's clock"
    title = f"PLANNED {sched_w.label}, p={p_w.value}, hidden {hidden_w.value} — SIMULATED {preset}, {clock}"
    show_in(plan_out,
            f"planned step ({clock}): " + ", ".join(f"{s} {q.t * 1e6:,.0f} µs" for s, q in plans.items())
            + f"; {sched_w.label} hides {hidden_pct(pl, 'fwd') or 0:.0f}% forward, "
            + (f"{hidden_pct(pl, 'bwd') or 0:.0f}% backward" if pl.t > pl.fwd_end else "(forward only)"),
            plan_figure(pl, title))


def on_click(_):
    if hidden_w.value > 2048:
        show_in(run_out, "That width would take minutes per step on this CPU: the planner only.")
        return
    show_in(run_out, "running 6 steps on 2 ranks ...")
    try:
        _, d = run_measured(p_w.value, preset_w.value, model_of(hidden_w.value))
    except Exception as exc:                 # said in the panel, where the button's result goes
        show_in(run_out, f"the run failed: {type(exc).__name__}: {exc}")
        return
    m_run = trace.load_run(d / "domino")
    show_in(run_out,
            ", ".join(f"rank {r}: {trace.overlap_pct(m_run, rank=r, within='forward'):.0f}% forward, "
                      f"{trace.overlap_pct(m_run, rank=r, within='backward'):.0f}% backward hidden"
                      for r in m_run.ranks),
            trace.timeline_figure(m_run, title=f"MEASURED Domino ({who}), p={p_w.value}, hidden "
                                  f"{hidden_w.value} — SIMULATED {preset_w.value}"))


for w in (p_w, preset_w, hidden_w, sched_w, clock_w):
    w.observe(redraw, names="value")
button.on_click(on_click)
redraw()
display(W.VBox([W.HBox([p_w, preset_w]), W.HBox([hidden_w, sched_w]), W.HBox([clock_w, button]),
                plan_out, run_out]))

# %% [markdown]
# Things to try: `p = 8` at hidden 1024 (latency per message, and chunks too small to hide it);
# the `pcie-h100` link (no schedule can hide more communication than there is compute);
# "intra-layer only" (a wait at every block boundary); the real-hardware clock at hidden 8192.
#
# ## On a GPU: the NCCL stream
#
# With NCCL, `dist.all_reduce(t, async_op=True)` queues the collective on NCCL's own CUDA stream,
# ordered after the kernels that produced `t`; `work.wait()` makes the *compute stream* wait for
# it. Neither call blocks the host, so the code above needs no `torch.cuda.synchronize()`. One
# more setting matters: `CUDA_DEVICE_MAX_CONNECTIONS=1` gives the GPU a single hardware queue,
# so kernels start in the order the host launched them. The all-reduce launched after chunk *k*'s
# GEMM then runs alongside chunk *k+1*'s GEMMs instead of waiting behind them. Megatron sets it
# for the same reason. It must be set before CUDA starts; the lab module sets it on import:

# %%
import os  # noqa: E402

print("CUDA_DEVICE_MAX_CONNECTIONS =", os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
      "| CUDA available:", torch.cuda.is_available())

# %% [markdown]
# ## Exercise: the `domino` lab
#
# Open `labs/domino.py`: its task list names what to build and where this lesson explains it;
# each task's docstring is its contract. In the order of the file:
#
# 1. the handle registry (this lesson's "The handle registry");
# 2. the forward start of a chunk's all-reduce, and the two backward functions that start and wait
#    ("The row split", "The backward pass: steering autograd");
# 3. `schedule`: the order of the events, graded at once without ranks (the grader names the
#    first event out of place); the drawings above then show your order;
# 4. the executor's three events, which `domino_forward` runs in your schedule's order;
# 5. `column_split_forward`: the contrast, forward only;
# 6. `predict_exposed_ms`: the exposed communication of your step, before you run it ("Predict
#    before you run").
#
# Stuck? `workbook hint domino N` shows the next of three hints for task N. At the `challenge`
# level (`workbook assign --level challenge`) the start and wait functions, the schedule and the
# executor are one task: a Domino layer written whole from their docstrings.
#
# Run it on the simulated link and open the report: `workbook run domino --nproc 2 --link
# dgx-h100 --trace-dir runs/domino` (then `runs/domino/report.html`). The grader checks your
# schedule against the orders that hide communication (several layer counts, `p` and
# lookaheads); losses, hidden states and every gradient against the single-device reference
# (TP 2 and 4, GPT and Llama, p = 2 and 4); that the registry is empty after each step; your
# prediction against the planner on several links and shapes; and, from your trace, that at
# least 70% of the forward and 60% of the backward communication hides behind compute. The
# report (`workbook run domino`) prints your prediction beside the planner's and the measurement.
# `workbook bench domino` then compares vanilla TP, sequence-parallel TP, Domino and the
# no-communication optimum on a larger model.

# %%
check_your_work("domino")
