# %% [markdown]
# # Lesson 11 — Context parallelism: ring attention with its K/V traffic hidden
#
# The parallelisms so far cut the model or the batch. None helps when *one sequence* is too long
# for a device: attention, where every position looks at every earlier one, costs time that grows
# with the *square* of the length. Context parallelism (CP) cuts the sequence itself: with $n$
# ranks, each keeps $S/n$ positions. Projections, MLP and norms are per position and run on a shard
# without asking anyone; attention is the exception, as the query at position $p$ needs the keys
# and values of *every* position $\le p$, most of them on other ranks. This lesson moves them
# without paying for it:
#
# 1. why CP, and the two ways to get K/V to every rank: gather them all, or pass them round a
#    ring (ring attention, Liu, Zaharia & Abbeel 2023,
#    [arXiv 2310.01889](https://arxiv.org/abs/2310.01889));
# 2. the *online softmax*, which attends to one block of keys at a time and still gets the exact
#    answer (Milakov & Gimelshein 2018, [arXiv 1805.02867](https://arxiv.org/abs/1805.02867);
#    FlashAttention, [arXiv 2205.14135](https://arxiv.org/abs/2205.14135));
# 3. the causal mask block by block, and the zig-zag split of Megatron and NeMo that keeps every
#    rank equally busy;
# 4. what travels round the ring, and when a hop hides behind one step's attention;
# 5. ring attention on your own ranks, traced, and a sweep of the sequence length.

# %%
import tempfile
from pathlib import Path

from workbook import link, trace
from workbook.context_parallel import contiguous_layout
from workbook.context_parallel import cp_ring_lesson as lesson
from workbook.grading.labs import load_lab
from workbook.lessons import (check_your_work, on_ranks, reference_lab, sized,
                             yours_reference_or_recorded)
from workbook.measure import lesson_figures as lf
from workbook.measure.output import where_measured

PRESET, RANKS = "dgx-h100", 2
RUN_SHAPE = dict(B=1, h=4, d=64)            # batch, heads, head width of the runs on ranks (fp32)
runs = Path(tempfile.mkdtemp(prefix="lesson11-"))

SHOWN = yours_reference_or_recorded("cp_ring")   # "yours", "reference", or "recorded" (a release)

# %%
mine, reference = load_lab("cp_ring", "labs"), reference_lab("cp_ring")


def pick(name, problem_of):
    """Your lab's ``name`` where ``problem_of(fn, reference)`` finds nothing wrong, else the
    reference's."""
    return lf.yours_or_reference(name, getattr(mine, name), getattr(reference, name),
                                 lambda fn: problem_of(fn, reference), "solutions/cp_ring.py")


# %% [markdown]
# ## Why cut the sequence
#
# In one layer of width $H$ ($a$ heads of width $d = H/a$) and one sequence of $S$ tokens, the
# linear layers cost about $2 \cdot S \cdot 12H^2$ FLOPs in the forward pass, linear in $S$;
# attention's $QK^\top$ and $PV$ cost $4 S^2 H$, half of it under the causal mask: quadratic in
# $S$. For width 4096 (32 heads of 128) in bf16 the two are equal at $S = 12H$, about 50k tokens;
# beyond, attention is most of the work, and one layer's K and V take gigabytes. (The last column,
# the $S \times S$ probabilities, shows why FlashAttention never stores them.)

# %%
def one_layer(S, hidden=4096, heads=32, e=2):
    """FLOPs of one layer's forward pass for one sequence, and bytes of its K and V."""
    linear = 2 * S * 12 * hidden**2
    attention = 4 * S * S * hidden / 2                     # QK^T and PV, half of it causal
    return linear, attention, 2 * S * hidden * e, heads * S * S * e


print(f"{'S':>9}{'linear TFLOP':>14}{'attention TFLOP':>17}{'attention share':>17}"
      f"{'K+V GiB':>9}{'scores GiB':>12}")
for S in (4096, 32768, 131072, 1048576):
    lin, att, kv, scores = one_layer(S)
    print(f"{S:9,d}{lin / 1e12:14.2f}{att / 1e12:17.2f}{att / (lin + att):16.0%}"
          f"{kv / 2**30:9.2f}{scores / 2**30:12,.0f}")

# %% [markdown]
# ### What a rank needs, and two ways to give it
#
# After the cut, rank $r$ holds $Q_r, K_r, V_r$ of its own positions, shaped `[B, h, S/n, d]`.
#
# * **Gather them.** An all-gather of K and V before attention, a reduce-scatter of their
#   gradients after. Simple, but the gather sits on the critical path, and every rank holds K/V
#   for all $S$ positions, which gives back part of the memory CP was meant to save.
# * **Pass them round a ring.** At step $t = 0, \dots, n-1$, rank $r$ holds the K/V block of rank
#   $(r - t) \bmod n$. It sends that block on to rank $r+1$ and receives the next one from rank
#   $r-1$ *while* it computes attention on the block it holds. After $n$ steps it has seen every
#   block, has moved exactly the bytes of the all-gather, and never held more than two blocks.
#
# NeMo does the second whenever `context_parallel_size > 1`, the same idea as the TP ring of
# lesson 8. One thing stands in the way: softmax normalises over the whole row of keys, and the
# ring delivers them a block at a time.
#
# ## The online softmax
#
# Fix one query row with scores $s_1, \dots, s_N$ against the keys, and values $v_j$. Attention
# returns
#
# $$o = \frac{\sum_j e^{s_j} v_j}{\sum_j e^{s_j}}
#     = \frac{\sum_j e^{s_j - m} v_j}{\sum_j e^{s_j - m}}\quad\text{for any constant } m,$$
#
# and $m = \max_j s_j$ keeps every exponent $\le 0$. Now split the keys into two disjoint sets
# $A$ and $B$ (two blocks of the ring) and summarise each set $X$ by three numbers per row,
# computed with *its own* maximum:
#
# $$m_X = \max_{j \in X} s_j, \qquad \ell_X = \sum_{j \in X} e^{s_j - m_X}, \qquad
#   \mathrm{acc}_X = \sum_{j \in X} e^{s_j - m_X}\, v_j .$$
#
# For the union, with $m = \max(m_A, m_B)$, every term of $A$ satisfies
# $e^{s_j - m} = e^{s_j - m_A}\, e^{m_A - m}$, and likewise for $B$. Therefore
#
# $$\ell = \ell_A\, e^{m_A - m} + \ell_B\, e^{m_B - m}, \qquad
#   \mathrm{acc} = \mathrm{acc}_A\, e^{m_A - m} + \mathrm{acc}_B\, e^{m_B - m},$$
#
# and at the end $o = \mathrm{acc} / \ell$: exact, and the factors $e^{m_X - m} \le 1$ cannot
# overflow. The backward pass wants one more number per row, the log-sum-exp
# $\mathrm{lse} = m + \log \ell$: with it, the probabilities of any block can be recomputed later
# as $P = e^{S - \mathrm{lse}}$ without seeing the other blocks again.
#
# Streamed block after block, the running state is multiplied by $e^{m_\text{old} - m_\text{new}}$,
# then the new block is added. When the new block holds no score above the running maximum, that
# factor is exactly 1. This is what makes a forgotten rescale a treacherous bug: it is right for
# every row whose maximum came early, and wrong exactly for the rows whose maximum moved.
#
# The table checks both statements: six query rows, two blocks of five keys, the second block's
# scores below the first's maximum in rows 0-2 and above it in rows 3-5, merged by your
# `merge_partials` (task 1 of the lab) once it is right, by the reference until then.

# %%
merge, merge_who = pick("merge_partials", lambda fn, _: lesson.merge_problem(fn))
lesson.rescale_table(merge, merge_who)

# %% [markdown]
# The merge agrees with the softmax over all ten keys to rounding. The careless merge is exact in
# rows 0-2, where the factor is 1, and wrong in rows 3-5, by more the further the maximum moved;
# the grader tests both kinds of rows. A ring applies the merge once per step: the same check,
# streamed, one row of 96 keys folded in 12 blocks of 8.

# %%
lesson.streamed_check(merge)

# %% [markdown]
# ## The causal mask, one block pair at a time
#
# Cut the sequence into $K$ chunks of $L$ positions. Under the causal mask, the queries of chunk
# $i$ and the keys of chunk $j$ form one of three kinds of block:
#
# * $j > i$: every key is in the future of every query, and the block is **skipped**;
# * $j = i$: the **diagonal** block, where query $p$ sees the keys $\le p$: the lower triangle;
# * $j < i$: every key is in the past, and the block is **full**, no mask at all.
#
# The lab's `block_mask(q_chunk, kv_chunk)` makes that decision, and `block_pairs(layout, rank,
# src)` lists the blocks rank `rank` computes while it holds rank `src`'s K/V. A `Layout` says
# which chunks each rank holds. The plain (**contiguous**) split gives rank $r$ chunk $r$. The
# **zig-zag** split of Megatron-LM and NeMo cuts the sequence into $2n$ chunks and gives rank $r$
# chunks $r$ and $2n-1-r$: one from the front of the sequence and one from the back.
#
# The figure draws the score matrix at chunk resolution (query chunks down, key chunks across)
# for 4 ranks, one panel per ring step: a cell is coloured by the rank that computes it at that
# step (◣ diagonal, ■ full), grey if computed at another step, white if never.

# %%
block_mask, _ = pick("block_mask", lesson.block_mask_problem)
block_pairs, pairs_who = pick("block_pairs", lesson.block_pairs_problem)
zigzag_layout, zigzag_who = pick("zigzag_layout", lesson.zigzag_problem)
drawn = {"contiguous": contiguous_layout(32, 4), "zig-zag": zigzag_layout(32, 4)}
lesson.mask_grid(drawn, 4, block_pairs, f"the blocks each rank computes at each ring step, 4 "
                 f"ranks ({pairs_who} block_pairs, {zigzag_who} zigzag_layout)")

# %% [markdown]
# Step 0 is the diagonal: each rank starts on its own K/V. In the contiguous split (top), from
# step 1 on rank 0 computes nothing (every block that reaches it is in its future), while the last
# rank computes a full block at every step. In the zig-zag split (bottom) every rank has the same
# work at every step; count its blocks, at step 0 and after, and keep the count for later.
#
# `Layout.causal_work()` counts the score entries a rank's queries need. Below, for $S = 4096$ on
# 4 ranks: the total per rank, and the work per rank and ring step in full $(S/n) \times (S/n)$
# blocks. The ranks exchange K/V in lockstep, so a ring step lasts as long as its busiest rank.

# %%
lesson.work_figure({"contiguous": contiguous_layout(4096, 4), "zig-zag": zigzag_layout(4096, 4)},
                   block_pairs)

# %% [markdown]
# The contiguous split gives the last rank $\frac{2n-1}{n}$ times the average work (1.75 on 4
# ranks) and rank 0 a quarter of it; the ring runs at the last rank's pace, so about 43% of the
# ranks' time is idle. The zig-zag split is exactly balanced. (The bill comes elsewhere: a rank's
# two chunks are not adjacent, so positional encodings such as RoPE must use each row's *global*
# position, which `cp_attention` takes from `layout.positions(r)`.)
#
# ## What travels, and when it hides
#
# **Forward.** K and V travel together, one buffer `[2, B, h, S/n, d]` per hop. A rank posts the
# hop of the block it holds (send to $r+1$, receive from $r-1$) *before* computing attention on
# it, and waits for the incoming block only after: $n-1$ hops, each in flight during one step's
# attention, each carrying
#
# $$b_\text{hop} = 2 \cdot B \cdot h \cdot \frac{S}{n} \cdot d \cdot e \quad\text{bytes},$$
#
# so the forward pass moves $(n-1)\,b_\text{hop}$ per rank, the same as an all-gather of K and V.
#
# **Backward.** The K/V blocks go round once more ($n-1$ hops), each step recomputing its
# blocks' probabilities from the saved $\mathrm{lse}$. The gradients $dK_j$, $dV_j$ are sums over
# *every* rank's queries that read block $j$, and they must end up on rank $j$: a dK/dV buffer
# rides the ring one step behind its K/V block, each rank adding its share, and one last hop
# brings each sum home. So the backward pass moves $(2n-1)\,b_\text{hop}$ per rank, and the very
# last dK/dV hop has no compute left behind which to hide.
#
# **Think it through** before tasks 4 and 5: a step's blocks each belong to some of the rank's
# query rows; how does a block's result join what earlier steps computed for those rows, and when
# does a row's output become final? What would waiting for the incoming block *before* the step's
# attention cost? In the backward pass, when a dK/dV buffer reaches a rank, whose block's gradient
# is it, what must the rank add before passing it on, and which buffer is its own at the end?
#
# **The overlap condition.** With $c = S/n$ positions per rank, a step's attention on one full
# block costs $4 B h c^2 d$ FLOPs, or a share $k$ of it under the causal mask ($k = \tfrac12$ for
# a zig-zag step away from the diagonal). In the style of the appendix:
#
# $$ r_\text{CP} = \frac{t_\text{hop}}{t_\text{step}}
#    = \frac{\alpha + 2 B h c d e / \beta}{k \cdot 4 B h c^2 d / F}
#    \;\approx\; \frac{e\,F}{2\,k\,c\,\beta} \;\le\; 1
#    \quad\Longleftrightarrow\quad c \;\ge\; c^* = \frac{e\,F}{2\,k\,\beta}. $$
#
# $B$, $h$ and $d$ cancel: only the *tokens per rank* decide. On a DGX-H100 ($F \approx 790$
# TFLOP/s in bf16, $\beta = 900$ GB/s, $e = 2$), $F/\beta \approx 880$: a full block hides its hop
# from about 880 tokens per rank, a zig-zag step from about 1760. The backward pass computes 2.5
# times the forward FLOPs behind twice the bytes: a little easier. **Predict** where the crossing
# moves across nodes and over PCIe before you read the table, which solves $r_\text{CP} = 1$ per
# preset, latency included.

# %%
lesson.ratio_figure()

# %% [markdown]
# Across nodes the crossing moves up about twice, over PCIe about twelve times (real kernels run
# below the peak rate, which helps). At 128k tokens on 8 CP ranks, 16k per rank, a hop takes a
# twentieth to a tenth of a step on NVLink, and over PCIe a zig-zag step no longer hides it. Try
# your own setting:

# %%
lesson.hop_explorer()

# %% [markdown]
# ## Predict your exposed exchange
#
# The ratio above asks *whether* a hop hides. The lab's last task asks *how much* of the forward
# pass's exchange stays exposed on your own ring, on the simulated link, before you run it (the
# link is handed to you calibrated: its latency $\alpha$, its bandwidth $1/\beta$ and the compute
# rate $F$ that a block's attention runs at).
#
# **Exposed** is the part of a transfer that no compute covers: a hop in flight behind some
# attention costs the rank nothing until it outlasts that attention, and from then on every
# moment of it is waiting. A prediction therefore weighs, hop by hop, the transfer's time on the
# alpha-beta link (lesson 3: $\alpha$ plus bytes times $\beta$, in seconds and bytes) against the
# compute it travels behind (FLOPs over $F$), and keeps only what sticks out.
#
# A worked example, for a *different* figure: ring attention **without** a causal mask (an
# encoder), where every step computes one full $(S/n) \times (S/n)$ block. Take $n = 4$ ranks,
# $S = 4096$, $B = 1$, $h = 8$, $d = 64$ in bf16 ($e = 2$), over a PCIe-like link of
# $\alpha = 20\,\mu$s and 25 GB/s, at $F = 100$ TFLOP/s. A hop carries K and V of 1024
# positions, $2 \cdot 8 \cdot 1024 \cdot 64 \cdot 2$ bytes = 2 MiB, in
# $20 + 83.9 = 103.9\,\mu$s; a full block is $4 \cdot 8 \cdot 1024^2 \cdot 64$ FLOPs, 21.5 $\mu$s.
# Each hop sticks out by about 82 $\mu$s, and the three hops of the forward pass leave about
# 0.25 ms exposed.

# %%
n, S, B, h, d, e = 4, 4096, 1, 8, 64, 2
alpha_s, bandwidth_Bps, flops = 20e-6, 25e9, 100e12
hop_s = alpha_s + 2 * B * h * (S // n) * d * e / bandwidth_Bps
full_block_s = 4 * B * h * (S // n) ** 2 * d / flops
print(f"no mask, n={n}: hop {hop_s * 1e6:.1f} us, full block {full_block_s * 1e6:.1f} us, "
      f"exposed forward {(n - 1) * max(0.0, hop_s - full_block_s) * 1e3:.3f} ms")

# %% [markdown]
# **Think it through** before you write `predict_forward_exposed_ms`: on the zig-zag split, how
# much attention does a rank compute at each ring step (read the mask grid above; is step 0 like
# the others?), and what does the given `block_forward` spend on a diagonal block? Which steps
# have a hop travelling behind them? After the traced run below, the lesson prints your prediction
# beside the model and the measurement.
#
# ## Your ring, on your ranks
#
# Now the lab itself, on 2 ranks over the simulated DGX-H100 link, in fp32 ($e = 4$). First a
# check of your `ring_attention`, forward and backward, on a tiny fp64 case against one device, on
# both splits; where it does not run yet, the lesson uses the reference `solutions/cp_ring.py`,
# and every figure says whose code it shows.

# %%
verdicts = lf.probe(lesson.check, RANKS, "labs", keys=("contiguous", "zigzag"), timeout=60)
print(f"your labs/cp_ring.py on {RANKS} ranks, forward and backward against one device:")
for split, verdict in verdicts.items():
    print(f"  {split:11s} {verdict}")
IMPL, WHO = lf.whose_code(verdicts, verdicts)
if IMPL == "solutions":
    print("Your ring attention does not run yet: what follows is the REFERENCE "
          "(solutions/cp_ring.py). Finish tasks 1-6 of the lab and run these cells again.")

# %% [markdown]
# ### One step, traced
#
# `lesson.ring_step` runs on every rank: it calibrates the link to the CPU's speed at that moment,
# takes a warm-up step, then one under the profiler with a `forward` and a `backward` range, while
# it spies on the lab's `block_forward` and `block_backward` (when each block ran, on which chunks)
# and `start_ring_exchange` (when each hop was posted, carrying K/V or a dK/dV sum); the link's
# log says when each transfer was carried and waited for. Both splits of $S = 4096$ tokens, 4
# heads of 64: a hop moves 4 MiB.

# %%
S_MAIN = sized(4096, in_tests=2048)     # tokens of the traced step (the tests: 2048)
main = on_ranks(lesson.ring_step, RANKS, str(runs / "main"), IMPL, S_MAIN, ("zigzag", "contiguous"),
                link=PRESET, timeout=180)
sim = link.make_link(PRESET, main[0]["local_flops"])              # as the ranks calibrated it
label = where_measured(sim.label)
print(f"{WHO} ring attention, S = {S_MAIN}, {RANKS} ranks; {label}")
print(f"one hop: 2*B*h*(S/n)*d*4 = {main[0]['hop_bytes'] / 2**20:.1f} MiB = "
      f"alpha {sim.latency_s * 1e3:.0f} ms + bytes/beta "
      f"{main[0]['hop_bytes'] / sim.bandwidth_Bps * 1e3:.0f} ms = "
      f"{sim.op_time('send', main[0]['hop_bytes'], RANKS) * 1e3:.0f} ms on the link")
for split in ("zigzag", "contiguous"):
    steps = [p["end"] - p["t0"] for p in (res["splits"][split] for res in main)]
    print(f"{split:11s}: forward + backward {max(steps):5.0f} ms on the slower rank")

# %% [markdown]
# The zig-zag step, both ranks. On each compute row one bar per block (`q3·k0`: chunk 3's queries
# over chunk 0's keys, ◣ diagonal), dark blue forward, light blue backward. On the link rows each
# send and receive while the link carried it (dotted before: queued), red once the rank waited.

# %%
lesson.ring_timeline(main, "zigzag", f"{WHO} ring attention, zig-zag split, S = {S_MAIN}, "
                     f"2 ranks — {label}")

# %% [markdown]
# Read it from the left. In the forward pass each rank posts its K/V hop, then computes the three
# blocks of its own two chunks while the hop travels; by the time it waits, the block has arrived.
# In the backward pass the K/V hop hides behind step 0's gradients, the first dK/dV hop (a partial
# sum) behind step 1's; the last dK/dV hop, which brings each rank its completed gradient, starts
# when all compute is over and is red: the one exposed transfer of the step, by design.
#
# The same step in the trace view every other lab uses:

# %%
zz_run = trace.load_run(runs / "main" / "zigzag")
trace.timeline_figure(zz_run, title=f"the zig-zag step in the trace — {WHO} ring attention, {label}")

# %% [markdown]
# What the trace counts as hidden: the share of each pass's link time that ran while the rank
# computed; `w/o skew %` counts as hidden the time a rank waited only for a late peer, as the
# grader does.

# %%
lesson.hidden_table(main)

# %% [markdown]
# Your prediction of the zig-zag forward pass's exposed exchange (the lab's last task) at this
# step's shape and on the link as the ranks calibrated it, beside the model and the trace. The
# model counts FLOPs at the calibrated *matmul* rate; the CPU's attention also spends time on
# exponentials, the mask and memory traffic, so its steps last longer and hide more than the
# model says: the measurement sits at or below the model.

# %%
lesson.prediction_table(main, mine, sim, S_MAIN, **RUN_SHAPE)

# %% [markdown]
# On 2 ranks the forward pass has a single hop, behind step 0's attention, and it hides
# completely. The backward pass has three hops, and the last one cannot hide: two thirds of its
# link time is the most it can hide on 2 ranks; with $n$ ranks, $2n-2$ hops of $2n-1$.
#
# The contiguous split moves the same bytes, but its ranks do not do the same work: rank 1 computes
# a diagonal block and then a full block, while rank 0 has a diagonal block and then nothing but
# transfers to wait for.

# %%
lesson.ring_timeline(main, "contiguous", f"{WHO} ring attention, contiguous split, S = {S_MAIN}, "
                     f"2 ranks — {label}")

# %% [markdown]
# ### The sequence length, through the crossing
#
# The attention grows like $c^2$, the hop like $c$. The sweep runs the zig-zag step for the sequence
# lengths of `SIZES` (the link recalibrated before each: the GFLOP/s column). Left, the forward hop
# over the compute behind it: by the FLOP model (the blocks step 0 computes, at the calibrated
# rate), and measured (the time in `block_forward` between posting the hop and waiting for it).
# Right, the share of each pass's link time hidden.

# %%
SIZES = sized([1024, 1536, 2048, 3072, 4096], in_tests=[1024, 2048, 4096])
sweep = on_ranks(lesson.ring_sweep, RANKS, str(runs / "sweep"), IMPL, SIZES, link=PRESET,
                 timeout=240)
rows = lesson.sweep_rows(sweep, PRESET, RANKS, **RUN_SHAPE)
lf.print_table(rows, lesson.SWEEP_COLUMNS)
lesson.sweep_figure(rows, f"{WHO} ring attention, a sweep of S — "
                    f"{where_measured(f'simulated link: {PRESET}')}, recalibrated for each S")

# %% [markdown]
# As $S$ grows, the measured ratio falls through 1 and the forward pass's hidden share rises to
# 100%, roughly as $1/\text{ratio}$; the backward pass follows, capped near two thirds by its last
# hop. (One step per point on two shared cores: rerun to see which points move.) The measured
# ratio lies well *below* the FLOP model, as the CPU's attention also spends time on exponentials,
# the mask and memory traffic: the model errs on the side of caution, as the appendix's ratios do.
# Its crossing lies near 3000 positions per rank, not 880: fp32, a hop behind the diagonal step
# (less than a full block), and a latency worth a quarter of a small hop.
#
# ## Exercise: the `cp_ring` lab
#
# Open `labs/cp_ring.py` and replace each `raise NotImplementedError`, in the order of its task
# list; `workbook hint cp_ring N` shows the hints of task N one rung at a time (the idea, then the
# steps, then near-code). The given pieces (`Layout`, `block_forward`, `block_backward`, `finish`,
# `start_ring_exchange`) are in `workbook/context_parallel.py`; read its docstring first.
#
# * task 1, `merge_partials`: the online-softmax merge of two partials, each side rescaled to the
#   common maximum;
# * tasks 2 and 3, `block_mask` and `block_pairs`: skip, diagonal or full for a pair of chunks,
#   and the blocks a rank computes while it holds another rank's K/V;
# * task 4, `ring_attention_forward`: the ring forward, each hop travelling behind a step's
#   attention;
# * task 5, `RingAttention.backward`: the ring backward, every dK/dV sum ending on its owner;
# * task 6, `zigzag_layout`: one early and one late chunk a rank, the same causal work on every
#   rank;
# * task 7, `predict_forward_exposed_ms`: your prediction of the forward pass's exposed exchange,
#   from "Predict your exposed exchange".
#
# Check yourself with `workbook run cp_ring`, grade with `workbook grade --lab cp_ring`, and
# compare splits and lengths with `workbook bench cp_ring`. The grader checks the merge (the
# running maximum staying and growing), the masks and the zig-zag split at once, without ranks;
# on 2 and 4 ranks the output, the log-sum-exp and every gradient against single-device causal
# attention in fp64 (both splits, lengths not powers of two, the attention sublayer with RoPE);
# from your trace the hops and their bytes ($n-1$ forward, $2n-1$ backward, no collective); and on
# the simulated link that compute ran between each hop's post and its wait, and that at least 60%
# of the forward and 30% of the backward link time hides.

# %%
check_your_work("cp_ring")
