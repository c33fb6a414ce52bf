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
        ### BEGIN SOLUTION hint: for every parameter: all-reduce its .grad (a sum), then divide it by self.n
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= self.n
        ### END SOLUTION


# --------------------------------------------------------------------------- 2. buckets
def make_buckets(params: list[nn.Parameter], bucket_bytes: int) -> list[list[nn.Parameter]]:
    """Group ``params`` (given in order of use) into buckets in *reverse* order of use, the
    order backward makes their gradients: walk them from the last; a bucket closes when the next
    parameter would take it past ``bucket_bytes`` (a parameter larger than that gets its own)."""
    ### BEGIN SOLUTION hint: walk reversed(params); start a new bucket when the current one is not empty and adding p.numel() * p.element_size() would exceed bucket_bytes
    buckets, size = [[]], 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if buckets[-1] and size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes
    return buckets
    ### END SOLUTION


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
        ### BEGIN SOLUTION hint: for every bucket i and each of its params p: p.register_post_accumulate_grad_hook calling self.grad_ready(i)
        for i, bucket in enumerate(self.buckets):
            for p in bucket.params:
                p.register_post_accumulate_grad_hook(lambda _p, i=i: self.grad_ready(i))
        ### END SOLUTION

    def zero_grad(self) -> None:
        for bucket in self.buckets:
            bucket.zero_grads()                   # keeps every .grad a view into its bucket
        self.missing = [len(b.params) for b in self.buckets]   # gradients each bucket still needs
        self.next_bucket, self.works = 0, []

    def grad_ready(self, i: int) -> None:
        """One gradient of bucket ``i`` is accumulated: once the bucket is complete, start the
        all-reduce of every complete bucket from ``self.next_bucket`` on, in order."""
        ### BEGIN SOLUTION hint: count it down in self.missing[i]; then, while bucket self.next_bucket has none missing: divide its .grad by n, start an async all-reduce, keep the work, move on
        self.missing[i] -= 1
        while self.next_bucket < len(self.buckets) and self.missing[self.next_bucket] == 0:
            grad = self.buckets[self.next_bucket].grad
            grad /= self.n                                           # the average, summed
            self.works.append(dist.all_reduce(grad, async_op=True))
            self.next_bucket += 1
        ### END SOLUTION

    def finish_gradient_sync(self) -> None:
        ### BEGIN SOLUTION hint: every bucket must have started (say which did not); wait for each work
        if self.next_bucket != len(self.buckets):
            raise RuntimeError(f"bucket {self.next_bucket} never got all its gradients")
        for work in self.works:
            work.wait()
        ### END SOLUTION


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
        ### BEGIN SOLUTION hint: divide self.flats[i].grad by n; an async reduce_scatter_tensor of it into self.shards[i].grad, the work kept in self.grad_works[i]
        flat = self.flats[i]
        flat.grad /= self.n
        self.grad_works[i] = dist.reduce_scatter_tensor(self.shards[i].grad, flat.grad,
                                                        async_op=True)   # [Psi_i] -> [Psi_i/n]
        ### END SOLUTION

    def finish_gradient_sync(self) -> None:
        ### BEGIN SOLUTION hint: wait for every reduce-scatter (layer by layer); with stage >= 2 free that layer's full gradient after its wait
        for i in range(len(self.flats)):
            work = self.grad_works.pop(i, None)
            if work is None:
                raise RuntimeError(f"layer {i}'s reduce-scatter never started")
            work.wait()
            if self.stage >= 2:
                self.flats[i].free_grads()
        ### END SOLUTION

    def optimizer_step(self) -> None:
        self.optimizer.step()                    # this rank's shards only
        ### BEGIN SOLUTION hint: every layer's full parameters are now stale; start the first layer's all-gather (the forward pre-hooks do the rest)
        self.stale = set(range(len(self.flats)))
        self.start_gather(0)
        ### END SOLUTION

    def start_gather(self, i: int) -> None:
        """Start all-gathering layer ``i``'s parameters from every rank's shard, if they are
        stale (nothing for a layer that is up to date, under way, or does not exist)."""
        ### BEGIN SOLUTION hint: only if i is in self.stale: take it out, alloc_params, an async all_gather_into_tensor of the shard into self.flats[i].data, the work kept in self.gathers[i]
        if i not in self.stale:
            return
        self.stale.remove(i)
        flat = self.flats[i]
        flat.alloc_params()
        self.gathers[i] = dist.all_gather_into_tensor(flat.data, self.shards[i].detach(),
                                                      async_op=True)      # [Psi_i/n] -> [Psi_i]
        ### END SOLUTION

    def wait_gather(self, i: int) -> None:
        """Layer ``i``'s full parameters are in place once this returns."""
        work = self.gathers.pop(i, None)
        if work is not None:
            work.wait()

    def before_forward(self, i: int) -> None:
        ### BEGIN SOLUTION hint: start layer i's gather (if stale), wait for it, then start layer i + 1's (prefetch one layer ahead)
        self.start_gather(i)
        self.wait_gather(i)
        self.start_gather(i + 1)
        ### END SOLUTION

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
        ### BEGIN SOLUTION hint: out.register_hook calling self.before_backward(i); free layer i's parameters, except the last layer's (backward starts with it)
        out.register_hook(lambda _grad: self.before_backward(i))
        if i < len(self.flats) - 1:
            self.flats[i].free_params()
            self.stale.add(i)
        ### END SOLUTION

    def before_backward(self, i: int) -> None:
        """Layer ``i``'s backward is about to run."""
        ### BEGIN SOLUTION hint: start layer i's gather (if stale) and wait for it, make room for its gradients (zero_grads), start layer i - 1's gather
        self.start_gather(i)
        self.wait_gather(i)
        self.flats[i].zero_grads()
        self.start_gather(i - 1)
        ### END SOLUTION

    def reduce_scatter_grads(self, i: int) -> None:
        ### BEGIN SOLUTION hint: as ZeRO-1/2 (super()), then free layer i's parameters: its backward is done
        super().reduce_scatter_grads(i)
        self.flats[i].free_params()
        self.stale.add(i)
        ### END SOLUTION

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
