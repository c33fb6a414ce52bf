# %% [markdown]
# # Lesson 10 — Pipeline parallelism: schedules, deadlocks, and the p2p traffic in between
#
# Tensor parallelism (lessons 4 to 8) cuts every layer in pieces; data parallelism (lesson 9)
# copies the whole model. Pipeline parallelism (PP) cuts the model **by depth**: rank $s$ holds
# *stage* $s$, a run of consecutive layers, and hands its output to rank $s+1$. Nothing is summed
# over ranks. The price is idle time (stage 3 of four has nothing to do until stages 0 to 2 have
# worked on the input), and the remedy is to cut the batch into *micro-batches* that follow each
# other down the pipeline like cars on an assembly line.
#
# In order: (1) what crosses a stage boundary, next to TP; (2) GPipe and 1F1B as plain data, on
# paper, with their bubble and activation memory; (3) deadlock, on paper and on real ranks; (4)
# what the transfers cost on paper, and why only part of it hides in 1F1B; (5) your executors on
# 2 ranks, timed and traced; (6) the lab and its grader.

# %%
import tempfile
from pathlib import Path

import numpy as np
from IPython.display import display

from workbook import link, trace
from workbook.grading.labs import load_lab
from workbook.lessons import (check_your_work, on_ranks, reference_lab, sized,
                             yours_reference_or_recorded)
from workbook.measure import lesson_figures as lf
from workbook.measure.output import where_measured
from workbook.model import ModelConfig
from workbook.pipeline_parallel import (ScheduleError, activation_shape, bubble_fraction,
                                        check_schedule, peak_in_flight, simulate, stage_units)
from workbook.pipeline_parallel import pp_overlap_lesson as lesson

PRESET = "dgx-h100"
P, M = 4, 8                      # the pipeline drawn on paper: 4 stages, 8 micro-batches
STAGES, MICRO, ROWS = 2, 8, 1    # the one run on your ranks: 2 stages, 8 micro-batches of 1 row
MODEL = dict(hidden=256, heads=4, ffn_hidden=1024, n_layers=4, vocab_size=256,
             seq_len=sized(256, in_tests=128))          # the tests: 128 tokens a row
runs = Path(tempfile.mkdtemp(prefix="lesson10-"))

SHOWN = yours_reference_or_recorded("pp_overlap")   # "yours", "reference", or "recorded" (a release)


# %% [markdown]
# ## 1. Cutting the model by depth
#
# `stage_units` decides which layers each stage holds: the blocks split evenly, the embedding on
# the first stage, the final norm and the LM head on the last. `PipelineStage` builds them with the
# reference model's weights, so a pipeline can be checked against one device number for number.

# %%
for p, layers in ((2, 4), (4, 8), (3, 7)):
    print(f"{layers} blocks on {p} stages:")
    for s, units in enumerate(stage_units(layers, p)):
        print(f"   stage {s}: {', '.join(units)}")

# %% [markdown]
# What crosses the boundary between stage $s$ and $s+1$? Forward, the hidden state after stage
# $s$'s last block, one activation $[b, S, H]$ for a micro-batch of $b$ sequences of $S$ tokens;
# backward, its gradient. One tensor each way per micro-batch and boundary, *point-to-point*
# (`dist.send` / `dist.recv`, or `isend` / `irecv`).
#
# Compare Megatron TP over $t$ ranks: every block all-reduces an activation of the same shape
# twice in the forward and twice in the backward pass, each all-reduce putting $2\frac{t-1}{t}$
# times the buffer on each rank's wire. A stage of $L_s$ blocks under TP moves
# $4 L_s \cdot 2\frac{t-1}{t}$ activations per micro-batch; under PP, 2.

# %%
cfg = ModelConfig(**MODEL)
print(f"this lesson's model: one boundary tensor {activation_shape(cfg, ROWS)} "
      f"= {np.prod(activation_shape(cfg, ROWS)) * 4 / 2**10:.0f} KiB in fp32")

H, S, b, L, p, t, e = 8192, 4096, 1, 80, 4, 8, 2          # an 80-block model, bf16
act = b * S * H * e
pp_bytes = 2 * act                                         # forward out, gradient back
tp_bytes = (L // p) * 4 * act * link.bus_factor("all_reduce", t)
print(f"H={H}, S={S}, b={b}, {L} blocks in bf16, one activation [b, S, H] = {act / 2**20:.0f} MiB")
print(f"  PP, {p} stages of {L // p} blocks: {pp_bytes / 2**20:6.0f} MiB per micro-batch across "
      "each boundary (both ways)")
print(f"  TP over {t} ranks, the same {L // p} blocks: {tp_bytes / 2**30:6.1f} GiB per micro-batch "
      f"on each rank's wire, {tp_bytes / pp_bytes:.0f} times as much")

# %% [markdown]
# Two orders of magnitude fewer bytes, between two ranks only: stages can sit on different nodes
# over InfiniBand while TP stays inside a node on NVLink.
#
# Will a transfer hide behind compute? The *Ultra-Scale Playbook* appendix (A3) compares one
# transfer with the forward pass of the next stage, about $24\,b S H^2$ FLOPs per block:
#
# $$ r_\text{PP} = \frac{\alpha + b S H e / \beta}{L_s \cdot 24\, b S H^2 / F}
#    \;\approx\; \frac{e\,F}{24\, H\, L_s\, \beta}, $$
#
# independent of the batch and the sequence once the latency $\alpha$ is small. Below, the ratio
# on each link preset at the real GPU's speed, for a thick stage and for a single block.

# %%
print(f"{'link':14s}{'H':>6s}{'blocks':>8s}{'transfer us':>13s}{'forward us':>12s}{'ratio':>8s}")
for preset in ("dgx-h100", "dgx-h100-ib", "pcie-h100"):
    real = lf.full_speed(preset)
    for hidden, blocks in ((8192, 20), (8192, 1), (2048, 1)):
        move = real.op_time("send", b * S * hidden * e, 2)
        work = blocks * 24 * b * S * hidden**2 / real.local_flops
        print(f"{preset:14s}{hidden:6d}{blocks:8d}{move * 1e6:13.1f}{work * 1e6:12.1f}"
              f"{move / work:8.3f}")

# %% [markdown]
# For a thick stage the transfer is a rounding error, even across nodes. It grows when stages get
# thin: *interleaved* (virtual) pipelines give each rank several one- or two-block chunks, which
# shrinks the bubble but multiplies the transfers, the case NeMo's `overlap_p2p_comm` is for. Our
# toy stages on the CPU are thin too: in the simulated link's slow motion the transfers matter.
#
# ## 2. Schedules as data
#
# A *schedule* says, for each stage, in which order it runs the forward `F(i)` and the backward
# `B(i)` of each micro-batch $i$: one list per stage, `[("F", 0), ("F", 1), ..., ("B", 0), ...]`,
# made by a pure function of $(p, m, s)$. Two schedules matter:
#
# * **GPipe** (Huang et al. 2019, [arXiv 1811.06965](https://arxiv.org/abs/1811.06965)): every
#   forward, then every backward;
# * **1F1B** (PipeDream-Flush, the schedule Megatron-LM uses, Narayanan et al. 2021,
#   [arXiv 2104.04473](https://arxiv.org/abs/2104.04473)): each stage runs just enough forwards
#   to fill the pipeline behind it, then alternates one forward and one backward, then drains the
#   backwards.
#
# **Think it through** before task 2: how many forwards must stage $s$ run before the gradient of
# its first micro-batch can come back to it (the last stage, the first one)? And what if there are
# fewer micro-batches than that?
#
# Your `gpipe` and `one_f_one_b` (tasks 1 and 2 of the lab) are used below once they give the
# textbook order; until then the reference's are.

# %%
mine, reference = load_lab("pp_overlap", "labs"), reference_lab("pp_overlap")
SCHEDULES, WHOSE = {}, {}
for kind in ("gpipe", "1f1b"):
    SCHEDULES[kind], WHOSE[kind] = lf.yours_or_reference(
        f"{kind} schedule", mine.SCHEDULES[kind], reference.SCHEDULES[kind],
        lambda _: lesson.schedule_problem(mine, reference, kind), "solutions/pp_overlap.py")


def stages_of(kind, p, m):
    return lesson.stages(SCHEDULES[kind], p, m)


for s, actions in enumerate(stages_of("1f1b", P, M)):
    print(f"1F1B, stage {s}: " + " ".join(f"{k}{i}" for k, i in actions))

# %% [markdown]
# `simulate` plays the stages' lists on paper: each stage runs its actions in order, each as soon
# as the stage is free and its input exists (`F(i)` on stage $s$ needs `F(i)` of stage $s-1$,
# `B(i)` needs `B(i)` of stage $s+1$). A backward costs twice a forward (the gradients of both the
# inputs and the weights). Both schedules for $p = 4$, $m = 8$, in units of one forward:

# %%
for kind, name in (("gpipe", "GPipe"), ("1f1b", "1F1B")):
    schedules = stages_of(kind, P, M)
    line = simulate(schedules)
    display(lesson.lanes(lesson.paper_rows(schedules, line),
                         f"{name} ({WHOSE[kind]}), p={P}, m={M}, on paper: step {line.step:g}, "
                         f"bubble {line.bubble:.1%}"))

# %% [markdown]
# ### The bubble
#
# Both drawings take the same time. The last stage cannot start before micro-batch 0 has crossed
# the $p-1$ stages in front of it, $(p-1)\,t_f$; from then on it works without a break, $m$
# forwards and $m$ backwards; and its last backward must still travel back through $p-1$ stages,
# $(p-1)\,t_b$. So the step is $T = (m + p - 1)(t_f + t_b)$, every stage is busy for
# $m(t_f + t_b)$ of it, and the share of time a stage sits idle, the **bubble**, is
#
# $$ \text{bubble} = \frac{(p-1)(t_f+t_b)}{(m+p-1)(t_f+t_b)} = \frac{p-1}{m+p-1}. $$
#
# (The Megatron paper writes $(p-1)/m$: the same idle time against the ideal step $m(t_f+t_b)$.)
# It does not depend on the order the stages choose, only on $p$ and $m$.

# %%
print(f"{'p':>3s}{'m':>4s}{'(p-1)/(m+p-1)':>15s}{'GPipe':>8s}{'1F1B':>8s}")
for p, m in ((2, 8), (4, 4), (4, 8), (4, 32), (8, 8), (8, 64)):
    sims = [simulate(stages_of(k, p, m)).bubble for k in ("gpipe", "1f1b")]
    print(f"{p:3d}{m:4d}{bubble_fraction(p, m):15.3f}{sims[0]:8.3f}{sims[1]:8.3f}")

# %% [markdown]
# ### What 1F1B buys: activations in flight
#
# If the bubble is the same, why 1F1B? Memory. A stage keeps a micro-batch's activations from its
# forward until its backward. GPipe runs all $m$ forwards first, so every stage holds all $m$ at
# its peak. In 1F1B, a stage starts its first backward once its warm-up is done and then frees one
# micro-batch for each new one: never more in flight than its warm-up and one, whatever $m$.

# %%
for kind, name in (("gpipe", "GPipe"), ("1f1b", "1F1B")):
    peaks = [peak_in_flight(a) for a in stages_of(kind, P, M)]
    print(f"{name:5s} p={P}, m={M}: micro-batches alive at the peak, by stage: {peaks}")
peaks = [peak_in_flight(a) for a in stages_of("1f1b", P, 64)]
print(f"1F1B  p={P}, m=64: {peaks}: the bubble shrinks with m, the memory does not grow")

# %% [markdown]
# So 1F1B can use many micro-batches (a small bubble) without keeping their activations: that is
# why it is the default in Megatron and NeMo.
#
# ## 3. Deadlock
#
# ### A schedule that cannot finish
#
# Suppose the warm-up is written the wrong way round: stage $s$ runs $s$ forwards before its first
# backward, the last stage the most. Stage 0 runs `F(0)` and waits for gradient 0, which needs the
# last stage's `B(0)`, which in this order comes after its warm-up forwards, which need
# activations that stage 0 sends only after its `B(0)`. Each list looks fine; together they never
# finish. Because the schedule is data, `check_schedule` finds that on paper, before any rank hangs:

# %%
def wrong_warmup(p, m, stage):
    w = min(stage, m)                                 # should be min(p - 1 - stage, m)
    steady = [a for j in range(m - w) for a in (("F", w + j), ("B", j))]
    return [("F", i) for i in range(w)] + steady + [("B", j) for j in range(m - w, m)]


try:
    check_schedule([wrong_warmup(P, M, s) for s in range(P)], M)
except ScheduleError as exc:
    print(exc)

# %% [markdown]
# The message names every stuck stage and what it waits for: a cycle. (The grader reads your
# schedules the same way: a schedule that would hang is reported as a deadlock, instantly.)
#
# ### Two blocking sends
#
# The right schedule can still hang, because of *how* the ranks send. Over gloo, `dist.send`
# returns only once the peer has posted the matching `dist.recv`, however small the tensor, and
# NCCL's send cannot be counted on to return early either. In 1F1B's steady state on two stages,
# stage 0 has just finished `F(1)`: it sends activation 1, then receives gradient 0; stage 1 has
# just finished `B(0)`: it sends gradient 0, then receives activation 1. Both send first, and each
# send waits for a receive its peer posts only after its own send returns. The cell runs exactly
# that on 2 ranks, with a 3-second limit; the launcher's flight recorder says where each rank is.

# %%
def send_then_receive_1f1b(m):
    """1F1B on 2 stages, each transfer a blocking send followed by a blocking receive."""
    import torch.distributed as dist

    from workbook.lessons import reference_lab
    from workbook.model import ModelConfig, make_batch
    ref = reference_lab("pp_overlap")

    class SendThenReceive(ref.BlockingExecutor):
        def exchange(self, tensor, peer):
            if tensor is not None:
                dist.send(tensor.detach().contiguous(), peer)    # back when the peer receives
            incoming = self.receive_for(self.position + 1)
            if incoming is not None:
                src, self.inbox = incoming
                dist.recv(self.inbox, src)

    cfg = ModelConfig(n_layers=2)
    tokens, targets = make_batch(cfg, m, seed=0)
    actions = ref.one_f_one_b(dist.get_world_size(), m, dist.get_rank())
    SendThenReceive(cfg, m).step(tokens, targets, actions)
    return "finished"


try:
    print(on_ranks(send_then_receive_1f1b, 2, 4, timeout=3))
except Exception as exc:                              # noqa: BLE001 - the hang is the lesson
    print(f"{type(exc).__name__}: {exc}")

# %% [markdown]
# Both ranks sit in a `send`, and the launcher killed them after the limit (the next cell that
# needs ranks starts fresh ones). The fix is to post the send and the next receive *together*,
# then wait for both, as Megatron-LM's `send_forward_recv_backward` does. The lab's blocking
# executor must not hang this way; it is still *blocking*: the stage does nothing while its
# transfers travel.
#
# ## 4. What the transfers cost, on paper
#
# `simulate(..., t_p2p=c)` delays every input by $c$: a stage's output reaches its neighbour $c$
# after the action that made it ends, sends never block, and nothing stops a stage from computing
# while its transfers travel: the best any executor can do. Here is 1F1B on two stages with a
# transfer costing half a forward, the transfers drawn between the stages.

# %%
C = 0.5
schedules = stages_of("1f1b", 2, M)
line = simulate(schedules, t_p2p=C)
lesson.lanes(lesson.paper_rows(schedules, line, C),
             f"1F1B ({WHOSE['1f1b']}), p=2, m={M}, transfers of {C} forward, on paper: step "
             f"{line.step:g} instead of {simulate(schedules).step:g}")

# %% [markdown]
# Even with every transfer asynchronous, the step grew, by more than the fill and the drain: one
# gradient reaches stage 0 while it computes a forward (hidden), the next after it (stage 0
# waits). Why?
#
# In 1F1B, stage 0 may not start `F(j+p)` before `B(j)` is done: that is what limits it to $p$
# micro-batches in flight. Between the start of `F(j)` and the end of `B(j)` on stage 0 lies a
# **round trip**: micro-batch $j$ forward through all $p$ stages and back again, $p\,(t_f + t_b)$
# of compute and $2(p-1)$ transfers, one after the other. Stage 0 fills it with its $p$
# micro-batches in flight, so in the steady state each micro-batch takes at least
#
# $$ t_f + t_b + \frac{2(p-1)}{p}\, c . $$
#
# With $p = 2$, one of the two transfers per micro-batch lies on the critical path: half the
# steady state's transfer time can hide. GPipe has no such chain: its forwards stream down
# without waiting for any backward, and the transfers cost only the fill and the drain,
# $2(p-1)\,c$, whatever $m$ (it pays in memory instead). **Predict** the growth of each step in
# transfers before you run the table ($c = 0.25$).

# %%
print(f"{'p':>3s}{'m':>4s}{'GPipe':>8s}{'1F1B':>8s}{'2(p-1)':>8s}{'2(p-1)/p per micro-batch':>26s}")
for p, m in ((2, 8), (2, 32), (4, 8), (4, 32), (8, 32)):
    extra = [(simulate(stages_of(k, p, m), t_p2p=0.25).step - simulate(stages_of(k, p, m)).step)
             / 0.25 for k in ("gpipe", "1f1b")]
    print(f"{p:3d}{m:4d}{extra[0]:8.1f}{extra[1]:8.1f}{2 * (p - 1):8d}{2 * (p - 1) / p:26.2f}")

# %% [markdown]
# GPipe's column is exactly $2(p-1)$; 1F1B's grows with $m$ at a slope of $2(p-1)/p$. This is what
# the NeMo page means when it overlaps the p2p traffic in the 1F1B phase and warns that the fill
# and the flush stay exposed.
#
# How much of each stage's steady-state transfer time falls while that stage computes?
# `lesson.paper_hidden` measures it on paper, the way the grader reads a trace: the union of the
# transfers a stage sends or receives for its steady-state actions, against its compute.

# %%
for p in (2, 4):
    sch = stages_of("1f1b", p, M)
    shares = lesson.paper_hidden(sch, simulate(sch, t_p2p=C), C)
    print(f"1F1B p={p}, m={M}, c={C}: hidden by stage " + ", ".join(f"{x:.0f}%" for x in shares))

# %% [markdown]
# About half on two stages. A caution: if both stages end an action at the same moment, both
# transfers fly while both stages wait, every time: the same period, nothing hidden. The hidden
# share tells *where* the waiting falls; the step time tells what it costs.
#
# ### Predicting your step
#
# The lab's last task asks you to predict, *before* you run it, the step of your 1F1B with
# overlapped p2p on the simulated link, in milliseconds; the report then shows your number beside
# the model and the measurement. Everything above is in units of one forward; a prediction in
# milliseconds needs two things more.
#
# **What one transfer costs.** The link is an alpha-beta model (lesson 3, "The link, and why it is
# simulated"): one operation costs its latency $\alpha$ plus its bytes times $\beta$, one over the
# bandwidth. The simulated link is a slowed-down copy of a real one, so on a small message the
# latency is no rounding error; and the link speaks seconds and bytes, while the compute you
# measure is in milliseconds.
#
# **How the transfers add up.** Section 4 showed it: they do not simply add. Which ones cost time
# depends on the schedule, on whether a stage has something else to compute while a tensor travels.
# The paper model above plays exactly that, stage by stage.
#
# A worked example, for a *different* figure: the step of **GPipe** with asynchronous transfers.
# Take $p = 2$ stages, $m = 8$ micro-batches, a forward of 4 ms and a backward of 8 ms per stage,
# and a message of 1 MiB on a link of $\alpha = 2$ ms and 1 GB/s. One transfer costs
# $c = 2 + 1.048576 \cdot 10^6 / 10^9 \cdot 10^3 \approx 3.05$ ms. GPipe's forwards stream
# down without waiting for any backward, so only the fill and the drain pay:
# $(m + p - 1)(t_f + t_b) + 2(p-1)\,c = 9 \cdot 12 + 2 \cdot 3.05 \approx 114.1$ ms. The cell
# checks the arithmetic against the paper model.

# %%
alpha_s, bandwidth_Bps, message_bytes = 2e-3, 1e9, 2 ** 20
c_ms = 1e3 * (alpha_s + message_bytes / bandwidth_Bps)
by_hand = (8 + 2 - 1) * (4.0 + 8.0) + 2 * (2 - 1) * c_ms
played = lesson.on_paper(SCHEDULES, "GPipe, overlapped", 2, 8, 4.0, 8.0, c_ms).step
print(f"GPipe, p=2, m=8: one transfer {c_ms:.2f} ms; step by hand {by_hand:.1f} ms, "
      f"on paper {played:.1f} ms")

# %% [markdown]
# **Think it through** before you write `predict_step_ms`: what crosses a stage boundary (section
# 1), and how many *bytes* is it for the shape and itemsize you are given? And in 1F1B, which
# transfers can a stage not hide (section 4, the round trip)? Your answer must hold for any number
# of stages and micro-batches, not just the two stages drawn above.

# %% [markdown]
# ### The blocking executor on paper
#
# `lesson.simulate_blocking` plays the blocking executor: after every action it waits until its
# send and its next receive are both done; a send ends $c$ after it is posted, and not before the
# peer has posted the matching receive (gloo's rule); a receive ends $c$ after both sides posted.
# The four variants of section 5, on paper:

# %%
print(f"step on paper, in forwards, with a transfer of {C} forward (no transfers: (m+p-1)*3)")
print(f"{'p':>3s}{'m':>4s}" + "".join(f"{v:>19s}" for v in lesson.VARIANTS))
for p, m in ((2, 8), (4, 8), (4, 32), (8, 32)):
    print(f"{p:3d}{m:4d}" + "".join(f"{lesson.on_paper(SCHEDULES, v, p, m, c=C).step:19.1f}"
                                    for v in lesson.VARIANTS))

# %% [markdown]
# Blocking GPipe is the slowest, asynchronous GPipe the fastest (only the fill and the drain pay,
# if the memory of $m$ micro-batches in flight is affordable). The two 1F1B executors are close:
# the paired exchange already lets the activation and the gradient travel together, and the round
# trip keeps its transfers on the critical path whatever the executor does. That is NeMo's
# experience in one table: in plain 1F1B there is little to win.
#
# ### Explore
#
# Try: $c = 0$ (the textbook bubble); $m$ from 4 to 32 at $c = 1$, 1F1B then GPipe; the blocking
# executor at $p = 2$, then $p = 8$; $p = m = 8$ (almost half bubble); $m < p$ (no steady state).

# %%
lesson.paper_explorer(SCHEDULES)

# %% [markdown]
# ## 5. On your ranks
#
# Now two stages of this lesson's model (2 blocks each, width 256, 256 tokens per micro-batch,
# fp32) on 2 ranks over the simulated DGX-H100 link, 8 micro-batches per step. `StageExecutor.step`
# runs a stage's actions inside `record_function` ranges named after the phase (`warmup`,
# `steady`, `cooldown`) and the action (`F3`):
#
# * `BlockingExecutor` (task 3): the stage never computes while one of its transfers travels,
#   and never hangs the way section 3's two blocking sends did;
# * `OverlappedExecutor` (task 4): a tensor travels while the stage computes something else, and
#   the stage waits only when it needs a tensor that has not arrived yet.
#
# **Think it through** before you write them: for action $k$'s input to travel during action
# $k-1$, when must its receive have been posted, and what happens to the very first action? A
# send no longer waited for at once: what must stay untouched while it is in flight, and when may
# the step end? And with two receives from the same peer posted at once, which one gets which
# message (gloo matches them in the order they were posted)?
#
# First a check of your executors (one 1F1B step, tiny model, fp64, against one device); what
# follows uses yours where it passes and the reference where it does not.

# %%
IMPL = {}
for executor in ("blocking", "overlapped"):
    verdict = lf.probe(lesson.check, STAGES, "labs", executor,
                       lesson.stages(reference.SCHEDULES["1f1b"], STAGES, 4), keys=[executor],
                       timeout=20)[executor]
    IMPL[executor], _ = lf.whose_code({executor: verdict}, [executor], accept=("ok",))
    print(f"your {executor.title()}Executor: {verdict}"
          + ("" if IMPL[executor] == "labs" else "  -> the REFERENCE is used below"))

# %% [markdown]
# ### Four variants, timed
#
# `lesson.variant_steps` runs on each rank: it recalibrates the link, warms both executors up, then
# takes a profiled step of each variant in turn, `TAKES` times over, keeping the fastest: GPipe and
# 1F1B with the blocking executor, 1F1B and GPipe with the overlapped one. Wrappers note when each
# action ran and how long the rank spent inside `take_received`, `exchange` and `finish`: the time
# it *waited* for a transfer. The link's log says when each transfer travelled.

# %%
plan = {name: (stages_of(kind, STAGES, MICRO), executor)
        for name, (kind, executor) in lesson.VARIANTS.items()}
TAKES = sized(2, in_tests=1)
measured, TAKE, IMPL, local_flops = lesson.measure_variants(
    runs, IMPL, MODEL, MICRO, ROWS, plan, stages_of("1f1b", STAGES, 2), PRESET, takes=TAKES)
WHO = {e: "yours" if i == "labs" else "REFERENCE" for e, i in IMPL.items()}
sim = link.make_link(PRESET, local_flops)                   # as the ranks calibrated it
label = where_measured(sim.label)
print(f"{label}\nexecutors: blocking {WHO['blocking']}, overlapped {WHO['overlapped']}; "
      f"schedules: GPipe {WHOSE['gpipe']}, 1F1B {WHOSE['1f1b']}")

# %% [markdown]
# For each variant: the step, each stage's compute (its actions minus the waits inside them) and
# waiting, and the measured bubble, $1 - \sum_s \text{compute}_s / (p \cdot \text{step})$. Beside
# them, the same step on paper with the costs this variant measured and the modelled transfer on
# this link. Then where each stage's time went.

# %%
NBYTES, C_MS = lesson.transfer_ms(sim, activation_shape(cfg, ROWS))  # one transfer, this link
stats = lesson.variant_stats(measured)
print(f"measured costs: forward {np.mean([s['t_f'] for s in stats.values()]):.0f} ms, backward "
      f"{np.mean([s['t_b'] for s in stats.values()]):.0f} ms per stage and micro-batch; one "
      f"transfer ({NBYTES // 1024} KiB) {C_MS:.0f} ms on the link, of which "
      f"{sim.latency_s * 1e3:.0f} ms latency")
lesson.stats_table(stats, SCHEDULES, STAGES, MICRO, C_MS)

# %%
lesson.time_split_figure(stats, STAGES, f"one step of {MICRO} micro-batches on {STAGES} stages: "
                         f"where each stage's time went — {label}")

# %% [markdown]
# The timeline of one step, drawn like the paper ones: each stage's actions (a red stretch inside
# an action is time spent waiting for a transfer), and between the stages the transfers as the
# receiving rank's link log has them. Pick a variant.

# %%
lesson.measured_panel(measured, stats, WHO, label, C_MS)

# %% [markdown]
# What to look for (your numbers differ from run to run: two ranks share two cores):
#
# * **GPipe, blocking** waits the most: each transfer is waited for by both sides.
# * **1F1B, blocking** waits once per micro-batch on each stage; both directions travel together.
# * **1F1B, overlapped** takes about as long, as the paper predicted for two stages, but the
#   waiting moved *into* the actions (a prefetched receive not yet complete), and the sends no
#   longer stop anybody.
# * **GPipe, overlapped** is usually the fastest, and pays in memory: stage 0 holds all 8
#   micro-batches at the peak, against 2 in 1F1B.
#
# The measured bubble exceeds the textbook's: it also counts every wait for a transfer and the
# stages' imbalance (stage 1 also runs the norm, the head and the loss).
#
# ### The trace, and the hidden share
#
# The same overlapped step as the profiler recorded it, with the `warmup`, `steady` and
# `cooldown` ranges, the link's track, and exposed communication marked below each rank.

# %%
run = trace.load_run(runs / lesson.folder("1F1B, overlapped", TAKE["1F1B, overlapped"]))
trace.timeline_figure(run, title=f"1F1B, overlapped ({WHO['overlapped']} executor), from the "
                      f"trace — {label}")

# %% [markdown]
# The grader asks of this trace: of the link time of the transfers issued in the `steady` range,
# how much ran while the same rank computed (`trace.overlap(run, rank, within="steady")`, skew
# counted as hidden)? On paper, about half; here both 1F1B executors, beside `paper_hidden` with
# the measured costs.

# %%
lesson.hidden_table(runs, TAKE, lesson.paper_share_measured(
    stages_of("1f1b", STAGES, MICRO), stats["1F1B, overlapped"], C_MS))

# %% [markdown]
# The blocking executor hides next to nothing. The overlapped one hides a share, rarely all that
# the paper shows: a real run drifts between the alternating pattern and the lockstep one. That is
# why the grader grades the *structure* of your executor first, from the link's log (no send
# waited for as soon as it was posted, every receive but the first posted an action ahead), and
# asks of the last line's figure only a low floor, 10%, measuring again after a near miss.
#
# ## 6. Exercise: the `pp_overlap` lab
#
# Open `labs/pp_overlap.py` and replace each `raise NotImplementedError`, in the order of its
# task list; each task's docstring is its spec, and `workbook hint pp_overlap N` gives hints one
# at a time if you are stuck:
#
# 1. `gpipe` (2 points) and 2. `one_f_one_b` (5 points): the schedules of section 2, as pure
#    functions; section 3 says what the stages' lists must never do together;
# 3. `BlockingExecutor` (10 points): one stage's steps on its rank, without the deadlock of
#    section 3, "Two blocking sends";
# 4. `OverlappedExecutor` (13 points): the same steps with the transfers travelling while the
#    stage computes (sections 4 and 5); gloo matches a peer's messages to receives in the order
#    they were posted, so the order in which you post them matters;
# 5. `predict_step_ms` (3 points): section 4, "Predicting your step", before you run it.
#
# The given pieces are in `workbook/pipeline_parallel/pipeline_parallel.py`: the stages, the
# micro-batches, the schedule checker, the simulator and `StageExecutor`, the base class the
# executors extend (read its `step`: it says which peer and buffer each action receives).
#
# Check yourself with `workbook run pp_overlap` (its report prints your prediction beside the
# model and the measured step), grade with `workbook grade --lab pp_overlap`. The grader checks
# your schedules at once, without ranks (a schedule that would hang is reported as a deadlock);
# runs each variant on 2 and 4 stages (GPT and Llama, fp64) against one device; counts the
# sends and receives in your trace and their bytes; on the simulated link checks the overlapped
# executor's structure and the hidden share above; and compares your prediction with the model
# on two links. `workbook bench pp_overlap` measures the variants against the no-communication
# step, beside `simulate`'s prediction. An instructor may hand out the `challenge` level
# instead: each executor is then one task, written whole from its class docstring.

# %%
check_your_work("pp_overlap")
