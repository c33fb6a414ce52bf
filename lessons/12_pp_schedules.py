# %% [markdown]
# # Lesson 12 — Pipelines with (almost) no bubble: virtual stages, the split backward, a V
#
# Lesson 10 left every rank of a 1F1B pipeline idle for $(p-1)/(m+p-1)$ of the step, and its
# benchmark showed that at most half of the steady state's transfers could hide. Production
# pipelines go further with two ideas, and this lesson derives both from the dependencies:
#
# * **virtual stages** (Megatron-LM's interleaved 1F1B): give each rank several thin pieces of the
#   model instead of one thick one, so the pipeline fills and drains in thinner steps;
# * **the split backward** (zero-bubble pipelines, Qi et al. 2023,
#   [arXiv 2401.10241](https://arxiv.org/abs/2401.10241)): the backward pass of a layer is two
#   products, and only one of them is on the critical path.
#
# In order: (1) where 1F1B's bubble comes from; (2) virtual stages and what they cost; (3)
# Megatron's order, and why its warm-up is longer than it needs to be on paper; (4) the backward
# in two; (5) ZB-H1, the drain filled with deferred work; (6) the V; (7) your schedules on ranks;
# (8) the lab. Every schedule you write is compared with the order PyTorch's own
# `torch.distributed.pipelining` runs: until yours matches, the cells draw PyTorch's.

# %%
from workbook.grading.labs import load_lab
from workbook.lessons import check_your_work, sized, yours_reference_or_recorded
from workbook.measure import lesson_figures as lf
from workbook.pipeline_parallel import (ScheduleError, check_chunked_schedule, rank_and_chunk,
                                        simulate_chunked, stage_index)
from workbook.pipeline_parallel import pp_schedules_lesson as lesson

P, M = 4, 8                      # the pipeline drawn on paper: 4 ranks, 8 micro-batches
SHOWN = yours_reference_or_recorded("pp_schedules")   # "yours", "reference", or "recorded"
try:
    mine = load_lab("pp_schedules", "labs")
except Exception as exc:         # noqa: BLE001 - not written yet, or not importable yet
    print(f"labs/pp_schedules.py does not load yet ({lf.verdict_of(exc)}): PyTorch's orders "
          "are drawn")
    mine = None
FNS, WHOSE = {}, {}
for name, (fn_name, _, _) in lesson.SCHEDULES.items():
    if fn_name not in FNS:
        FNS[fn_name], WHOSE[fn_name] = lesson.schedule_of(mine, fn_name)
SCHEDULE_FNS = {name: FNS[fn_name] for name, (fn_name, _, _) in lesson.SCHEDULES.items()}

# %% [markdown]
# ## 1. Where 1F1B's bubble comes from
#
# Count in *whole-stage* costs: a forward $t_F$, and a backward split into its two halves $t_B$
# (the gradient of the stage's input) and $t_W$ (the gradient of its weights), each 1 here, so a
# whole backward costs 2, as in lesson 10. Rank $r$ runs $m$ forwards and $m$ backwards: it is
# busy $m(t_F+t_B+t_W)$. Rank $p-1$ cannot start before micro-batch 0 has crossed $p-1$ stages,
# and rank 0's last backward cannot start before the last gradient has come back across them:
# each rank idles $(p-1)(t_F+t_B+t_W)$ in all, so
#
# $$ \text{bubble} = \frac{(p-1)(t_F+t_B+t_W)}{m(t_F+t_B+t_W) + (p-1)(t_F+t_B+t_W)}
#                  = \frac{p-1}{m+p-1}. $$
#
# Two ways to shrink it are visible in the numerator: make the fill and drain steps thinner (the
# $t$'s in the numerator, not the denominator), or fill the idle time with work that nobody waits
# for. Sections 2 and 5 take them in turn.

# %%
print(lesson.paper_figure.__doc__.splitlines()[0])
lesson.paper_figure(SCHEDULE_FNS, "1F1B", P, M)

# %% [markdown]
# ## 2. Virtual stages
#
# Cut the model into $p \cdot v$ stages instead of $p$ and give each rank $v$ of them, its
# *chunks*. Under the **interleaved** placement chunk $c$ of rank $r$ is stage $c\,p + r$: a
# micro-batch goes round the ranks $v$ times. A chunk action costs $1/v$ of a whole stage's. The
# fill still crosses $p-1$ ranks, but each hop is a chunk, $v$ times thinner:
#
# $$ \text{idle per rank} = \frac{(p-1)(t_F+t_B+t_W)}{v}, \qquad
#    \text{bubble} = \frac{p-1}{v\,m + p - 1}. $$
#
# The price: a micro-batch now crosses $p\,v - 1$ boundaries instead of $p - 1$, each with an
# activation down and a gradient back, so $v$ times the messages (and each is as large as
# before: one activation $[b, S, H]$). Where the transfers are slow, thinner steps buy less.

# %%
for r in range(P):
    print(f"rank {r} holds stages", [stage_index(r, c, P) for c in range(2)])
lf.print_table(lesson.compare_table(SCHEDULE_FNS, P, M)[:2], lesson.COMPARE_COLUMNS)

# %% [markdown]
# **Predict** before you run the next cell: with $p = 4$, $v = 2$ and $m = 16$, what bubble does
# the formula give? And how many messages does one step send (count the boundaries between two
# ranks)? Write both down; the cell prints what the schedule does on paper.

# %%
lf.print_table([r for r in lesson.compare_table(SCHEDULE_FNS, P, 16) if r["v"] == 2
                and r["schedule"] == "interleaved 1F1B"], lesson.COMPARE_COLUMNS)

# %% [markdown]
# ## 3. Megatron's order
#
# With $v$ chunks, in what order should a rank run its $v\,m$ forwards and $v\,m$ backwards?
# Megatron-LM (Narayanan et al. 2021, [arXiv 2104.04473](https://arxiv.org/abs/2104.04473),
# section 2.2) takes micro-batches through the chunks in groups of $p$: chunk 0 for micro-batches
# $0..p-1$, then chunk 1 for the same ones, and so on, then chunk 0 for $p..2p-1$; backwards the
# same way from the last chunk down. That is why it needs $m$ to be a multiple of $p$.
#
# Then the warm-up: how many forwards does rank $r$ run before its first backward? Its first
# backward is micro-batch 0 on its last chunk, and that needs micro-batch 0 to have gone through
# every stage, to the last rank's last chunk and back.
#
# **Think it through** (task 1 depends on it): count the forwards rank $r$ can do while micro-batch
# 0 travels. The $(v-1)$ full rounds before its last chunk give $(v-1)\,p$; then micro-batch 0
# still has to reach rank $p-1$ and its gradient has to come back to rank $r$: how many forward
# slots does that trip give rank $r$, counting one per hop, in each direction?
#
# PyTorch ships both answers. `ScheduleInterleaved1F1B` is Megatron's order; the F's and B's of
# `ScheduleInterleavedZeroBubble` (section 5) are the same order with a shorter warm-up, one
# forward per hop *down* only. The cell takes both from PyTorch, folds each W of the second into
# its B (so both are unsplit), and plays them with free transfers, then with transfers of 0.1,
# 0.25 and 0.5 of a forward. Explain the difference before you read on.

# %%
from workbook.pipeline_parallel.torch_orders import torch_order

orders = {"Megatron's, (v-1)p + 2(p-1-r)": torch_order("interleaved_1f1b", P, 2, M),
          "one per hop down, (v-1)p + (p-1-r)": [[a for a in rank if a[0] != "W"]
                                                 for rank in torch_order("zb_h1", P, 2, M)]}
for warmup, acts in orders.items():
    check_chunked_schedule(acts, P, 2, M)
    steps = [simulate_chunked(acts, P, 2, **lesson.chunk_costs(2), t_p2p=c).step
             for c in (0.0, 0.1, 0.25, 0.5)]
    peak = max(simulate_chunked(acts, P, 2).peak_in_flight) / 2
    print(f"warm-up {warmup:36s}: step at transfer 0 / 0.1 / 0.25 / 0.5 = "
          + " / ".join(f"{s:.1f}" for s in steps) + f"; rank 0 holds {peak:g} stages' activations")

# %% [markdown]
# On paper with free transfers the shorter warm-up is as fast and holds fewer activations; once a
# transfer costs anything, every hop back stalls the rank that waits for it, and the extra
# $p-1-r$ forwards are the slack that keeps it busy meanwhile. Megatron pays for that slack in
# memory: rank 0 holds more than $p$ stages' activations (the *peak* column of section 2), which
# ZB-H1 and ZBV below avoid. Your `interleaved_1f1b` (task 1) runs Megatron's order:

# %%
print(f"{WHOSE['interleaved_1f1b']} interleaved_1f1b:")
lesson.paper_figure(SCHEDULE_FNS, "interleaved 1F1B", P, M)

# %% [markdown]
# ## 4. The backward in two
#
# A linear layer computes $y = x A$ for an input $x$ of shape $[n, h_\text{in}]$ and weights $A$
# of shape $[h_\text{in}, h_\text{out}]$. Its backward pass, given $\partial L/\partial y$
# ($dy$, shape $[n, h_\text{out}]$), is two matrix products of the same cost:
#
# $$ dx = dy\,A^\top \;\;(\textbf{B}: \text{the previous layer, and the previous stage, wait for
#    it}), \qquad dA = x^\top dy \;\;(\textbf{W}: \text{nobody needs it before the optimizer}). $$
#
# Autograd computes both as soon as $dy$ arrives. Split them, send B's result upstream at once,
# and W becomes work that can run whenever the rank would otherwise idle: $t_B \approx t_W$, each
# half of the backward. The cell shows the two products in autograd's own graph of one layer.

# %%
import torch

x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
A = torch.randn(8, 3, dtype=torch.float64, requires_grad=True)
y = x @ A
dy = torch.randn_like(y)
dx, dA = torch.autograd.grad(y, (x, A), dy)
print("autograd's node for y:", type(y.grad_fn).__name__, "-> inputs",
      [type(n).__name__ for n, _ in y.grad_fn.next_functions])
print("B: dx = dy A^T  equal:", torch.equal(dx, dy @ A.T), "  shape", tuple(dx.shape))
print("W: dA = x^T dy  equal:", torch.equal(dA, x.T @ dy), "  shape", tuple(dA.shape))

# %% [markdown]
# W reads $x$, the activation the forward saved, so a micro-batch's activations stay alive until
# its W runs: deferring W costs memory, and a schedule must bound how far it defers.
#
# ## 5. ZB-H1: the drain filled
#
# Keep 1F1B's order of forwards and (input-gradient) backwards, and place the W's. In 1F1B's
# drain, rank $r$ waits after each backward for the next gradient to come back; if it held back a
# few W's, it could run one in each of those waits. ZB-H1 (Qi et al. 2023, section 3) holds back
# exactly as many as the drain has waits for it, $r$ on rank $r$, and runs every other W right
# after the B that allows it, so no rank ever holds more activations than 1F1B's rank 0 ($p$
# micro-batches). Each rank then idles
#
# $$ (p-1)(t_F + t_B - t_W) \quad\text{instead of 1F1B's}\quad (p-1)(t_F + t_B + t_W): $$
#
# **Predict**: with all three costs 1, what fraction of 1F1B's idle time is left? What bubble is
# that for $p = 4$, $m = 8$? Then check against the table (task 2 is your `zb_h1`).

# %%
print(f"{WHOSE['zb_h1']} zb_h1:")
lf.print_table(lesson.compare_table(SCHEDULE_FNS, P, M), lesson.COMPARE_COLUMNS)
lesson.paper_figure(SCHEDULE_FNS, "ZB-H1", P, M)

# %% [markdown]
# ## 6. The V
#
# Two chunks per rank again, but placed in a **V**: chunk 0 of rank $r$ is stage $r$ (down the
# ranks), chunk 1 is stage $2p-1-r$ (back up). Rank $p-1$ holds the two middle stages, so the
# micro-batch turns round there with no transfer, and rank 0 holds both the first stage and the
# last, where the loss is. With the backward split and $m \ge 2p$, ZBV (section 6 of the paper,
# PyTorch's `ScheduleZBVZeroBubble`) idles each rank only $(p-1)$ chunk forwards: the least any
# schedule can, since rank $p-1$ cannot start before micro-batch 0 has crossed $p-1$ chunks. It
# holds at most $2p$ chunk-activations, $p$ stages' worth: 1F1B's peak again.
#
# **Think it through** (task 3): follow micro-batch 0 down chunk 0 and back up chunk 1. Which ranks
# get their first chunk-1 forward soonest, and so need fewer chunk-0 forwards in their warm-up?

# %%
for r in range(P):
    print(f"rank {r} holds stages", [stage_index(r, c, P, "v") for c in range(2)])
print(f"{WHOSE['zbv']} zbv:")
lesson.paper_figure(SCHEDULE_FNS, "ZBV", P, M)

# %% [markdown]
# Play with every schedule, the pipeline's size, the chunks a rank holds and a transfer's cost
# below: each draw is `simulate_chunked`'s timeline, its bubble printed beside the formula's.
# Where does the V's advantage go when transfers get slow, and why does the interleaved schedule
# suffer most? What do more chunks buy ZB-H1, and what do they cost once a transfer costs
# anything?

# %%
lesson.paper_explorer(SCHEDULE_FNS)

# %% [markdown]
# ## 7. Your schedules on your ranks
#
# On ranks, a schedule needs an executor: the given `ChunkedExecutor` builds a rank's $v$ chunks
# (each linear's backward split, so B computes only the input gradient and W runs later) and calls
# your `OverlappedChunkedExecutor`'s steps in the order of the rank's actions. Two things are new
# since lesson 10's executor:
#
# * **whose message is next.** A peer's messages fill your receives in the order you post them,
#   and with chunks a peer sends in *its* action order, not yours: on 2 ranks, rank 0 receives both
#   activations (for its chunk 1) and gradients (for its chunk 0) from rank 1, interleaved as
#   rank 1 runs them. Post a peer's receives in the order it sends, and each message lands in its
#   own buffer (the base class works out that order: `arrivals`);
# * **the V's turn.** Stages $p-1$ and $p$ are both on rank $p-1$: the tensor is handed over in
#   memory, with no transfer at all.
#
# ### Predict your step
#
# The lab's last task, `predict_step_ms`, asks for the step of one of your schedules on your
# executor over the simulated link, in milliseconds, *before* you run it; the cell after the run
# below puts your number beside the model's and the measured step (and `workbook run
# pp_schedules` prints the same table for all four schedules). Everything on paper above counts
# in forwards of a whole stage with free or fractional transfers; a prediction in milliseconds
# needs three things more.
#
# * **What one transfer costs.** The link is an alpha-beta model (lesson 3, "The link, and why it
#   is simulated"): an operation costs its latency $\alpha$ plus its bytes over the bandwidth.
#   The link speaks seconds and bytes; the compute you are given is in milliseconds.
# * **What is a transfer, and what is not.** An action whose input was made on another rank waits
#   one transfer after that action ended; an input made on the same rank is there at once (the
#   V's turn of section 6); a W waits for nothing outside its rank. Sends never block: your
#   executor posts them and moves on.
# * **What one action costs.** You are given the compute of one micro-batch through a rank's
#   *whole* share of the model (all its chunks together: lesson 10's stage, what a profiler
#   reports per micro-batch). A chunk holds $1/v$ of those layers. And a schedule with no W runs
#   the whole backward in its B.
#
# `simulate_chunked` (the given paper model) plays a schedule once it has these figures. The
# formulas of sections 2, 5 and 6 are no prediction here: they count no transfer, and on this
# link one costs a sizeable part of a chunk's forward.
#
# **Think it through** before you write it: on 2 ranks, how many transfers does one micro-batch
# make each way under interleaved 1F1B with $v = 2$, and under ZBV (the *messages* column of the
# tables above counts them for a whole step)? Which of them can a rank not hide, at the start
# and at the end of the step?
#
# **Predict** before you run the next cell, for 2 ranks and 8 micro-batches on the simulated
# dgx-h100 link: which is faster, interleaved 1F1B (v = 2) or ZBV, and by how much on paper
# (section 6's table)? Which hides the larger share of its steady-state transfers, and why (the
# V's turn needs no transfer; interleaving sends v times as many)? Then compare with the
# `simulate` column: `simulate_chunked` played with the costs your trace measured.
# (`workbook bench pp_schedules` adds 1F1B, ZB-H1 and v = 4.)

# %%
from workbook.pipeline_parallel import pp_schedules_bench as bench

IMPL = "labs" if SHOWN == "yours" else "solutions"
result = bench.measure(impl=IMPL, nproc=2, links=["dgx-h100"], repeats=1,
                       warmup=sized(1, in_tests=0), pool=True,
                       variants=["interleaved_v2", "zbv"], hidden=256,
                       layers=4, seq=sized(256, in_tests=128), rows=1, micro_batches=8,
                       heads=4)
print(f"{'your' if IMPL == 'labs' else 'the REFERENCE'} executor and schedules:")
print(bench.report(result))

# %%
bench.figure(result)

# %% [markdown]
# **Your prediction beside the run.** The cell calls your `predict_step_ms` for each schedule the
# run measured (a `-` until you write it), with this run's link, the activation's shape
# $[b, S, H]$ in fp32 and the schedule's own measured compute (per chunk action, times $v$: a
# whole stage's), and prints it beside the model (`simulate_chunked` of your schedule with the
# same figures) and the measured step. Your number should equal the model's; where the model and
# the measurement part, the difference is what the paper leaves out: the executor's Python
# between operations, a loaded CPU, ranks that drift apart.

# %%
from workbook.pipeline_parallel import pp_schedules_report as report

print("\n".join(report.bench_prediction_lines(result, getattr(mine, "predict_step_ms", None))))

# %% [markdown]
# Where the measured bubble sits above the formula, the difference is time the trace does not
# count as compute: the executor's Python between operations, copies, and the transfers the
# formula leaves out. The *no_comm* row (ZBV with no link time) is the floor this machine sets;
# `workbook bench pp_schedules` runs the full comparison, on two link presets, and
# `docs/bench-pp-schedules.md` explains its figures.
#
# ## 8. The lab
#
# `labs/pp_schedules.py`: task 1 `interleaved_1f1b`, task 2 `zb_h1`, task 3 `zbv` (graded at once,
# action by action against PyTorch's order, each set of ranks first through the deadlock checker),
# then the `OverlappedChunkedExecutor` (its numbers against one device for every schedule on 2 and
# 4 ranks, its traffic from the trace, then how much of the steady state's transfers it hides),
# and task 5 `predict_step_ms` (section 7, "Predict your step": compared with the model on four
# pipelines and links, a known wrong derivation named).
# `workbook run pp_schedules` checks your work; `workbook hint pp_schedules zb_h1` gives a hint
# when you ask for one.

# %%
check_your_work("pp_schedules")
