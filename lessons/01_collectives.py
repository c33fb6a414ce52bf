# %% [markdown]
# # Lesson 1 — The collective operations
#
# A *collective* is one operation that every rank of a process group calls together. The ranks
# each bring a buffer; the collective decides what each rank holds afterwards. Eight of them
# carry nearly all the traffic of distributed training:
#
# | collective | afterwards | typical use |
# |---|---|---|
# | **broadcast** | everyone holds the root's buffer | initial weights from rank 0 |
# | **reduce** | the root holds the elementwise sum (or max, min…) | a loss summed on one rank |
# | **all-reduce** | everyone holds the sum | data-parallel gradients; tensor-parallel outputs |
# | **gather** | the root holds every rank's buffer, side by side | collecting metrics |
# | **all-gather** | everyone holds every rank's buffer | ZeRO-3 weights; sequence-parallel activations |
# | **scatter** | rank *r* holds the root's *r*-th chunk | distributing a batch |
# | **reduce-scatter** | rank *r* holds the *r*-th chunk of the sum | ZeRO gradients; sequence parallelism |
# | **barrier** | nothing moves; no rank leaves before all arrived | synchronising for timing |
#
# Two identities are worth remembering: **all-reduce = reduce-scatter + all-gather** (lesson 2
# builds it that way), and the *reduce* kinds combine values while the *gather* kinds only move
# them.
#
# Below, every rank starts with its own numbers (rank *r* holds `10·r + i`), runs one collective
# on real `torch.distributed` ranks, and reports what it holds before and after.

# %%
import ipywidgets as W
import plotly.graph_objects as go
from IPython.display import display

from workbook import link
from workbook.trace import colors
from workbook.lessons import buffers_figure, check_your_work, on_ranks, show_in

N = 4          # ranks used by the cells below


# %%
def run_collective(name: str, size: int, root: int) -> dict:
    """On every rank: fill a buffer, run collective ``name``, report before/after."""
    import time

    import torch
    import torch.distributed as dist

    from workbook.runtime.ranks import device
    rank, n, dev = dist.get_rank(), dist.get_world_size(), device()    # NCCL: tensors on the GPU
    mine = torch.arange(size, dtype=torch.float32, device=dev) + 10 * rank
    if name in ("scatter", "reduce_scatter"):            # these start from n chunks
        mine = torch.arange(n * size, dtype=torch.float32, device=dev) + 100 * rank
    before = mine.tolist()
    if name == "broadcast":
        dist.broadcast(mine, src=root)
        after = mine.tolist()
    elif name == "reduce":
        dist.reduce(mine, dst=root)
        after = mine.tolist() if rank == root else None   # elsewhere: unspecified, don't read
    elif name == "all_reduce":
        dist.all_reduce(mine)
        after = mine.tolist()
    elif name == "gather":
        parts = [torch.empty(size, device=dev) for _ in range(n)] if rank == root else None
        dist.gather(mine, parts, dst=root)
        after = torch.cat(parts).tolist() if rank == root else None
    elif name == "all_gather":
        out = torch.empty(n * size, device=dev)
        dist.all_gather_into_tensor(out, mine)
        after = out.tolist()
    elif name == "scatter":
        out = torch.empty(size, device=dev)
        dist.scatter(out, list(mine.chunk(n)) if rank == root else None, src=root)
        before = before if rank == root else None          # only the root's buffer is read
        after = out.tolist()
    elif name == "reduce_scatter":
        out = torch.empty(size, device=dev)
        dist.reduce_scatter_tensor(out, mine)
        after = out.tolist()
    elif name == "barrier":
        time.sleep(0.05 * rank)                              # ranks arrive one after another
        entered = time.time()
        dist.barrier()
        return {"entered": entered, "left": time.time()}
    else:
        raise ValueError(name)
    return {"before": before, "after": after}


def show(name: str, n: int = N, size: int = 3, root: int = 0):
    rows = on_ranks(run_collective, n, name, size, root)
    where = "" if name in ("all_reduce", "all_gather", "reduce_scatter") else f", root {root}"
    return buffers_figure([r["before"] for r in rows], [r["after"] for r in rows],
                          title=f"{name} on {n} ranks{where}")


# %% [markdown]
# ## Broadcast and reduce
#
# Broadcast copies the root's buffer to everyone. Reduce is its mirror: values flow *to* the
# root and are combined on the way; the other ranks' buffers are left in an unspecified state.

# %%
show("broadcast", root=1)

# %%
show("reduce", root=0)

# %% [markdown]
# ## All-reduce: every rank gets the sum
#
# This is the collective of data parallelism (sum the gradients of all replicas) and of
# Megatron tensor parallelism (sum the partial outputs of a row-parallel layer).

# %%
show("all_reduce")

# %% [markdown]
# ## Gather and all-gather; scatter and reduce-scatter
#
# The gather kinds concatenate in rank order. Scatter cuts the root's buffer into `n` chunks
# and hands chunk *r* to rank *r*; reduce-scatter does the same with the *sum* of every rank's
# buffer: each rank ends with one reduced chunk. Note the sizes: after an all-gather a rank holds
# `n` times what it brought; after a reduce-scatter, `1/n`.

# %%
show("all_gather")

# %%
show("scatter", root=2)

# %%
show("reduce_scatter")

# %% [markdown]
# ## Barrier
#
# Nothing is exchanged: the barrier only ends when the last rank has arrived. Here rank *r*
# arrives `50·r` ms late; all leave together.

# %%
marks = on_ranks(run_collective, N, "barrier", 0, 0)
t0 = min(m["entered"] for m in marks)
fig = go.Figure()
for r, m in enumerate(marks):
    fig.add_trace(go.Bar(orientation="h", y=[f"rank {r}"], base=[(m["entered"] - t0) * 1e3],
                         x=[(m["left"] - m["entered"]) * 1e3], marker_color=colors.WAIT,
                         name="waiting in barrier", showlegend=r == 0))
fig.update_layout(title="barrier: each rank waits for the last one", xaxis_title="ms",
                  height=260, yaxis=dict(autorange="reversed"))
fig

# %% [markdown]
# ## Play
#
# Choose a collective, the number of ranks, the buffer size and the root. Each change runs the
# collective again on real ranks (a new number of ranks first starts its processes).

# %%
pick = W.Dropdown(options=["broadcast", "reduce", "all_reduce", "gather", "all_gather",
                           "scatter", "reduce_scatter"], value="all_reduce", description="collective")
ranks = W.IntSlider(value=N, min=1, max=4, description="ranks")
size = W.IntSlider(value=3, min=1, max=6, description="elements")
root = W.IntSlider(value=0, min=0, max=N - 1, description="root")
panel = W.Output()


def redraw(change=None):
    root.max = ranks.value - 1
    fig = show(pick.value, ranks.value, size.value, min(root.value, ranks.value - 1))
    show_in(panel, fig)


for w in (pick, ranks, size, root):
    w.observe(redraw, names="value")
redraw()
display(W.VBox([W.HBox([pick, ranks]), W.HBox([size, root]), panel]))

# %% [markdown]
# ## What each one costs
#
# A collective's time on a real link follows `latency + bytes × bus factor / bandwidth`, with
# the bus factors nccl-tests uses: `2(n-1)/n` for all-reduce (it is a reduce-scatter plus an
# all-gather), `(n-1)/n` for all-gather and reduce-scatter (counted on the full buffer), `1` for
# broadcast and reduce. The all-reduce moves about twice what an all-gather does. Below, the
# modelled times of a 64 MiB buffer on a DGX-H100's NVLink (900 GB/s, about 2 µs latency;
# these are the hardware's numbers, not the CPU-calibrated simulation of lesson 3).

# %%
p = link.PRESETS["dgx-h100"]
size_bytes = 64 << 20
names = ["broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter"]
fig = go.Figure()
for n in (2, 4, 8):
    times = [(p.latency_us * 1e-6 + size_bytes * link.bus_factor(c, n) / (p.bandwidth_GBps * 1e9))
             * 1e6 for c in names]
    fig.add_trace(go.Bar(x=names, y=times, name=f"{n} ranks"))
fig.update_layout(title="modelled time of a 64 MiB collective, DGX-H100 NVLink", yaxis_title="µs",
                  barmode="group", height=360)
fig

# %% [markdown]
# ## Building them from messages
#
# Every collective above can be rebuilt from *point-to-point* messages: one rank sends a buffer,
# one rank receives it into a buffer of the same size. `torch.distributed` has a blocking pair
# (`send`, `recv`) and a non-blocking one (`isend`, `irecv`, each returning a handle to wait on).
# A blocking send may wait for its receiver, so when every rank must send *and* receive in the
# same step, start the messages without blocking and wait for them afterwards; otherwise two
# ranks that both send first can wait for each other forever. The lab rebuilds each collective
# in one of three shapes.
#
# ### Naive: everyone talks to the root
#
# The root of a broadcast or a scatter sends to each of the `n-1` others in turn; the root of a
# reduce or a gather receives from each of them. `n-1` messages, and every one of them starts
# or ends at the root, so the root's link carries all the traffic and the run takes `n-1`
# rounds. A reduce combines each incoming buffer into the root's own as it arrives (sum, max or
# min): the incoming buffer needs a place of its own first, since receiving overwrites.
#
# ### Trees: ⌈log2 n⌉ rounds
#
# A rank that already holds the data can forward it. Number the ranks by their distance from
# the root, the *position* `v = (rank − root) mod n`, so that the root is position 0 whatever
# its rank. In a **binomial-tree broadcast** the number of holders doubles every round: in the
# first round the root sends to one rank, in the second both holders send, then four, and the
# distance between sender and receiver doubles with them (1, 2, 4, ...). Still `n-1` messages
# in all, but spread over many senders: `⌈log2 n⌉` rounds, and the root sends only
# `⌈log2 n⌉` times. No rank needs a table of the tree: a position can work out its part in
# each round from its own number and the round's distance alone.
#
# The **binomial-tree reduce** is the same tree run backwards: partial results flow *towards*
# the root, smallest distance first, and a rank that has handed its partial result on has
# nothing left to do. A non-root rank accumulates into a buffer of its own, so that, as with
# the built-in reduce, only the root's tensor changes.
#
# **Think it through.** Draw both trees for six ranks, one row per round. In the broadcast's
# round of distance `d`, which positions send, which receive, and from whom? In the reduce's
# round of distance `d`, which positions send their partial result away, which receive one,
# and what happens to a receiver whose partner would be position 6 or beyond? (A position
# that does not exist simply sends nothing.)
#
# **All-reduce** is then a reduce to one rank followed by a broadcast from it: `2⌈log2 n⌉`
# rounds, few latencies, but every message carries the whole buffer. Lesson 2 builds the
# all-reduce that moves far fewer bytes.
#
# ### Direct exchange: all-gather and reduce-scatter
#
# In an all-gather every rank owns one chunk of the output; in a reduce-scatter every rank
# wants one chunk of the reduced input. Both are one round in which every pair of ranks trades
# one chunk each way, and each rank receives the `n-1` chunks it lacks. Started all at once and
# waited for together, the `2(n-1)` messages of a rank are in flight together, so no two
# receives may share a destination, and nothing may be combined before it has arrived.
#
# The chunks are `torch.tensor_split`'s: a flat buffer of `K` elements in `n` chunks, the first
# `K mod n` of them one element longer (`K = 10`, `n = 4`: 3, 3, 2, 2). The built-ins want `K`
# divisible by `n`; the builds of the lab do not.
#
# **Think it through.** In the all-gather, what does rank `r` send to each peer, and where in
# the output does each incoming chunk belong? In the reduce-scatter, which chunk of its input
# does rank `r` send to peer `p`, and where can the `n-1` incoming chunks wait until they are
# all in?
#
# ### The dissemination barrier
#
# A barrier moves no data, only news: "I have arrived". Sending it to everyone would take
# `n(n-1)` messages. The **dissemination barrier** needs `⌈log2 n⌉` rounds of one message per
# rank, sent and heard at distances 1, 2, 4, ... around the ring of ranks (mod `n`). What a
# rank hears in a round carries everything its sender had heard before, so after the round of
# distance `d` a rank knows that `2d − 1` ranks (itself included) have arrived; once `2d ≥ n`
# it knows about every rank and may leave. Every rank sends and receives in every round, so
# the deadlock rule above applies.
#
# **Think it through.** If every rank tells the rank `d` after it, whom must it hear from for
# the news to add up to "the `2d − 1` ranks before me (and I) have arrived"?
#
# ### What each build costs
#
# With `S` the bytes of the buffer and `L = ⌈log2 n⌉`:
#
# | build | who sends what | rounds | busiest rank moves |
# |---|---|---|---|
# | broadcast (naive) | root → each other rank, `S` bytes | `n − 1` | root sends `(n−1) S` |
# | tree broadcast | binomial tree, the holders double per round | `L` | root sends `L S` |
# | reduce (naive) | each other rank → root, `S` bytes | `n − 1` | root receives `(n−1) S` |
# | tree reduce | binomial tree, partial results towards the root | `L` | root receives `L S` |
# | all-reduce | tree reduce, then tree broadcast | `2L` | `2L S` |
# | gather / scatter | root ↔ each other rank, one chunk | `n − 1` | root `(n−1)/n S` |
# | all-gather | every rank → every other, its chunk | `n − 1` messages, all in flight | `(n−1)/n S` out, the same in |
# | reduce-scatter | every rank → rank `p`, chunk `p` | `n − 1` messages, all in flight | `(n−1)/n S` out, the same in |
# | barrier | dissemination, to rank `r + 2^k` | `L` | `L` one-element messages |
#
# Both trees send `n − 1` messages in all, like the naive builds: they win by spreading the
# sends over many senders. `workbook run collectives` prints, after the checks, what each of
# your builds sent and how long it took next to the built-in; lesson 2 turns such times into
# nccl-tests' rates (algbw, and busbw = algbw × the bus factor above), comparable across `n`.

# %% [markdown]
# ## Exercise: build them from point-to-point messages
#
# Open `labs/collectives.py`. Every collective above can be built from `dist.send`/`dist.recv`
# (or `isend`/`irecv`): a naive broadcast where the root sends `n-1` times, a binomial tree
# that needs only `⌈log2 n⌉` rounds, reduce, all-reduce, gather, all-gather, scatter,
# reduce-scatter and a barrier, each as the section above describes it. Each task's docstring
# is its spec (what it must do, which messages it may send, where this lesson explains it);
# when you are stuck, `workbook hint collectives N` shows the next hint for task `N` of the
# lab's task list, one rung at a time. Replace each `raise NotImplementedError`, then
# self-check it (the first cell below, or `workbook run collectives --nproc 4`) and grade it
# (the second, or `workbook grade --lab collectives`).
#
# The self-check runs the grader's own checks and prints one verdict per check: `TODO` for a
# part not written yet, `FAIL` with the rank, the case and expected vs got for a wrong one, and
# for a hang (no rank making progress for 60 s), the last call each rank made, yours or the check's. Its return value is the exit
# status `workbook run` would give: 0 all passed, 1 something failed or is not implemented, 2 a
# hang.

# %%
from workbook.lessons import self_check

self_check("collectives", nproc=4)

# %%
check_your_work("collectives")
