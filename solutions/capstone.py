"""Lab `capstone`: your pieces, composed on a 2 x 2 mesh, train a small model on real text
exactly as one device would.

Lesson 14 (``lessons/14_capstone.py``) explains everything this lab asks for. Four ranks form a
mesh of two groups: inside each data-parallel (DP) replica an inner group of two ranks runs
tensor parallelism (TP, sequence-parallel, with your ``tp_overlap`` ring exchange) or pipeline
parallelism (PP, your ``pp_overlap`` 1F1B executor); across the replicas your ``dp_overlap``
buckets average the gradients during the backward pass. The loss of every step must equal the
single-device run's on the same global batch, with the same gradient clipping, learning-rate
schedule and Adam. You build, in order:

1. ``mesh_ranks``: which ranks form the inner groups and the DP groups;
2. ``dp_shard``: this DP rank's rows of the global batch;
3. ``lr_at``: the learning-rate schedule (warm-up, then cosine decay);
4. ``global_grad_norm`` and ``clip_gradients``: the norm of the whole model's gradient, and
   the clipping by it, on a mesh;
5. ``DPGradientSync``: the bucketed gradient average across the DP group, during backward;
6. ``stage_blocks``: which blocks a pipeline stage holds;
7. ``TPxDPTrainer``: one training step of TP x DP;
8. ``PPxDPTrainer``: one training step of PP x DP;
9. ``predict_traffic``: before you run it, the bytes each of your groups moves in a step.

Given pieces: ``workbook/capstone/mesh.py`` (``Mesh``: the groups from your rank lists, and
``as_world``, which runs an earlier lab, written for the world, inside one group),
``capstone_model.py`` (the sequence-parallel model around any block; a pipeline stage holding
the blocks you choose), ``capstone_train.py`` (``TrainSetup``, the reference schedule and the
single-device run), ``pieces.py`` (your earlier answers, or the package's stand-ins where one is
unfinished). Run: ``workbook run capstone``; grade: ``workbook grade --lab capstone``; a hint:
``workbook hint capstone TASK``.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.profiler import record_function

from workbook.capstone.capstone_model import SPLanguageModel, stage_with_blocks
from workbook.capstone.capstone_train import TrainSetup
from workbook.capstone.mesh import Mesh
from workbook.runtime import ranks
from workbook.tensor_parallel import sync_sequence_parallel_grads

CLIP_EPS = 1e-6                   # torch.nn.utils.clip_grad_norm_'s


# --------------------------------------------------------------------------- 1. the mesh
def mesh_ranks(world_size: int, inner: int, dp: int) -> tuple[list[list[int]], list[list[int]]]:
    """The rank lists of an inner x dp mesh of all the ranks: a pair, the inner groups, then the
    DP groups, each a list of lists of ranks.

    Lesson 14, section 1 ("A mesh of groups"). Contract: ``dp`` inner groups (TP or PP) of
    ``inner`` consecutive ranks, in order (``[0, 1], [2, 3]``); ``inner`` DP groups, group i
    holding the ranks at inner position i of every replica, in order (``[0, 2], [1, 3]``).
    Sizes that are not positive integers, or that do not multiply to ``world_size``: a
    one-line ``ValueError`` naming the rule."""
    ### BEGIN SOLUTION
    ### hint 1: the inner group is innermost, as Megatron-LM lays it out, so that TP's traffic stays on the fastest links; a rank is dp_rank * inner + inner_rank (lesson 14, section 1, "A mesh of groups").
    ### hint 2: check the sizes first (positive, and inner x dp = world_size, else ValueError); replica d's inner group is the inner ranks starting at d x inner; DP group i takes every inner-th rank starting at i.
    ### hint 3: inner_groups = [list(range(d * inner, (d + 1) * inner)) for d in range(dp)]; dp_groups = [list(range(i, world_size, inner)) for i in range(inner)]
    for name, value in (("world_size", world_size), ("inner", inner), ("dp", dp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    if inner * dp != world_size:
        raise ValueError(f"inner x dp = {inner} x {dp} = {inner * dp} ranks, but the world has "
                         f"{world_size}: the mesh's sizes must multiply to the world size")
    inner_groups = [list(range(d * inner, (d + 1) * inner)) for d in range(dp)]
    dp_groups = [list(range(i, world_size, inner)) for i in range(inner)]
    return inner_groups, dp_groups
    ### END SOLUTION


# --------------------------------------------------------------------------- 2. the DP shard
def dp_shard(batch: torch.Tensor, dp_rank: int, dp_size: int) -> torch.Tensor:
    """This DP rank's rows of a global batch ``[B, ...]``: ``[B / dp_size, ...]``.

    Lesson 14, section 2 ("Real text, one shard per replica"). Contract: deterministic; the
    shards of ranks ``0 .. dp_size-1`` are disjoint, equal in size, and together, in rank
    order, the whole batch. ``B`` not divisible by ``dp_size``: a one-line ``ValueError``
    naming the rule."""
    ### BEGIN SOLUTION
    ### hint 1: every rank builds the same global batch; the shard decides which rows this replica trains on, and the replicas together must see each row once (lesson 14, section 2, "Real text, one shard per replica").
    ### hint 2: refuse a batch whose rows do not split evenly; rank r takes the r-th of dp_size equal blocks of consecutive rows.
    ### hint 3: b = batch.shape[0] // dp_size; return batch[dp_rank * b:(dp_rank + 1) * b]
    rows = batch.shape[0]
    if rows % dp_size:
        raise ValueError(f"a batch of {rows} rows does not split into {dp_size} equal DP shards: "
                         f"use a batch that is a multiple of {dp_size}")
    b = rows // dp_size
    return batch[dp_rank * b:(dp_rank + 1) * b]                        # [B/dp, ...]
    ### END SOLUTION


# --------------------------------------------------------------------------- 3. the schedule
def lr_at(step: int, setup: TrainSetup) -> float:
    """The learning rate of a step (counted from 0) of the setup's run.

    Lesson 14, section 3 ("Clipping and the schedule"). Contract: a linear warm-up over the
    setup's warm-up steps, reaching its peak rate on the last of them (the first step gets the
    peak over the number of warm-up steps); then a cosine decay from the peak, on the first step
    after the warm-up, to the setup's floor rate on the step after the run's last, held there
    after. The single-device run uses the same schedule."""
    ### BEGIN SOLUTION
    ### hint 1: two pieces: a straight line up, then half a cosine period down (lesson 14, section 3, "Clipping and the schedule").
    ### hint 2: during the warm-up scale max_lr by (step + 1) / warmup; after it, take the fraction t of the decay done (from 0 at step warmup to 1 at step steps, never above 1) and interpolate from max_lr to min_lr with (1 + cos(pi t)) / 2.
    ### hint 3: t = min(1, (step - warmup) / max(1, steps - warmup)); lr = min_lr + (max_lr - min_lr) * (1 + math.cos(math.pi * t)) / 2
    if step < setup.warmup:
        return setup.max_lr * (step + 1) / setup.warmup
    t = min(1.0, (step - setup.warmup) / max(1, setup.steps - setup.warmup))
    return setup.min_lr + (setup.max_lr - setup.min_lr) * (1 + math.cos(math.pi * t)) / 2
    ### END SOLUTION


# --------------------------------------------------------------------------- 4. clipping
def global_grad_norm(params: list, mesh: Mesh) -> torch.Tensor:
    """The 2-norm of the whole model's gradient, a 0-d tensor: the number one device holding
    the whole model would compute, the same on every rank.

    Lesson 14, section 3 ("Clipping and the schedule"). ``params``: this rank's parameters, their
    gradients already averaged over the DP group and, for those tagged ``sequence_parallel``,
    summed over the inner group. Contract: exact (fp64: to rounding) on a TP mesh and on a PP
    mesh; one collective, on a group you name (this runs outside any ``as_world``)."""
    ### BEGIN SOLUTION
    ### hint 1: the norm squared is a sum over every element of the whole model; each rank holds part of it (lesson 14, section 3, "Clipping and the schedule").
    ### hint 2: add up this rank's squares in two sums, the shards' and the replicated (tagged) ones'; sum the shards' over the inner group (name the group: this runs outside any as_world); add the replicated once; take the square root.
    ### hint 3: own = sum((p.grad ** 2).sum() for untagged p); dist.all_reduce(own, group=mesh.inner_group); return (own + sum of the tagged squares).sqrt()
    grads = [p for p in params if p.grad is not None]
    zero = torch.zeros((), dtype=grads[0].grad.dtype, device=grads[0].grad.device)
    shards = sum(((p.grad ** 2).sum() for p in grads if not getattr(p, "sequence_parallel", False)),
                 zero.clone())
    replicated = sum(((p.grad ** 2).sum() for p in grads if getattr(p, "sequence_parallel", False)),
                     zero.clone())
    dist.all_reduce(shards, group=mesh.inner_group)
    return (shards + replicated).sqrt()
    ### END SOLUTION


def clip_gradients(params: list, mesh: Mesh, max_norm: float) -> torch.Tensor:
    """Scale every gradient by min(1, max_norm / (norm + eps)), the norm being the whole
    model's (the function above) and eps the constant at the top of this file, as torch's
    clip_grad_norm_ does on one device; returns the norm before clipping. Lesson 14,
    section 3."""
    ### BEGIN SOLUTION
    ### hint 1: every rank must scale by the same factor, or the replicas drift apart (lesson 14, section 3, "Clipping and the schedule").
    ### hint 2: the global norm; the factor max_norm / (norm + CLIP_EPS), at most 1; multiply every gradient by it in place.
    ### hint 3: norm = global_grad_norm(params, mesh); scale = (max_norm / (norm + CLIP_EPS)).clamp(max=1.0); for p with a grad: p.grad.mul_(scale); return norm
    norm = global_grad_norm(params, mesh)
    scale = (max_norm / (norm + CLIP_EPS)).clamp(max=1.0)
    for p in params:
        if p.grad is not None:
            p.grad.mul_(scale)
    return norm
    ### END SOLUTION


# --------------------------------------------------------------------------- 5. DP, bucketed
### BEGIN CHALLENGE: DPGradientSync, the whole class (bucketed DP on a mesh: hooks, buckets, finish)
class DPGradientSync:
    """The gradients of ``params`` averaged over the DP group, bucket by bucket, during the
    backward pass (PyTorch DDP, Li et al. 2020, arXiv 2006.15704; your lab ``dp_overlap``).

    Lesson 14, section 4 ("Every collective names its group"). Built from this rank's
    parameters in order of use, the mesh, your ``make_buckets`` (``pieces["make_buckets"]``),
    the bucket cap, and how many times each gradient is accumulated in one step
    (``accumulations``: 1, or the micro-batches of a pipeline). Contract:

    * ``start()`` before each step's backward: no bucket sent, every count reset;
    * during backward: once every parameter of a bucket has had its ``accumulations``-th
      gradient accumulated, the bucket's gradients, divided by the DP size, go out in one
      asynchronous all-reduce on ``mesh.dp_group`` (named: the backward runs inside the
      inner group seen as the world), buckets strictly in order;
    * ``finish()`` after backward: raise (naming the bucket) if one never went out; wait for
      every bucket; each parameter's gradient is then the DP average.

    Collectives: one all-reduce per bucket per step, on the DP group, nothing else."""

    def __init__(self, params: list, mesh: Mesh, make_buckets, bucket_bytes: int,
                 accumulations: int = 1):
        self.group, self.n, self.accumulations = mesh.dp_group, mesh.dp, accumulations
        self.buckets = make_buckets(list(params), bucket_bytes)
        ### BEGIN SOLUTION
        ### hint 1: your BucketedDP registered one hook per parameter that fires once its gradient is accumulated (lesson 14, section 4, "Every collective names its group"; lesson 9, "Building the buckets").
        ### hint 2: for each bucket by index and each of its parameters, register the post-accumulate hook that calls grad_ready with that index (bind it now); then reset with start().
        ### hint 3: p.register_post_accumulate_grad_hook(lambda _p, k=k: self.grad_ready(k)); self.start()
        for k, bucket in enumerate(self.buckets):
            for p in bucket:
                p.register_post_accumulate_grad_hook(lambda _p, k=k: self.grad_ready(k))
        self.start()
        ### END SOLUTION

    def start(self) -> None:
        """Before each step: no bucket sent, every count reset."""
        ### BEGIN SOLUTION
        ### hint 1: each bucket waits for len(bucket) x accumulations gradients (lesson 14, section 4).
        ### hint 2: reset the missing counts, the next bucket due and the list of buckets in flight.
        ### hint 3: self.missing = [len(b) * self.accumulations for b in self.buckets]; self.next = 0; self.in_flight = []
        self.missing = [len(b) * self.accumulations for b in self.buckets]
        self.next, self.in_flight = 0, []
        ### END SOLUTION

    def grad_ready(self, k: int) -> None:
        """One more gradient of bucket ``k`` is accumulated: send every bucket now complete
        whose turn it is."""
        ### BEGIN SOLUTION
        ### hint 1: as your BucketedDP.grad_ready, but the all-reduce names the DP group: inside the TP group's as_world a call without group= would average over the TP ranks (lesson 14, section 4, "Every collective names its group").
        ### hint 2: count the gradient off; while the next bucket due is complete, flatten its gradients into one buffer divided by the DP size, start its all-reduce on the DP group without waiting, keep (bucket, buffer, work), move on.
        ### hint 3: flat = torch.cat([p.grad.reshape(-1) for p in bucket]) / self.n; work = dist.all_reduce(flat, group=self.group, async_op=True)
        self.missing[k] -= 1
        while self.next < len(self.buckets) and self.missing[self.next] == 0:
            bucket = self.buckets[self.next]
            flat = torch.cat([p.grad.reshape(-1) for p in bucket]) / self.n
            self.in_flight.append((bucket, flat, dist.all_reduce(flat, group=self.group,
                                                                 async_op=True)))
            self.next += 1
        ### END SOLUTION

    def finish(self) -> None:
        """After backward: every bucket averaged into its parameters' gradients."""
        ### BEGIN SOLUTION
        ### hint 1: a buffer is complete only once its work is waited on; then its pieces go back into the gradients (lesson 14, section 4).
        ### hint 2: raise RuntimeError naming the first bucket that never went out; for each bucket in flight, wait, then copy each piece of the buffer into its parameter's gradient.
        ### hint 3: for bucket, flat, work in self.in_flight: work.wait(); for p, piece in zip(bucket, flat.split([p.numel() for p in bucket])): p.grad.copy_(piece.view_as(p.grad))
        if self.next != len(self.buckets):
            raise RuntimeError(f"DP bucket {self.next} of {len(self.buckets)} never got all its "
                               f"gradients ({self.missing[self.next]} missing)")
        for bucket, flat, work in self.in_flight:
            work.wait()
            for p, piece in zip(bucket, flat.split([p.numel() for p in bucket])):
                p.grad.copy_(piece.view_as(p.grad))
        self.in_flight = []
        ### END SOLUTION
### END CHALLENGE


# --------------------------------------------------------------------------- 6. the stages
def stage_blocks(n_layers: int, pp: int, stage: int) -> list[int]:
    """The blocks (indices ``0 .. n_layers-1``) pipeline stage ``stage`` of ``pp`` holds.

    Lesson 14, section 5 ("Stages, and where they cut"). Contract: consecutive blocks, the
    same count on every stage, stage 0 the first. ``n_layers`` not divisible by ``pp``: a
    one-line ``ValueError`` naming the rule."""
    ### BEGIN SOLUTION
    ### hint 1: equal stages keep the pipeline balanced: the slowest stage sets the pace (lesson 14, section 5, "Stages, and where they cut").
    ### hint 2: refuse a layer count that does not split; stage s takes the s-th run of n_layers / pp consecutive blocks.
    ### hint 3: k = n_layers // pp; return list(range(stage * k, (stage + 1) * k))
    if n_layers % pp:
        raise ValueError(f"n_layers={n_layers} layers do not split into pp={pp} stages of equal "
                         f"size: use a multiple of {pp} layers")
    k = n_layers // pp
    return list(range(stage * k, (stage + 1) * k))
    ### END SOLUTION


def replica_mean(loss: torch.Tensor, mesh: Mesh) -> torch.Tensor:
    """The global batch's mean loss from this replica's (equal shards: the mean of the means)."""
    loss = loss.detach().clone()
    dist.all_reduce(loss, group=mesh.dp_group)
    return loss / mesh.dp


# --------------------------------------------------------------------------- 7. TP x DP
class TPxDPTrainer:
    """One TP x DP rank: the given sequence-parallel model built around your tp_overlap block
    (the pieces' TP block) inside each DP replica, your DP sync across the replicas, clipping,
    the schedule and Adam.

    Lesson 14, section 6 ("TP x DP: one step"). Built from a training setup, the mesh (of kind
    tp) and the pieces: the model is built inside the TP group seen as the world, Adam from the
    setup's peak rate, betas and eps. The step: the global batch (the same on every rank) and
    the step number in; this replica's DP shard through forward and backward inside the TP
    group (the phases forward, backward and optimizer as profiler ranges); then the DP
    average, the sequence-parallel gradients summed over the TP group (the given sync, after
    the DP average: it rewrites the gradients), the clipping by the setup's maximum norm (the
    norm before clipping kept on the trainer), the step's learning rate, Adam. Returns the
    global batch's mean loss (a float), equal on every rank, equal to one device's."""

    def __init__(self, setup: TrainSetup, mesh: Mesh, pieces: dict):
        self.setup, self.mesh, self.norm = setup, mesh, None
        ### BEGIN SOLUTION
        ### hint 1: the model's collectives are the TP group's, so it is built and run inside that group as the world; the DP sync and the clipping name their groups (lesson 14, section 6, "TP x DP: one step").
        ### hint 2: build SPLanguageModel(setup.cfg, pieces["tp_block"].value) inside as_world of the inner group; its parameters in order of use; a DPGradientSync of them with pieces["make_buckets"].value and setup.bucket_bytes; Adam.
        ### hint 3: with mesh.as_world(mesh.inner_group): self.model = SPLanguageModel(...); self.params = list(self.model.parameters()); self.sync = DPGradientSync(self.params, mesh, ..., setup.bucket_bytes); self.optimizer = torch.optim.Adam(self.params, lr=setup.max_lr, betas=setup.betas, eps=setup.eps)
        with mesh.as_world(mesh.inner_group):
            self.model = SPLanguageModel(setup.cfg, pieces["tp_block"].value, ranks.device())
        self.params = list(self.model.parameters())
        self.sync = DPGradientSync(self.params, mesh, pieces["make_buckets"].value,
                                   setup.bucket_bytes)
        self.optimizer = torch.optim.Adam(self.params, lr=setup.max_lr, betas=setup.betas,
                                          eps=setup.eps)
        ### END SOLUTION

    def step(self, tokens: torch.Tensor, targets: torch.Tensor, step: int) -> float:
        ### BEGIN SOLUTION
        ### hint 1: one device's step, each piece on its group: the shard, forward and backward on the TP group (the DP hooks fire inside), the DP average, the SP sums, the clip, the schedule, Adam (lesson 14, section 6, "TP x DP: one step").
        ### hint 2: shard both tensors by the mesh's DP coordinates; zero the gradients and start the sync; forward and backward inside as_world(inner_group); finish the sync; sync_sequence_parallel_grads inside as_world; clip; set each param group's lr to lr_at(step, setup); Adam; the DP mean of the loss.
        ### hint 3: tokens = dp_shard(tokens, mesh.dp_rank, mesh.dp) (and targets); ... self.norm = clip_gradients(self.params, mesh, setup.max_norm); return float(replica_mean(loss, mesh))
        mesh = self.mesh
        tokens = dp_shard(tokens, mesh.dp_rank, mesh.dp).to(ranks.device())       # [B/dp, S]
        targets = dp_shard(targets, mesh.dp_rank, mesh.dp).to(ranks.device())
        self.optimizer.zero_grad(set_to_none=True)
        self.sync.start()
        with mesh.as_world(mesh.inner_group):
            with record_function("forward"):
                loss = self.model(tokens, targets, step)
            with record_function("backward"):
                loss.backward()
        with record_function("optimizer"):
            self.sync.finish()
            with mesh.as_world(mesh.inner_group):
                sync_sequence_parallel_grads(self.model)
            self.norm = clip_gradients(self.params, mesh, self.setup.max_norm)
            for group in self.optimizer.param_groups:
                group["lr"] = lr_at(step, self.setup)
            self.optimizer.step()
        return float(replica_mean(loss, mesh))
        ### END SOLUTION


# --------------------------------------------------------------------------- 8. PP x DP
class PPxDPTrainer:
    """One PP x DP rank: your pp_overlap overlapped executor (the pieces' executor) running your
    1F1B order (the pieces' schedule) on this stage, the stage's blocks from your split
    above, your DP sync of the stage's parameters across the replicas, clipping over the PP
    group, the schedule and Adam.

    Lesson 14, section 7 ("PP x DP: one step"). Built from a training setup (its micro-batches
    per replica), the mesh (of kind pp; the stage is this rank's inner position) and the
    pieces: the executor is made inside the PP group seen as the world (its ranks and peers
    are then stage numbers), its stage module replaced by the given stage builder holding
    your split's blocks. The step: as the TP x DP trainer's, the executor's step running the
    stage's 1F1B actions inside the PP group (each gradient is accumulated once per
    micro-batch); the loss, which only the last stage computes, summed over the PP group, then
    averaged over the DP group: every rank returns the global batch's mean loss."""

    def __init__(self, setup: TrainSetup, mesh: Mesh, pieces: dict):
        self.setup, self.mesh, self.norm = setup, mesh, None
        ### BEGIN SOLUTION
        ### hint 1: the executor's p2p peers are stage numbers, so it lives in the PP group as the world; the stage is cut by your rule, not the executor's (lesson 14, section 7, "PP x DP: one step").
        ### hint 2: inside as_world(inner_group) make the executor (setup.cfg, setup.micro_batches, the device); replace its stage by stage_with_blocks(cfg, stage_blocks(L, p, stage), stage, p, device); the stage's 1F1B actions; the DP sync of the stage's parameters, accumulations = micro_batches; Adam.
        ### hint 3: self.executor.stage = stage_with_blocks(...); self.actions = pieces["schedule"].value(p, m, stage); self.sync = DPGradientSync(self.params, mesh, pieces["make_buckets"].value, setup.bucket_bytes, accumulations=m)
        cfg, p, stage, m = setup.cfg, mesh.inner, mesh.inner_rank, setup.micro_batches
        with mesh.as_world(mesh.inner_group):
            self.executor = pieces["executor"].value(cfg, m, ranks.device())
        self.executor.stage = stage_with_blocks(cfg, stage_blocks(cfg.n_layers, p, stage), stage,
                                                p, ranks.device())
        self.actions = pieces["schedule"].value(p, m, stage)
        self.params = list(self.executor.stage.parameters())
        self.sync = DPGradientSync(self.params, mesh, pieces["make_buckets"].value,
                                   setup.bucket_bytes, accumulations=m)
        self.optimizer = torch.optim.Adam(self.params, lr=setup.max_lr, betas=setup.betas,
                                          eps=setup.eps)
        ### END SOLUTION

    def step(self, tokens: torch.Tensor, targets: torch.Tensor, step: int) -> float:
        ### BEGIN SOLUTION
        ### hint 1: as the TP x DP step, the executor in place of forward and backward; only the last stage holds a loss (lesson 14, section 7, "PP x DP: one step").
        ### hint 2: shard; start the sync; the executor's step with the actions inside as_world(inner_group); finish the sync; clip; lr; Adam; the loss tensor (zero where the stage has none) summed over the PP group, then the DP mean.
        ### hint 3: loss = self.executor.step(tokens, targets, self.actions); ... total = loss.detach() if loss is not None else torch.zeros((), dtype=...); dist.all_reduce(total, group=mesh.inner_group); return float(replica_mean(total, mesh))
        mesh = self.mesh
        tokens = dp_shard(tokens, mesh.dp_rank, mesh.dp).to(ranks.device())       # [B/dp, S]
        targets = dp_shard(targets, mesh.dp_rank, mesh.dp).to(ranks.device())
        self.sync.start()
        with mesh.as_world(mesh.inner_group):
            loss = self.executor.step(tokens, targets, self.actions)
        with record_function("optimizer"):
            self.sync.finish()
            self.norm = clip_gradients(self.params, mesh, self.setup.max_norm)
            for group in self.optimizer.param_groups:
                group["lr"] = lr_at(step, self.setup)
            self.optimizer.step()
        total = loss.detach().clone() if loss is not None else \
            torch.zeros((), dtype=self.setup.cfg.torch_dtype, device=ranks.device())
        dist.all_reduce(total, group=mesh.inner_group)
        return float(replica_mean(total, mesh))
        ### END SOLUTION


# --------------------------------------------------------------------------- 9. prediction
def predict_traffic(kind: str, cfg, batch: int, inner: int, dp: int, micro_batches: int,
                    param_bytes: int, inner_rank: int = 0) -> dict:
    """Predict, before you run it, the bytes one rank sends in each of its groups in one
    training step: a dict from the group's name, "TP" and "DP" (kind tp) or "PP" and "DP"
    (kind pp), to a number of bytes.

    Lesson 14, section 8 ("Predict the traffic, then read it"). The rank is at the given
    position of its inner group (its TP rank, or its stage); the model configuration gives the
    width, the sequence length, the layers and the element type; the batch is the global
    batch's rows; the parameter bytes are this rank's. Count what a rank *sends* on the wire,
    the way a ring moves it (the bus bytes of lesson 3), for the activations and the gradients
    that your own pieces move as the trainers above run them: your ``OverlapBlock`` under
    ``Overlap()`` with the model's embedding and head (TP), your 1F1B executor (PP), your
    buckets (DP). Leave out the scalars and the small all-reduces of the loss and of the
    sequence-parallel norms. The grader compares your figures with the package's model on
    several meshes, and the model with your own trace."""
    ### BEGIN SOLUTION
    ### hint 1: three kinds of traffic, each a count of messages times their size: the TP shards per sublayer, the PP activations per micro-batch, the DP ring all-reduce of the gradients (lesson 14, section 8, "Predict the traffic, then read it"; lesson 3 for bus bytes).
    ### hint 2: item = element size; b = batch / dp. TP: 2 sublayers x 5 collectives per layer, plus 4 at the ends, each sending (n - 1) shards of b x S/n x H; PP: b x S x H per direction the stage sends in (forward unless last, backward unless first); DP: 2 (dp - 1) / dp x param_bytes.
    ### hint 3: tp = (10 * L + 4) * (n - 1) * b * (S // n) * H * item; pp = b * S * H * item * ((stage < p - 1) + (stage > 0)); dp = 2 * (dp - 1) / dp * param_bytes
    item = cfg.torch_dtype.itemsize
    b, S, H = batch // dp, cfg.seq_len, cfg.hidden
    out = {"DP": 2 * (dp - 1) / dp * param_bytes}
    if kind == "tp":
        out["TP"] = float((10 * cfg.n_layers + 4) * (inner - 1) * b * (S // inner) * H * item)
    else:
        directions = (inner_rank < inner - 1) + (inner_rank > 0)
        out["PP"] = float(b * S * H * item * directions)
    return out
    ### END SOLUTION


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
