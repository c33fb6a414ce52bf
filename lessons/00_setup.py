# %% [markdown]
# # Lesson 0 — Ranks, process groups and launchers
#
# Distributed training runs the *same program* in several processes. Each process is a **rank**:
# an integer from 0 to `world_size - 1` that tells the program which share of the work is its
# own. On a GPU cluster there is one rank per GPU; on your laptop, in this course, a rank is a
# CPU process.
#
# The ranks talk through `torch.distributed`. Before any message flows, every rank joins a
# **process group**: it calls `dist.init_process_group(backend, rank, world_size)` and meets the
# others at a *rendezvous* (a small key-value store at `MASTER_ADDR:MASTER_PORT`). The backend
# moves the bytes:
#
# | backend | where | notes |
# |---|---|---|
# | **gloo** | CPU tensors | what this course uses on a laptop, wrapped by a simulated link (lesson 3) |
# | **NCCL** | NVIDIA GPUs, one per rank | NVLink inside a node, InfiniBand/RoCE across nodes |
#
# This lesson: what your machine offers, how `torchrun` starts ranks, and how to run ranks from
# this notebook.

# %%
import os
import subprocess
import sys
import textwrap

import plotly.graph_objects as go
import torch

from workbook.trace import colors
from workbook.lessons import on_ranks, show_in

print("torch", torch.__version__, "| CPU cores:", os.cpu_count(),
      "| CUDA GPUs:", torch.cuda.device_count() if torch.cuda.is_available() else 0)

# %% [markdown]
# ## What can this machine do? `workbook doctor`
#
# The doctor lists the usable backends, the GPUs, and how fast this CPU multiplies matrices
# (that rate calibrates the simulated link of lesson 3). The cell runs the `workbook` command
# in this kernel, which has torch loaded already; `workbook doctor` in a terminal prints the same.

# %%
from workbook.cli import main as workbook       # the `workbook` command: workbook(["doctor"])

threads = torch.get_num_threads()
workbook(["doctor"])
torch.set_num_threads(threads)                  # the doctor measured as one of 2 ranks computes

# %% [markdown]
# ### If you have one GPU
#
# The labs need 2 to 4 ranks, and NCCL wants **one GPU per rank**. On a machine with one GPU,
# `workbook doctor` (above) therefore reports that the ranks run on the CPU over gloo, even though
# a GPU is present. This is on purpose. Every check in the course is proven on CPU ranks, and the
# simulated link of lesson 3 makes their overlap visible. Figures from those runs are labelled
# *simulated*: they show a CPU in slow motion, scaled so that compute and communication keep an
# H100's proportions.
#
# To put the ranks on your GPU, run `export WORKBOOK_BACKEND=cuda` before starting Jupyter, or
# pass `--backend cuda`. The doctor's line `WORKBOOK_BACKEND=cuda: …` shows what you would get:
#
# * **NCCL with the ranks sharing the GPU**, if torch loaded NCCL 2.30 or later (an
#   experimental NCCL setting, `NCCL_MULTI_RANK_GPU_ENABLE=1`, which the workbook sets for the ranks);
# * otherwise **gloo-cuda**: gloo, with each rank's tensors on the GPU and copied through host
#   memory for each collective.
#
# Either way, the numbers (sums, gradients) are real and checked. The times are not a cluster's:
# ranks on one GPU take turns on it, and their "communication" is a copy inside the GPU's memory.
# The benchmarks warn you when this happens ("ranks share each GPU"). On a node with one GPU per
# rank, the ranks use NCCL by default. There the figures are real, labelled with the GPU model,
# and a collective counts as hidden while NCCL's kernels run beside compute kernels on other
# streams.

# %% [markdown]
# ## `torchrun` and its environment variables
#
# On a cluster you start ranks with `torchrun --nproc_per_node=N script.py` (plus `--nnodes`
# and a rendezvous address for several machines). `torchrun` starts N copies of the script and
# hands each one its identity through the environment:
#
# | variable | meaning |
# |---|---|
# | `RANK` | this process's rank in the whole job |
# | `WORLD_SIZE` | how many ranks the job has |
# | `LOCAL_RANK` | the rank within this machine: which GPU to use |
# | `LOCAL_WORLD_SIZE` | ranks on this machine |
# | `MASTER_ADDR`, `MASTER_PORT` | where the rendezvous store listens |
#
# `dist.init_process_group()` with no arguments reads them. Let us really run `torchrun` on a
# tiny script and look at what each rank sees (`--standalone`: one machine, a free port for
# the rendezvous, picked by torchrun).

# %%
import tempfile

script = os.path.join(tempfile.mkdtemp(), "hello_torchrun.py")
with open(script, "w") as f:
    f.write(textwrap.dedent("""
        import os, torch.distributed as dist
        dist.init_process_group("gloo")
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        print(" ".join(f"{k}={os.environ[k]}" for k in keys), flush=True)
        dist.destroy_process_group()
    """))
torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            script]
proc = subprocess.run(torchrun, capture_output=True, text=True, timeout=90)
print(proc.stdout or proc.stderr[-2000:])
os.remove(script)

# %% [markdown]
# ## Ranks from a notebook: `workbook.runtime.launch`
#
# A notebook cannot be started by `torchrun`, so the workbook's launcher starts the ranks
# instead: `workbook.runtime.launch.run(fn, world_size)` spawns the processes, forms the process group,
# calls `fn()` on every rank and returns their results as a list indexed by rank. A function you
# define here travels to the ranks *by value*, so edit it and run again.
# `workbook.lessons.on_ranks(fn, n)` does the same on ranks kept warm between calls, so
# re-running costs milliseconds instead of seconds.
#
# Inside `fn` the usual calls work: `dist.get_rank()`, `dist.get_world_size()`,
# `dist.all_reduce(...)`. A tensor handed to a collective must live on the rank's own device:
# `workbook.runtime.ranks.device()` says which (`cpu` on a CPU rank, `cuda:N` on a GPU rank,
# where NCCL takes no CPU tensor). It is the one way the course asks, so the same function runs
# on a laptop and on a GPU node.

# %%
def hello():
    import torch
    import torch.distributed as dist
    from workbook.runtime.ranks import device
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank)], device=device())
    dist.all_reduce(t)                         # every rank adds its number: 0 + 1 + ... + (n-1)
    return {"rank": rank, "world_size": world, "pid": os.getpid(),
            "backend": dist.get_backend(), "device": str(t.device), "sum_of_ranks": t.item()}


for row in on_ranks(hello, 4):
    print(row)

# %% [markdown]
# On CPU ranks the backend reads `gloo_link`: gloo wrapped by the course's simulated
# interconnect, which adds no delay until you pick a link preset (lesson 3). On GPU ranks it
# reads `nccl` (or the gloo wrapper, with the tensors on the GPU), and the device `cuda:N`.
#
# ## Process groups inside the world
#
# A job often needs collectives among *some* ranks: the tensor-parallel ranks of one layer, the
# data-parallel replicas of one shard. `dist.new_group(ranks)` makes such a subgroup; every
# rank must call it with the same list, in the same order, even ranks that are not members.
# Below, 4 ranks form two "tensor-parallel" pairs {0, 1} and {2, 3} and two "data-parallel"
# pairs {0, 2} and {1, 3}, and each rank sums its rank number within both of its groups.

# %%
def two_ways():
    import torch
    import torch.distributed as dist
    from workbook.runtime.ranks import device
    rank = dist.get_rank()
    tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    tp, dp = tp_groups[rank // 2], dp_groups[rank % 2]
    a, b = (torch.tensor([float(rank)], device=device()) for _ in range(2))
    dist.all_reduce(a, group=tp)
    dist.all_reduce(b, group=dp)
    return {"rank": rank, "tp_group": dist.get_process_group_ranks(tp), "tp_sum": a.item(),
            "dp_group": dist.get_process_group_ranks(dp), "dp_sum": b.item()}


groups = on_ranks(two_ways, 4)
for row in groups:
    print(row)

# %%
fig = go.Figure()
for r in groups:
    fig.add_trace(go.Scatter(x=[r["rank"] % 2], y=[r["rank"] // 2], mode="markers+text",
                             text=[f"rank {r['rank']}"], textposition="top center",
                             marker=dict(size=28, color=colors.COMPUTE), showlegend=False))
for key, name, color in (("tp_group", "tensor-parallel group", colors.COMMUNICATION),
                         ("dp_group", "data-parallel group", colors.LINK)):
    for k, g in enumerate(sorted({tuple(r[key]) for r in groups})):
        fig.add_trace(go.Scatter(x=[m % 2 for m in g], y=[m // 2 for m in g], mode="lines",
                                 line=dict(color=color, width=4), name=name, legendgroup=name,
                                 showlegend=k == 0))
fig.update_layout(title="4 ranks, two ways to pair them", height=360,
                  xaxis=dict(visible=False, range=[-0.5, 1.5]),
                  yaxis=dict(visible=False, range=[1.6, -0.5]))
fig

# %% [markdown]
# ## Try it
#
# Pick a number of ranks: the cell runs `hello` on that many warm ranks. (The first run for a
# new size starts its processes: a few seconds on a laptop.)

# %%
import ipywidgets as W
from IPython.display import display

n_ranks = W.IntSlider(value=4, min=1, max=4, description="ranks")
table = W.Output()


def show(change=None):
    rows = on_ranks(hello, n_ranks.value)
    show_in(table, "\n".join(str(row) for row in rows))   # replaces what the panel shows


n_ranks.observe(show, names="value")
show()
display(W.VBox([n_ranks, table]))

# %% [markdown]
# ## The same code, three ways, and one verdict
#
# Every lab file of the course ends with `workbook.selfcheck.main(__file__)`: its self-check
# runs the grader's own checks (`tests/grading/test_<lab>.py`), so one file runs
#
# * under `torchrun --nproc_per_node=4 labs/collectives.py` (one node or many);
# * as `python labs/collectives.py --nproc 4` or `workbook run collectives --nproc 4`
#   (the launcher starts the ranks), or `workbook.lessons.self_check("collectives")` here;
# * from the autograder, `workbook grade --lab collectives`, with points.
#
# Each prints one verdict per check with the grader's message (which rank, which case,
# expected vs got), and exits 0 when every check passed, 1 when one failed or is not
# implemented yet, 2 for a hang: after 60 s (`--timeout`) each rank's last collective is
# reported instead of waiting forever.
#
# Next: lesson 1, the collective operations themselves.
