# %% [markdown]
# # Lesson 13 — Mixture of experts: expert parallelism, its all-to-all hidden
#
# A mixture-of-experts (MoE) layer replaces a block's MLP by $E$ MLPs, the *experts*, and a
# *router* that sends each token to $k$ of them (Shazeer et al. 2017,
# [arXiv 1701.06538](https://arxiv.org/abs/1701.06538)). The model holds $E$ times the MLP's
# parameters, but each token pays for only $k$ of them. Under **expert parallelism** (EP; GShard,
# Lepikhin et al. 2020, [arXiv 2006.16668](https://arxiv.org/abs/2006.16668)) the experts are
# spread over $ep$ ranks, $E/ep$ each, and every rank keeps its own tokens. So each layer ships
# tokens to the ranks of their experts and the results back: two **all-to-alls** in the forward
# pass and two in the backward. They are uneven, they are on the critical path, and at the scale
# of DeepSeek-V3 ([arXiv 2412.19437](https://arxiv.org/abs/2412.19437)) they cost as much time as
# the experts' compute. This lesson builds the layer and then hides its all-to-alls in three ways:
#
# 1. routing, and the load it makes; 2. dispatch and combine; 3. what an uneven all-to-all costs;
# 4. EP as an autograd op; 5. the shared expert behind the dispatch; 6. deferred weight gradients;
# 7. two micro-batches against each other; 8. predict, then measure; 9. the lab.

# %%
import tempfile
from pathlib import Path

import torch

from workbook import link
from workbook.expert_parallel import ep_overlap_lesson as lesson
from workbook.expert_parallel import ep_overlap_lesson_ranks as ranks
from workbook.expert_parallel import layer_actions, route
from workbook.grading.labs import load_lab
from workbook.lessons import check_your_work, on_ranks, yours_reference_or_recorded
from workbook.measure import lesson_figures as lf
from workbook.measure.output import where_measured

RANKS = 2
runs = Path(tempfile.mkdtemp(prefix="lesson13-"))
SHOWN = yours_reference_or_recorded("ep_overlap")   # "yours", "reference", or "recorded"
mine = load_lab("ep_overlap", "labs")

# %% [markdown]
# ## 1. Routing, and the load it makes
#
# For a token $x_t$ (a row of width $H$) the router is one linear layer $W_r$ of shape $[E, H]$
# and a softmax, then the $k$ largest probabilities, renormalised to sum to one:
#
# $$ p_t = \mathrm{softmax}(x_t W_r^\top), \qquad e_{t1},\dots,e_{tk} = \text{the } k
#    \text{ largest entries of } p_t, \qquad w_{tj} = \frac{p_t[e_{tj}]}{\sum_i p_t[e_{ti}]},
#    \qquad y_t = \sum_{j} w_{tj}\,\mathrm{Expert}_{e_{tj}}(x_t). $$
#
# The given `route` (`workbook/model/moe.py`) does exactly this; here it is on 4 tokens, $E = 4$,
# $k = 2$:

# %%
gen = torch.Generator().manual_seed(0)
x, W_r = torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen)
r = route(x, W_r, 2)
print("probabilities p_t:\n", r.probs.numpy().round(3))
print("chosen experts  :", r.experts.tolist())
print("weights w_tj    :", r.weights.numpy().round(3).tolist(), "(each row sums to 1)")

# %% [markdown]
# Nothing in a softmax keeps the experts equally busy. A router that prefers a few experts makes
# them (and the ranks that hold them) the slowest part of the layer, while the others idle. Switch
# Transformer (Fedus et al. 2021, [arXiv 2101.03961](https://arxiv.org/abs/2101.03961), eq. 4)
# adds an auxiliary loss that pushes back: with $f_e$ the fraction of the $T k$ assignments that
# went to expert $e$ and $P_e$ the mean router probability of $e$,
#
# $$ \mathcal{L}_\text{aux} = E \sum_e f_e\, P_e, $$
#
# which is 1 when both are uniform and grows as the load concentrates (its gradient reaches the
# router through $P_e$; $f_e$ is a count). The lesson's routing below is a random router on random
# tokens with its logits *tilted*: expert $e$'s logit lowered by $\text{skew}\cdot e/(E-1)$, so
# low-numbered experts are popular, as a router early in training often makes them.
#
# **Predict** before you run the cell: 2 ranks, 64 tokens each, $E = 8$ (experts 0–3 on rank 0,
# 4–7 on rank 1), $k = 2$, skew 1.5. With no skew, each expert would get $2 \cdot 64 \cdot 2/8 =
# 32$ assignments. Which rank receives more rows, and roughly how many more?

# %%
routed = lesson.routing(8, 2, 64, RANKS, skew=1.5)
print(f"load-balancing loss: {routed['aux']:.3f} (skew 0 gives "
      f"{lesson.routing(8, 2, 64, RANKS, skew=0.0)['aux']:.3f})")
lesson.load_heatmap(routed["counts"], "tokens per expert per source rank: E=8, k=2, skew 1.5, "
                                      "64 tokens a rank")

# %% [markdown]
# Read the heatmap by blocks: the left block (experts 0–3) is what rank 0 will *receive*, from
# itself and from rank 1; a row's right block is what that rank *sends* away. The load-balancing
# loss sits above 1 by the share the popular experts take. Section 3 turns these counts into time.
#
# ## 2. Dispatch and combine
#
# Each rank routes its own tokens, then five steps move them and bring the answers back:
#
# 1. **sort** the kept assignments by expert (the given `sort_by_expert`): a token with $k = 2$
#    appears twice, once per expert; rank $r$'s first rows go to rank 0, the next to rank 1, ...
#    (`rank_splits`);
# 2. **exchange the counts**: nobody knows how many rows it will receive until every sender tells
#    it; one small even all-to-all of $E$ integers a rank;
# 3. **dispatch**: the rows' all-to-all with uneven splits (a pair of ranks may exchange nothing);
#    rows arrive *source-major*: all of source 0's rows (expert by expert), then source 1's;
# 4. the local experts want their rows together, *expert-major* (`expert_major_order`); run
#    them;
# 5. **combine**: the results back in source-major order, the reverse all-to-all, then each row
#    multiplied by its router weight $w_{tj}$ and added into its token's row (un-permuted).
#
# On paper, for a tiny routing (2 ranks, $E = 4$, $k = 2$, 3 tokens a rank), the given bookkeeping
# on each rank:

# %%
paper = lesson.dispatch_on_paper(num_experts=4, top_k=2, tokens=3, ep=RANKS)

# %% [markdown]
# **Predict** the counts rank 0 must learn in step 2, as a table `recv_counts [ep, E/ep]`: row $s$
# is what source $s$ sends each of rank 0's experts (experts 0 and 1). Read them off the two lines
# above, then check below; the next cell also shows what step 4 does with rows that arrive in
# that order (`s1e0`: from source 1, for local expert 0).

# %%
recv_counts_rank0 = torch.stack([c[:2] for c in paper["counts"]])
print("recv_counts on rank 0:", recv_counts_rank0.tolist())
lesson.regroup_on_paper(recv_counts_rank0)

# %% [markdown]
# **Think it through** (tasks 1, 3, 4): in step 2 every rank sends each rank one equal piece of
# its counts. Which piece goes to rank $d$? And in the combine, which of the dispatch's lists
# become the send splits, which the receive splits? The capacity factor (given, `capacity_keep`)
# drops a token's assignment past an expert's budget before step 1: a dropped row never travels.
#
# ## 3. The all-to-all's cost: the busiest receiver
#
# An even all-to-all on $n$ ranks, each holding $S$ bytes, sends $(n-1)/n$ of them away and
# receives as much: on the alpha-beta link of lesson 3, $t = \alpha + \frac{n-1}{n} S/B$. A
# dispatch is not even. Every rank drives its own port, in and out at once, so the exchange is
# over when the rank with the most bytes to send, or to receive, is done (`workbook/link/
# topology.py`, the simulated link's model):
#
# $$ t = \alpha + \frac{1}{B}\,\max_r \max\Big(\sum_{d\neq r} M_{rd},\; \sum_{s\neq r}
#    M_{sr}\Big), $$
#
# with $M_{sd}$ the bytes from $s$ to $d$ (what a rank keeps costs nothing). The *total* bytes do
# not set the time: the busiest port does, and a popular expert makes its rank that port. Here is
# the routing of section 1, at a real model's width ($H = 4096$, bf16) on a DGX-H100's NVLink at
# its real speed, beside the same bytes spread evenly:

# %%
rows = lesson.sent_rows(routed["counts"], RANKS)
nvlink = lesson.real_link("dgx-h100", RANKS)
costs = lesson.a2a_costs(nvlink, rows, 4096 * 2)
alpha_us, uneven_us, balanced_us = nvlink.latency_s * 1e6, costs["uneven"] * 1e3, \
    costs["balanced"] * 1e3
print(f"rows [sender][receiver]: {rows}")
print(f"dispatch: {uneven_us:.2f} us = alpha {alpha_us:.2f} us + {uneven_us - alpha_us:.2f} us "
      f"for the busiest port's bytes")
print(f"the same bytes balanced: {balanced_us:.2f} us = alpha + {balanced_us - alpha_us:.2f} us "
      f"(the routed bytes' part: {(uneven_us - alpha_us) / (balanced_us - alpha_us):.2f}x that)")
lesson.busiest_figure(costs, "bytes each rank sends and receives in the dispatch of section 1 "
                             "(H = 4096, bf16)")

# %% [markdown]
# At 64 tokens a rank the latency is most of it; the bytes' part grows with the tokens, and so
# does what the imbalance costs. Two ranks show the idea, not the scale. Play with the router and
# the machine below: the experts, $k$, the skew, the EP size (beyond 8 ranks a node, the dispatch
# crosses the network, 18 times slower per GPU than NVLink) and the tokens a rank. **Think it through**: at skew 0, why is the
# dispatch still slower than the balanced figure (look at the heatmap's spread)? Why does a
# capacity factor, which drops the assignments past an expert's budget, bound the dispatch's
# time, and what does it cost the model?

# %%
lesson.load_explorer()

# %% [markdown]
# ## 4. EP as an autograd op
#
# Take all the rows of all the ranks as one column. An all-to-all moves each row somewhere else
# and changes none: it is a *permutation matrix* $P$, and received $= P \cdot$ sent. The backward
# of a linear map multiplies by its transpose, $\partial L/\partial\text{sent} = P^\top
# \partial L/\partial\text{received}$, and the transpose of a permutation is its inverse: every
# row's gradient travels back to where the row came from. That is the same exchange with each
# rank's send and receive splits swapped, so **the backward of a dispatch is a combine, and the
# backward of a combine is a dispatch**. The cell builds $P$ for a small exchange on one process
# (rank 0 keeps 2 rows and sends 3, rank 1 sends 1 and keeps none) and checks both claims.

# %%
print(lesson.adjoint_check([[2, 3], [1, 0]]))

# %% [markdown]
# In the lab, `AllToAll` is a `torch.autograd.Function` whose forward calls
# `dist.all_to_all_single` with both split lists and whose backward is one line (task 2). Every
# gradient of the single-device layer then follows: the router's through the weights $w_{tj}$ in
# the combine, the experts' on the ranks that hold them, the input's through the dispatch's
# backward. A check of your lab on 2 ranks (fp64, against the single-device layer): where a variant
# does not run yet, the cells below use the reference `solutions/ep_overlap.py` for it.

# %%
verdicts = lf.probe(ranks.check, RANKS, "labs", keys=ranks.VARIANTS, timeout=90)
for variant, verdict in verdicts.items():
    print(f"your {ranks.CALL[variant]:22s} {verdict}")

# %%
IMPL = {v: "labs" if verdicts[v] == "ok" or not ranks.reference_here() else "solutions"
        for v in verdicts}
print("shown below:", {v: "yours" if i == "labs" else "the REFERENCE" for v, i in IMPL.items()})

# %% [markdown]
# ## 5. The shared expert behind the dispatch
#
# DeepSeekMoE ([arXiv 2401.06066](https://arxiv.org/abs/2401.06066)) adds a **shared expert**: one
# MLP every token goes through, beside the routed ones. It needs no token from anyone, so it can
# run *while the dispatch travels*: start the all-to-all with `async_op=True`, compute the shared
# expert, then wait (Megatron-core's `moe_shared_expert_overlap`). In the backward, autograd
# walks the graph in reverse: if the wait's backward only *starts* the exchange of the rows'
# gradients and the start's backward *waits* for it, the shared expert's backward lands in
# between, and hides the dispatch's backward too (tasks 6–9).
#
# What hides is at most the shared expert's time; the rest of the transfer is exposed, the rank
# waiting at the wait. **Predict**: $E = 64$, $k = 8$, 1024 tokens a rank, $H = 4096$, skew 1:
# does a shared expert as wide as the model ($1H$) hide the dispatch inside one DGX-H100 node
# (EP 8)? Across two nodes (EP 16), how wide must it be? The cell prints both sides, at the real
# machine's speed; the exposed part is yours to work out.

# %%
for ep in (8, 16):
    routed_ep = lesson.routing(64, 8, 1024, ep, skew=1.0)
    lesson.shared_vs_dispatch(lesson.sent_rows(routed_ep["counts"], ep), 1024, 4096,
                              widths=(1, 2, 4))

# %% [markdown]
# Inside a node a shared expert a little wider than the model covers the dispatch; once the
# dispatch leaves the node, each GPU's network card is 18 times slower than its NVLink and no
# reasonable shared expert covers it. That is one reason DeepSeek-V3 sends each token to experts
# on at most 4 nodes, and why the next two ideas look for more work to hide behind.

# %% [markdown]
# ## 6. Deferred weight gradients
#
# Lesson 12 split a linear layer's backward in two: $dx = dy\,A$, which the layer below waits for,
# and $dA = dy^\top x$, which nobody needs before the optimizer (zero-bubble pipelines, Qi et al.
# 2023, [arXiv 2401.10241](https://arxiv.org/abs/2401.10241); Megatron-core's
# `delay_wgrad_compute`). In an MoE layer's backward, the experts' $dx$ must travel home (the
# dispatch's backward) before the router and the input get theirs, and at that moment the experts'
# $dA$ products are work the rank can do while the rows travel. The given `run_experts_deferred`
# computes only $dx$ in the backward and stashes $(x, dy)$ per linear in an `ExpertGradStore`;
# `flush` turns them into $dA$ (tasks 10–11: start the exchange, flush, then wait):

# %%
lesson.deferred_demo()

# %% [markdown]
# ## 7. Two micro-batches against each other
#
# The shared expert hides only the dispatch, and only as much as it lasts. DeepSeek-V3 (DualPipe
# in training; in serving, the two micro-batches of its prefilling stage) hides every all-to-all
# behind *other work*: cut a rank's tokens into micro-batches A and B, and while A's
# tokens travel, B computes, and the other way round. Each micro-batch's layer is a chain of
# actions (`workbook/expert_parallel/two_batch.py`): forward, `compute router` (with the shared
# expert and the counts), `start dispatch`, `wait dispatch`, `compute experts`, `start combine`,
# `wait combine`; the backward the reverse. A schedule is one list of both chains' actions, in an
# order every dependency allows.
#
# **Think it through** (task 12): play the two chains one after the other (A, then B) on paper
# below: every transfer is waited for as soon as it starts. Which of B's computes could run while
# A's dispatch travels, and which of A's while B's travels? How many transfers of the forward pass
# can be hidden at all, and why not the last one (in one layer;
# the next layer's work hides it in a model)? The given `check_schedule` rejects a schedule that
# waits while a compute was ready; once yours passes, it is drawn beside the naive order. Then the
# backward pass, whose chains run the other way: which of its transfers has nothing to hide
# behind?
#
# Several orders pass that check; the lab asks for the one a simple rule (list scheduling) gives,
# applied action by action: *start a transfer as soon as it can go; otherwise run a compute that is
# ready, A's before B's; only when nothing is left to compute, wait, for the transfer that started
# first.* With deferred weight gradients, a micro-batch's `compute wgrad` (which nobody waits for)
# goes just before the wait for its own dispatch's backward, the transfer it is there to hide.

# %%
paper_costs = {"router": 1.0, "experts": 2.0, "transfer": 1.5}
drawn = {}
for phase in ("forward", "backward"):
    drawn[f"{phase}, A then B"] = list(layer_actions(phase))
    yours = lesson.schedule_or_none(mine, phase)
    if yours:
        drawn[f"{phase}, yours"] = yours
lesson.paper_figure(drawn, paper_costs, "on paper: router 1, experts 2, a transfer 1.5 "
                                        "(the same costs in both passes)")

# %% [markdown]
# On ranks, autograd cannot follow such an order: one `backward()` runs the whole graph in an
# order of its own. The given `TwoBatchExecutor` keeps each piece of a micro-batch's layer in a
# graph of its own, the pieces meeting at leaves across the exchanges, and calls your
# `forward_action` and `backward_action` in the schedules' order (task 13).
#
# **Predict** before you run the next cell, for 2 ranks on the simulated DGX-H100 link (256 tokens
# of width 256 a rank, $E = 4$, $k = 1$, a shared expert $16H$ wide, each expert $8H$): the plain
# layer (`ep_moe`) waits for all of its all-to-alls. Which overlap hides more of the forward
# pass's link time, the shared expert or two micro-batches? And of the backward's, where the
# deferred weight gradients (section 6) join in? Each variant takes a small warm-up step, then
# a traced one; per pass, the table gives a rank's all-to-all link time and exposed time (the
# mean of the two ranks) and the share hidden.

# %%
run_impls = dict(IMPL)                  # every variant: yours where it runs, else the reference
main = on_ranks(ranks.ep_step, RANKS, str(runs), run_impls, 4 * ranks.HIDDEN, link="dgx-h100",
                timeout=240)
sim = link.make_link("dgx-h100", main[0]["local_flops"])             # as the ranks calibrated it
label = where_measured(sim.label)
print(f"2 ranks, {label}")
ranks.hidden_table(main)

# %% [markdown]
# The two-micro-batch step, both ranks. On each compute row a bar per action (A blue, B green,
# the backward paler); on each link row the all-to-alls while the link carried them, red from the
# moment the rank waited. The counts' exchange is small but pays the link's whole latency, and
# the router waits for it: it hides behind nothing here. Look for B's counts, too: the link
# carries one all-to-all at a time, so they queue behind A's dispatch. What B's router computes
# *before* its counts leave (its routing, its shared expert) is what hides A's dispatch.

# %%
whose = "your" if IMPL["two_batch"] == "labs" else "the REFERENCE"
ranks.rank_timeline(main, "two_batch", f"{whose} TwoBatchMoE, 2 ranks — {label}")

# %% [markdown]
# Read it from the left: while A's dispatch travels, B's router and shared expert run; while
# B's travels, A's experts. In the backward, both combines' gradients leave first, and the experts' backward of one
# micro-batch covers the other's transfer. The forward pass hides far less than the backward: the
# counts' exchanges, each a full latency, hide behind nothing, nor does the last combine, and the
# two ranks share this machine's two cores with the copies gloo makes (`workbook bench
# ep_overlap` measures every variant at more sizes). In a model with many layers, each layer's
# last transfer hides behind the next layer's first compute; DualPipe goes further and overlaps
# one micro-batch's forward with another's backward.
#
# ## 8. Predict, then measure
#
# The lab's prediction task (task 14), `predict_dispatch_exposed_ms(link, sent_rows, hidden,
# itemsize, t_shared_ms)`: the milliseconds of the dispatch's all-to-all left exposed when the shared expert
# runs while it travels, from the link model (`link.all_to_all_time` takes bytes, sender by
# receiver) and the shared expert's time. **Think it through** before you write it: which rows
# does the dispatch carry and how many bytes is that; what does the link charge for the busiest
# port; which part of it can the shared expert cover?
#
# To make it worth predicting, the run of section 7 took one more step of the shared-expert
# overlap with the shared expert narrowed to $4H$, so that the dispatch outlasts it. Each rank's
# prediction takes the dispatch's rows (sender by receiver, as the link logged them) and the
# shared expert's time that rank measured; beside it, the exposed dispatch in the rank's trace
# (from its first wait to the transfer's modelled end).

# %%
print(f"the shared expert 4H wide; {label}")
ranks.prediction_table(main, mine, sim)

# %% [markdown]
# The model is the one the grader and `workbook run ep_overlap` judge your prediction against.
# It and the measurement part by what the model leaves out: the rank's other work between the
# start and the wait (the Python around the shared expert, which hides a little more), and a peer
# that arrives late at the exchange (its skew, which adds to the wait). Where your value differs
# from the model's, the line under the table says which term to recheck.
#
# ## 9. The lab
#
# `labs/ep_overlap.py`, in order: task 1 `exchange_counts` and task 2 `AllToAll` (sections 2
# and 4), tasks 3–5 `dispatch`, `combine`, `ep_moe` (section 2), tasks 6–9 the shared expert behind
# the dispatch (section 5), tasks 10–11 the deferred weight gradients (section 6), tasks 12–13 two
# micro-batches, the schedule graded at once, then the executor (section 7), and task 14 the
# prediction (section 8). The given pieces are in `workbook/expert_parallel/` and `workbook/model/moe.py`:
# read their docstrings first. `workbook run ep_overlap` checks your work; `workbook hint
# ep_overlap N` gives the hints of task N one rung at a time.

# %%
check_your_work("ep_overlap")
