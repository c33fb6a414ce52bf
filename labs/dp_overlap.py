# Generated from solutions/dp_overlap.py by `workbook assign`: this is your file to edit.
# Replace each `raise NotImplementedError` with your code, then grade it with
#     workbook grade --lab dp_overlap
#
# Your tasks (30 pts in all):
#   1. NaiveDP.finish_gradient_sync (2.6 pts): Plain DP: after backward, `g <- (1/n) sum_ranks g`
#      for every gradient, one blocking all-reduce each: 2(n-1)/n * Psi bytes per rank on the bus,
#      none of it hidden.
#   2. make_buckets (2 pts): Group `params` (given in order of use) into buckets in *reverse* order
#      of use, the order backward makes their gradients: walk them from the last; a bucket closes
#      when the next parameter would take it past `bucket_bytes` (a parameter larger than that gets
#      its own).
#   3. BucketedDP.__init__, .grad_ready and .finish_gradient_sync (6.6 pts): DP with the all-reduce
#      hidden behind backward: each bucket's gradients live in one flat buffer (`FlatParameters`),
#      averaged in place by one asynchronous all-reduce, started the moment the bucket's last
#      gradient has been accumulated.
#   4. ShardedTrainer.reduce_scatter_grads, .finish_gradient_sync, .optimizer_step, .start_gather
#      and .before_forward (9.2 pts): The distributed optimizer (ZeRO stage 1 or 2).
#   5. Zero3.after_forward, .before_backward and .reduce_scatter_grads (9.6 pts): ZeRO-3: between
#      steps a rank holds only its shards (a copy, `Psi/n`), every flat buffer freed.
"""Lab `dp_overlap`: data parallelism and the distributed optimizer, their traffic hidden.

Lesson 9 (``lessons/09_dp_overlap.py``) explains it. Every rank holds the model and trains on
its rows of the batch; the gradients are averaged over the ranks, so every variant takes exactly
the step one device takes on the whole batch. Four ways, each hiding more:

1. ``NaiveDP``: all-reduce every gradient after the backward pass (all of it exposed);
2. ``BucketedDP``: gradients in buckets, in reverse order of use; a bucket's all-reduce starts
   from a gradient hook the moment its last gradient is ready, behind the rest of the backward
   pass (PyTorch DDP, Li et al. 2020, arXiv 2006.15704);
3. ``ShardedTrainer`` (ZeRO-1/2, NeMo's distributed optimizer): each layer's gradients are
   reduce-scattered during the backward pass, each rank updates its shard (Adam's state is
   sharded), and each layer's updated parameters are all-gathered one layer ahead of the next
   forward pass (NeMo's ``overlap_grad_sync`` / ``overlap_param_sync``);
4. ``Zero3``: parameters sharded at rest; a layer is all-gathered one layer ahead in the forward
   and the backward pass and freed after use (ZeRO-3, Rajbhandari et al. 2020, arXiv 1910.02054).

Given pieces: ``workbook/data_parallel.py``. Run: ``workbook run dp_overlap``; grade:
``workbook grade --lab dp_overlap``; compare: ``workbook bench dp_overlap``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from workbook.data_parallel import ADAM, FlatParameters, Trainer
from workbook.model import ModelConfig, params_by_name

BUCKET_BYTES = 1 << 20            # DDP's default is 25 MB; the lesson's models are small


# --------------------------------------------------------------------------- 1. naive DP
class NaiveDP(Trainer):
    """Plain DP: after backward, ``g <- (1/n) sum_ranks g`` for every gradient, one blocking
    all-reduce each: 2(n-1)/n * Psi bytes per rank on the bus, none of it hidden."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__(cfg, device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), **ADAM)

    def finish_gradient_sync(self) -> None:
        # TODO: for every parameter: all-reduce its .grad (a sum), then divide it by self.n
        raise NotImplementedError("not implemented yet: dp_overlap.NaiveDP.finish_gradient_sync")


# --------------------------------------------------------------------------- 2. buckets
def make_buckets(params: list[nn.Parameter], bucket_bytes: int) -> list[list[nn.Parameter]]:
    """Group ``params`` (given in order of use) into buckets in *reverse* order of use, the
    order backward makes their gradients: walk them from the last; a bucket closes when the next
    parameter would take it past ``bucket_bytes`` (a parameter larger than that gets its own)."""
    # TODO: walk reversed(params); start a new bucket when the current one is not empty and adding
    #       p.numel() * p.element_size() would exceed bucket_bytes
    raise NotImplementedError("not implemented yet: dp_overlap.make_buckets")


class BucketedDP(Trainer):
    """DP with the all-reduce hidden behind backward: each bucket's gradients live in one flat
    buffer (``FlatParameters``), averaged in place by one asynchronous all-reduce, started the
    moment the bucket's last gradient has been accumulated. Buckets go out in bucket order (every
    rank must issue collectives in the same order); only the last bucket's all-reduce is exposed."""

    def __init__(self, cfg: ModelConfig, device=None, bucket_bytes: int = BUCKET_BYTES):
        super().__init__(cfg, device)
        params = [p for unit in self.units for p in unit.parameters()]      # order of use
        self.buckets = [FlatParameters(b) for b in make_buckets(params, bucket_bytes)]
        self.optimizer = torch.optim.Adam(self.model.parameters(), **ADAM)
        self.works: list = []
        # TODO: for every bucket i and each of its params p: p.register_post_accumulate_grad_hook
        #       calling self.grad_ready(i)
        raise NotImplementedError("not implemented yet: dp_overlap.BucketedDP.__init__")

    def zero_grad(self) -> None:
        for bucket in self.buckets:
            bucket.zero_grads()                   # keeps every .grad a view into its bucket
        self.missing = [len(b.params) for b in self.buckets]   # gradients each bucket still needs
        self.next_bucket, self.works = 0, []

    def grad_ready(self, i: int) -> None:
        """One gradient of bucket ``i`` is accumulated: once the bucket is complete, start the
        all-reduce of every complete bucket from ``self.next_bucket`` on, in order."""
        # TODO: count it down in self.missing[i]; then, while bucket self.next_bucket has none
        #       missing: divide its .grad by n, start an async all-reduce, keep the work, move on
        raise NotImplementedError("not implemented yet: dp_overlap.BucketedDP.grad_ready")

    def finish_gradient_sync(self) -> None:
        # TODO: every bucket must have started (say which did not); wait for each work
        raise NotImplementedError("not implemented yet: dp_overlap.BucketedDP.finish_gradient_sync")


# --------------------------------------------------------------------------- 3. ZeRO-1/2
class ShardedTrainer(Trainer):
    """The distributed optimizer (ZeRO stage 1 or 2). Each layer's parameters live in one flat
    buffer; this rank owns the shard ``flat.data[flat.shard]`` and Adam steps only that shard
    (so Adam's two moments take 2 Psi/n). Per layer, in the backward pass: ``RS(grad / n)``
    into the shard's ``.grad``; after the step: ``AG`` of the updated shards back into the
    flat buffer, one layer ahead of the next forward pass. Stage 2 frees each full gradient
    once its reduce-scatter is done; stage 1 keeps it."""

    def __init__(self, cfg: ModelConfig, device=None, stage: int = 2):
        super().__init__(cfg, device)
        self.stage = stage
        self.flats = [FlatParameters(list(u.parameters()), pad_to=self.n) for u in self.units]
        self.shards = self.make_shards()                              # [Psi_i / n] each
        for shard in self.shards:
            shard.grad = torch.zeros_like(shard)                      # the reduced gradient
        self.optimizer = torch.optim.Adam(self.shards, **ADAM)
        self.grad_works, self.gathers = {}, {}
        self.stale: set[int] = set()      # layers whose full parameters are out of date
        for i, (unit, flat) in enumerate(zip(self.units, self.flats)):
            unit.register_forward_pre_hook(lambda *_, i=i: self.before_forward(i))
            for p in flat.params:
                p.register_post_accumulate_grad_hook(lambda _p, i=i: self.grad_ready(i))

    def make_shards(self) -> list:
        """The tensors Adam updates: views of this rank's slice of each flat buffer."""
        return [flat.data[flat.shard].requires_grad_() for flat in self.flats]

    def zero_grad(self) -> None:
        for flat in self.flats:
            flat.zero_grads()
        self.missing = [len(f.params) for f in self.flats]

    def grad_ready(self, i: int) -> None:
        """One gradient of layer ``i`` is accumulated; the last one starts its reduce-scatter."""
        self.missing[i] -= 1
        if self.missing[i] == 0:
            self.reduce_scatter_grads(i)

    def reduce_scatter_grads(self, i: int) -> None:
        """Layer ``i``'s gradients are all accumulated: start their reduce-scatter."""
        # TODO: divide self.flats[i].grad by n; an async reduce_scatter_tensor of it into
        #       self.shards[i].grad, the work kept in self.grad_works[i]
        raise NotImplementedError("not implemented yet: dp_overlap.ShardedTrainer.reduce_scatter_grads")

    def finish_gradient_sync(self) -> None:
        # TODO: wait for every reduce-scatter (layer by layer); with stage >= 2 free that layer's
        #       full gradient after its wait
        raise NotImplementedError("not implemented yet: dp_overlap.ShardedTrainer.finish_gradient_sync")

    def optimizer_step(self) -> None:
        self.optimizer.step()                    # this rank's shards only
        # TODO: every layer's full parameters are now stale; start the first layer's all-gather
        #       (the forward pre-hooks do the rest)
        raise NotImplementedError("not implemented yet: dp_overlap.ShardedTrainer.optimizer_step")

    def start_gather(self, i: int) -> None:
        """Start all-gathering layer ``i``'s parameters from every rank's shard, if they are
        stale (nothing for a layer that is up to date, under way, or does not exist)."""
        # TODO: only if i is in self.stale: take it out, alloc_params, an async
        #       all_gather_into_tensor of the shard into self.flats[i].data, the work kept in
        #       self.gathers[i]
        raise NotImplementedError("not implemented yet: dp_overlap.ShardedTrainer.start_gather")

    def wait_gather(self, i: int) -> None:
        """Layer ``i``'s full parameters are in place once this returns."""
        work = self.gathers.pop(i, None)
        if work is not None:
            work.wait()

    def before_forward(self, i: int) -> None:
        # TODO: start layer i's gather (if stale), wait for it, then start layer i + 1's (prefetch
        #       one layer ahead)
        raise NotImplementedError("not implemented yet: dp_overlap.ShardedTrainer.before_forward")

    def full_parameters(self) -> dict:
        """Every parameter by name, complete (the gathers still in flight finished first)."""
        for i in range(len(self.flats)):
            self.start_gather(i)
            self.wait_gather(i)
        return params_by_name(self.model)


# --------------------------------------------------------------------------- 4. ZeRO-3
class Zero3(ShardedTrainer):
    """ZeRO-3: between steps a rank holds only its shards (a copy, ``Psi/n``), every flat buffer
    freed. Forward: gather layer i (started one layer earlier), start i + 1, free i after it
    ran. Backward: gather layer i again (started by layer i + 1), start i - 1, reduce-scatter
    its gradients, free it. The parameters cross the link three times: 3 x (n-1)/n x Psi."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__(cfg, device, stage=3)
        for i, (unit, flat) in enumerate(zip(self.units, self.flats)):
            unit.register_forward_hook(lambda _m, _a, out, i=i: self.after_forward(i, out))
            flat.free_params()
            flat.free_grads()
        self.stale = set(range(len(self.flats)))        # no layer is present between steps

    def make_shards(self) -> list:
        return [flat.data[flat.shard].clone().requires_grad_() for flat in self.flats]

    def zero_grad(self) -> None:
        self.missing = [len(f.params) for f in self.flats]          # grads: before_backward

    def optimizer_step(self) -> None:
        self.optimizer.step()                    # the next forward gathers what it needs

    def after_forward(self, i: int, out: torch.Tensor) -> None:
        """Layer ``i`` ran: its backward begins when the gradient of ``out`` arrives."""
        # TODO: out.register_hook calling self.before_backward(i); free layer i's parameters,
        #       except the last layer's (backward starts with it)
        raise NotImplementedError("not implemented yet: dp_overlap.Zero3.after_forward")

    def before_backward(self, i: int) -> None:
        """Layer ``i``'s backward is about to run."""
        # TODO: start layer i's gather (if stale) and wait for it, make room for its gradients
        #       (zero_grads), start layer i - 1's gather
        raise NotImplementedError("not implemented yet: dp_overlap.Zero3.before_backward")

    def reduce_scatter_grads(self, i: int) -> None:
        # TODO: as ZeRO-1/2 (super()), then free layer i's parameters: its backward is done
        raise NotImplementedError("not implemented yet: dp_overlap.Zero3.reduce_scatter_grads")

    def full_parameters(self) -> dict:
        out = {}
        for i, flat in enumerate(self.flats):
            self.start_gather(i)
            self.wait_gather(i)
            out.update(params_by_name(self.units[i]))
            flat.free_params()
            self.stale.add(i)
        return {name: out[name] for name, _ in self.model.named_parameters()}


VARIANTS = {"naive": NaiveDP, "bucketed": BucketedDP, "zero1": lambda cfg, dev=None:
            ShardedTrainer(cfg, dev, stage=1), "zero2": ShardedTrainer, "zero3": Zero3}


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
