# Generated from solutions/capstone.py by `workbook assign` (level: standard): this is your file to edit.
# Replace each `raise NotImplementedError` with your code; check it with `workbook run capstone`
# (or `workbook watch capstone`). Stuck on task N? `workbook hint capstone N`, one hint at a time.
#
# Your tasks (24 pts in all):
#    1. mesh_ranks (2.75 pts): The rank lists of an inner x dp mesh of all the ranks: a pair, the
#       inner groups, then the DP groups, each a list of lists of ranks.
#    2. dp_shard (2.5 pts): This DP rank's rows of a global batch `[B, ...]`: `[B / dp_size, ...]`.
#    3. lr_at (1 pt): The learning rate of a step (counted from 0) of the setup's run.
#    4. global_grad_norm (1.5 pts): The 2-norm of the whole model's gradient, a 0-d tensor: the
#       number one device holding the whole model would compute, the same on every rank.
#    5. clip_gradients (1.5 pts): Scale every gradient by min(1, max_norm / (norm + eps)), the norm
#       being the whole model's (the function above) and eps the constant at the top of this file,
#       as torch's clip_grad_norm_ does on one device; returns the norm before clipping.
#    6. DPGradientSync.__init__, .start, .grad_ready and .finish (4.5 pts): The gradients of
#       `params` averaged over the DP group, bucket by bucket, during the backward pass (PyTorch
#       DDP, Li et al.
#    7. stage_blocks (1.75 pts): The blocks (indices `0 ..
#    8. TPxDPTrainer.__init__ and .step (2.75 pts): One TP x DP rank: the given sequence-parallel
#       model built around your tp_overlap block (the pieces' TP block) inside each DP replica,
#       your DP sync across the replicas, clipping, the schedule and Adam.
#    9. PPxDPTrainer.__init__ and .step (2.75 pts): One PP x DP rank: your pp_overlap overlapped
#       executor (the pieces' executor) running your 1F1B order (the pieces' schedule) on this
#       stage, the stage's blocks from your split above, your DP sync of the stage's parameters
#       across the replicas, clipping over the PP group, the schedule and Adam.
#   10. predict_traffic (3 pts): Predict, before you run it, the bytes one rank sends in each of
#       its groups in one training step: a dict from the group's name, "TP" and "DP" (kind tp) or
#       "PP" and "DP" (kind pp), to a number of bytes.
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
    raise NotImplementedError("not implemented yet: capstone.mesh_ranks")


# --------------------------------------------------------------------------- 2. the DP shard
def dp_shard(batch: torch.Tensor, dp_rank: int, dp_size: int) -> torch.Tensor:
    """This DP rank's rows of a global batch ``[B, ...]``: ``[B / dp_size, ...]``.

    Lesson 14, section 2 ("Real text, one shard per replica"). Contract: deterministic; the
    shards of ranks ``0 .. dp_size-1`` are disjoint, equal in size, and together, in rank
    order, the whole batch. ``B`` not divisible by ``dp_size``: a one-line ``ValueError``
    naming the rule."""
    raise NotImplementedError("not implemented yet: capstone.dp_shard")


# --------------------------------------------------------------------------- 3. the schedule
def lr_at(step: int, setup: TrainSetup) -> float:
    """The learning rate of a step (counted from 0) of the setup's run.

    Lesson 14, section 3 ("Clipping and the schedule"). Contract: a linear warm-up over the
    setup's warm-up steps, reaching its peak rate on the last of them (the first step gets the
    peak over the number of warm-up steps); then a cosine decay from the peak, on the first step
    after the warm-up, to the setup's floor rate on the step after the run's last, held there
    after. The single-device run uses the same schedule."""
    raise NotImplementedError("not implemented yet: capstone.lr_at")


# --------------------------------------------------------------------------- 4. clipping
def global_grad_norm(params: list, mesh: Mesh) -> torch.Tensor:
    """The 2-norm of the whole model's gradient, a 0-d tensor: the number one device holding
    the whole model would compute, the same on every rank.

    Lesson 14, section 3 ("Clipping and the schedule"). ``params``: this rank's parameters, their
    gradients already averaged over the DP group and, for those tagged ``sequence_parallel``,
    summed over the inner group. Contract: exact (fp64: to rounding) on a TP mesh and on a PP
    mesh; one collective, on a group you name (this runs outside any ``as_world``)."""
    raise NotImplementedError("not implemented yet: capstone.global_grad_norm")


def clip_gradients(params: list, mesh: Mesh, max_norm: float) -> torch.Tensor:
    """Scale every gradient by min(1, max_norm / (norm + eps)), the norm being the whole
    model's (the function above) and eps the constant at the top of this file, as torch's
    clip_grad_norm_ does on one device; returns the norm before clipping. Lesson 14,
    section 3."""
    raise NotImplementedError("not implemented yet: capstone.clip_gradients")


# --------------------------------------------------------------------------- 5. DP, bucketed
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
        raise NotImplementedError("not implemented yet: capstone.DPGradientSync.__init__")

    def start(self) -> None:
        """Before each step: no bucket sent, every count reset."""
        raise NotImplementedError("not implemented yet: capstone.DPGradientSync.start")

    def grad_ready(self, k: int) -> None:
        """One more gradient of bucket ``k`` is accumulated: send every bucket now complete
        whose turn it is."""
        raise NotImplementedError("not implemented yet: capstone.DPGradientSync.grad_ready")

    def finish(self) -> None:
        """After backward: every bucket averaged into its parameters' gradients."""
        raise NotImplementedError("not implemented yet: capstone.DPGradientSync.finish")


# --------------------------------------------------------------------------- 6. the stages
def stage_blocks(n_layers: int, pp: int, stage: int) -> list[int]:
    """The blocks (indices ``0 .. n_layers-1``) pipeline stage ``stage`` of ``pp`` holds.

    Lesson 14, section 5 ("Stages, and where they cut"). Contract: consecutive blocks, the
    same count on every stage, stage 0 the first. ``n_layers`` not divisible by ``pp``: a
    one-line ``ValueError`` naming the rule."""
    raise NotImplementedError("not implemented yet: capstone.stage_blocks")


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
        raise NotImplementedError("not implemented yet: capstone.TPxDPTrainer.__init__")

    def step(self, tokens: torch.Tensor, targets: torch.Tensor, step: int) -> float:
        raise NotImplementedError("not implemented yet: capstone.TPxDPTrainer.step")


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
        raise NotImplementedError("not implemented yet: capstone.PPxDPTrainer.__init__")

    def step(self, tokens: torch.Tensor, targets: torch.Tensor, step: int) -> float:
        raise NotImplementedError("not implemented yet: capstone.PPxDPTrainer.step")


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
    raise NotImplementedError("not implemented yet: capstone.predict_traffic")


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
