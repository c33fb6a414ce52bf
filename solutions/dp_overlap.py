"""Lab `dp_overlap`: data parallelism and the distributed optimizer, their traffic hidden.

Lesson 9 (``lessons/09_dp_overlap.py``) explains everything this lab asks for. Every rank holds
the model and trains on its rows of the batch; whatever the variant, each step must be exactly
the step one device takes on the whole batch. You build four trainers, each hiding more of the
traffic than the one before, and predict how much of it cannot hide:

1. ``NaiveDP``: the gradients synchronised after the backward pass;
2. ``make_buckets`` and ``BucketedDP``: the synchronisation in buckets, during the backward pass
   (PyTorch DDP, Li et al. 2020, arXiv 2006.15704);
3. ``predict_exposed_ms``: before you run it, the communication time your buckets leave exposed;
4. ``ShardedTrainer``: ZeRO-1/2, the distributed optimizer (NeMo's ``overlap_grad_sync`` /
   ``overlap_param_sync``);
5. ``Zero3``: the parameters sharded at rest too (Rajbhandari et al. 2020, arXiv 1910.02054).

Given pieces: ``workbook/data_parallel/data_parallel.py`` (``Trainer``, ``FlatParameters``, ...).
Run: ``workbook run dp_overlap``; hints: ``workbook hint dp_overlap TASK``; grade:
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
    """Plain data parallelism: after the backward pass every gradient becomes the average of the
    ranks' gradients, one blocking collective per parameter, none of it hidden.

    Contract: when ``finish_gradient_sync`` returns, each parameter's gradient holds the mean
    over the ranks (so Adam takes the single-device step on the whole batch). Collectives: one
    all-reduce per parameter, after backward. Lesson 9, "Why averaging the gradients is exact"."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__(cfg, device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), **ADAM)

    def finish_gradient_sync(self) -> None:
        ### BEGIN SOLUTION
        ### hint 1: the average of the ranks' gradients is the whole batch's gradient (lesson 9,
        ###     "Why averaging the gradients is exact"); the collective sums
        ### hint 2: for each parameter of the model: sum its gradient over the ranks in place, then
        ###     turn the sum into the mean
        ### hint 3: for p in self.model.parameters(): dist.all_reduce(p.grad); p.grad /= self.n
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= self.n
        ### END SOLUTION


# --------------------------------------------------------------------------- 2. buckets
### BEGIN CHALLENGE: BucketedDP, the whole component: the bucketing and the trainer
def make_buckets(params: list[nn.Parameter], bucket_bytes: int) -> list[list[nn.Parameter]]:
    """Group the parameters (given in order of use) into the buckets whose gradients are reduced
    together, in the order the backward pass completes them.

    Contract: returns a list of non-empty lists; read in order they hold every parameter exactly
    once, in the order backward produces the gradients. Each bucket is as full as it can be
    without going over ``bucket_bytes`` (a bucket closes only when the next parameter would not
    fit); a single parameter larger than the cap gets a bucket of its own. Sizes are the
    parameters' bytes (elements x element size). Lesson 9, "Building the buckets"."""
    ### BEGIN SOLUTION
    ### hint 1: backward makes the last layer's gradients first, so the buckets follow the
    ###     parameters from the last to the first (lesson 9, "Building the buckets")
    ### hint 2: walk the parameters from the last; keep a running byte count of the open bucket;
    ###     when the next parameter would take a non-empty bucket past the cap, open a new one; add
    ###     the parameter
    ### hint 3: buckets, size = [[]], 0; for p in reversed(params): nbytes = p.numel() *
    ###     p.element_size(); if buckets[-1] and size + nbytes > bucket_bytes: buckets.append([]);
    ###     size = 0; then buckets[-1].append(p); size += nbytes
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
    """Data parallelism with the gradient synchronisation hidden behind the backward pass.

    Construction (``bucket_bytes``: the cap of a bucket): the model's parameters, in order of
    use (layer by layer, as the given ``Trainer`` lists its layers), grouped into buckets by
    the function above; each bucket's parameters living in one flat buffer of the given
    flat-buffer class (its gradient buffer then holds every gradient of the bucket); the
    trainer's ``buckets`` is the list of these buffers in bucket order (the benchmark reads
    it), and its optimizer Adam, with the settings imported above, over the model's
    parameters.

    During backward: the moment a bucket's last gradient has been accumulated, that bucket's
    gradients are averaged over the ranks by one asynchronous all-reduce of its flat gradient
    buffer, in place; the buckets go out strictly in bucket order (every rank must issue its
    collectives in the same order), a bucket that completes early waiting for those before it.
    ``finish_gradient_sync``: every bucket must have started (else raise, naming the bucket),
    and returns once all of them are done: the optimizer then reads averaged gradients.
    Collectives: one all-reduce per bucket per step, nothing else. Lesson 9, "Building the
    buckets" and "One training step, naive and bucketed"."""

    def __init__(self, cfg: ModelConfig, device=None, bucket_bytes: int = BUCKET_BYTES):
        """The buckets, the optimizer, and a hook on every parameter that reports each of its
        accumulated gradients, with its bucket's index, to the method below."""
        super().__init__(cfg, device)
        params = [p for unit in self.units for p in unit.parameters()]      # order of use
        self.buckets = [FlatParameters(b) for b in make_buckets(params, bucket_bytes)]
        self.optimizer = torch.optim.Adam(self.model.parameters(), **ADAM)
        self.works: list = []
        ### BEGIN SOLUTION
        ### hint 1: a bucket can go out only when the autograd engine tells you its gradients are
        ###     accumulated: a hook per parameter (lesson 9, "Building the buckets")
        ### hint 2: for every bucket, by index, and every parameter in it: register the hook that
        ###     runs after the gradient has been accumulated, calling the method that counts a
        ###     gradient off its bucket, with that bucket's index (bind the index when you register,
        ###     not when the hook runs)
        ### hint 3: for k, bucket in enumerate(self.buckets): for p in bucket.params:
        ###     p.register_post_accumulate_grad_hook(lambda _p, k=k: self.grad_ready(k))
        for k, bucket in enumerate(self.buckets):
            for p in bucket.params:
                p.register_post_accumulate_grad_hook(lambda _p, k=k: self.grad_ready(k))
        ### END SOLUTION

    def zero_grad(self) -> None:
        """Before each step: every gradient zeroed in place (they stay views into their bucket's
        buffer), the count of gradients each bucket still misses reset, no bucket started."""
        for bucket in self.buckets:
            bucket.zero_grads()                   # in place: the buffers stay the gradients
        self.missing = [len(b.params) for b in self.buckets]   # gradients each bucket still needs
        self.next_bucket, self.works = 0, []

    def grad_ready(self, i: int) -> None:
        """One more gradient of the given bucket is accumulated. Start the averaging of every
        bucket that is now complete and whose turn it is, in bucket order, without waiting."""
        ### BEGIN SOLUTION
        ### hint 1: a bucket is complete when none of its gradients is missing (zero_grad sets the
        ###     count); it may go out only after every bucket before it, so one completion may
        ###     release several waiting buckets (lesson 9, "Building the buckets")
        ### hint 2: count this gradient off bucket i; then, as long as the next bucket due is
        ###     complete: scale its flat gradient to the mean, start its all-reduce without waiting,
        ###     keep the handle, move to the next bucket
        ### hint 3: self.missing[i] -= 1; while self.next_bucket < len(self.buckets) and
        ###     self.missing[self.next_bucket] == 0: grad = self.buckets[self.next_bucket].grad;
        ###     grad /= self.n; self.works.append(dist.all_reduce(grad, async_op=True));
        ###     self.next_bucket += 1
        self.missing[i] -= 1
        while self.next_bucket < len(self.buckets) and self.missing[self.next_bucket] == 0:
            grad = self.buckets[self.next_bucket].grad
            grad /= self.n                                           # the average, summed
            self.works.append(dist.all_reduce(grad, async_op=True))
            self.next_bucket += 1
        ### END SOLUTION

    def finish_gradient_sync(self) -> None:
        """After backward: check every bucket went out, then wait until all are averaged."""
        ### BEGIN SOLUTION
        ### hint 1: an asynchronous collective's buffer is complete only once you waited on it
        ###     (lesson 9, "Building the buckets")
        ### hint 2: if some bucket never started, raise an error that names it; then wait on every
        ###     handle you kept
        ### hint 3: if self.next_bucket != len(self.buckets): raise RuntimeError(f"bucket
        ###     {self.next_bucket} never got all its gradients"); for work in self.works:
        ###     work.wait()
        if self.next_bucket != len(self.buckets):
            raise RuntimeError(f"bucket {self.next_bucket} never got all its gradients")
        for work in self.works:
            work.wait()
        ### END SOLUTION
### END CHALLENGE


# --------------------------------------------------------------------------- 3. predict
def predict_exposed_ms(link, buckets: list[list[nn.Parameter]], first_layer: list[nn.Parameter],
                       n: int) -> float:
    """Before the run: the milliseconds of ``BucketedDP``'s gradient traffic that no compute
    can hide in one step, on a simulated link, with a given number of ranks.

    Inputs: the simulated link (a ``workbook.link.cost_model.Link``: its latency per operation,
    alpha, and its bus bandwidth, 1/beta, as lesson 3 introduced them); the buckets as
    ``make_buckets`` returns them, in the order their all-reduces go out; the parameters of the
    model's first layer in order of use (the embedding); the number of ranks. Assume the link
    has carried every earlier bucket by the time the backward pass ends (the overlap condition
    holds), so what stays exposed is what can only start once the backward pass has made its
    last gradient. Returns a float, in ms. The grader compares it with the link model on
    several links, bucket sizes and rank counts; the report prints it beside the measured
    exposed time. Lesson 9, "Predict the exposed tail"."""
    ### BEGIN SOLUTION
    ### hint 1: the first layer's gradients are the last the backward pass makes, so every bucket
    ###     holding one of them starts after all compute; each costs one all-reduce on the link
    ###     (lesson 9, "Predict the exposed tail")
    ### hint 2: find the buckets that hold a first-layer parameter (every one of them, not only
    ###     the last); for each, the bytes of the whole bucket (its all-reduce carries all of it);
    ###     an all-reduce of S bytes on n ranks moves 2(n-1)/n S bus bytes (not S, not 2 S) and
    ###     pays the latency once; add those times; the other buckets hide; return ms, not s
    ### hint 3: first = {id(p) for p in first_layer}; for each bucket with any(id(p) in first ...):
    ###     S = sum(p.numel() * p.element_size()); t += link.latency_s + 2 * (n - 1) / n * S /
    ###     link.bandwidth_Bps; return 1e3 * t
    first = {id(p) for p in first_layer}
    seconds = 0.0
    for bucket in buckets:
        if any(id(p) in first for p in bucket):                    # ready only when backward ends
            size = sum(p.numel() * p.element_size() for p in bucket)
            seconds += link.latency_s + 2 * (n - 1) / n * size / link.bandwidth_Bps
    return 1e3 * seconds
    ### END SOLUTION


# --------------------------------------------------------------------------- 4. ZeRO-1/2
class ShardedTrainer(Trainer):
    """The distributed optimizer, ZeRO stage 1 or 2 (the constructor's stage).

    Given: each layer's parameters live in one flat buffer, padded so that it splits evenly over
    the ranks; this rank owns one slice of it, its shard, and Adam holds and steps only the
    shards (one tensor per layer, whose gradient receives the reduced gradient).

    Contract, per step: in the backward pass, as soon as a layer's gradients are all
    accumulated, they are reduced over the ranks without waiting, so that this rank's shard
    receives its slice of the *average*; ``finish_gradient_sync`` waits for every layer's
    reduction (stage 2 then frees the layer's full gradient buffer: only the shard stays; stage
    1 keeps it). After Adam's step every layer's full parameters are out of date: they are
    brought back from every rank's updated shard, each layer's at the latest when its next
    forward pass needs it, one layer ahead, so that compute hides it (the first layer's from
    the end of the optimizer step). Collectives: one reduce-scatter per layer in backward, one
    all-gather per layer per step, nothing else. Lesson 9, "ZeRO: shard what every rank keeps"
    and "The ZeRO step, layer by layer"."""

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
        """Layer ``i``'s gradients are all accumulated: start, without waiting, the reduction
        that leaves this rank's shard gradient holding its slice of the average; keep the handle
        for the gradient sync to wait on."""
        ### BEGIN SOLUTION
        ### hint 1: a reduce-scatter is the first half of an all-reduce: every rank ends with its
        ###     own slice of the sum (lesson 9, "The ZeRO step, layer by layer")
        ### hint 2: scale the layer's flat gradient to the mean; start an asynchronous
        ###     reduce-scatter of it into the gradient of this rank's shard of that layer; keep the
        ###     handle under the layer's index
        ### hint 3: flat = self.flats[i]; flat.grad /= self.n; self.grad_works[i] =
        ###     dist.reduce_scatter_tensor(self.shards[i].grad, flat.grad, async_op=True)
        flat = self.flats[i]
        flat.grad /= self.n
        self.grad_works[i] = dist.reduce_scatter_tensor(self.shards[i].grad, flat.grad,
                                                        async_op=True)   # [Psi_i] -> [Psi_i/n]
        ### END SOLUTION

    def finish_gradient_sync(self) -> None:
        """After backward: every layer's reduction done (raise, naming the layer, if one never
        started); from stage 2 on, each layer's full gradient freed once its shard is in."""
        ### BEGIN SOLUTION
        ### hint 1: the shard's gradient is complete only after the wait; stage 2 saves memory by
        ###     dropping the full gradient once it has been reduced (lesson 9, "The ZeRO step, layer
        ###     by layer")
        ### hint 2: layer by layer: take the layer's handle (an error naming the layer if there is
        ###     none), wait on it, and with stage 2 or more free the layer's full gradient buffer
        ### hint 3: for layer in range(len(self.flats)): work = self.grad_works.pop(layer, None);
        ###     raise if None; work.wait(); if self.stage >= 2: self.flats[layer].free_grads()
        for layer in range(len(self.flats)):
            work = self.grad_works.pop(layer, None)
            if work is None:
                raise RuntimeError(f"layer {layer}'s reduce-scatter never started")
            work.wait()
            if self.stage >= 2:
                self.flats[layer].free_grads()
        ### END SOLUTION

    def optimizer_step(self) -> None:
        """Adam on this rank's shards; then mark every layer's full parameters out of date and
        start bringing back the first layer's (the next forward pass does the rest)."""
        self.optimizer.step()                    # this rank's shards only
        ### BEGIN SOLUTION
        ### hint 1: after the step only the shards are current; the gather of the first layer has
        ###     nothing before it to hide behind but the end of this step (lesson 9, "The ZeRO step,
        ###     layer by layer")
        ### hint 2: record every layer as out of date, then start the first layer's gather
        ### hint 3: self.stale = set(range(len(self.flats))); self.start_gather(0)
        self.stale = set(range(len(self.flats)))
        self.start_gather(0)
        ### END SOLUTION

    def start_gather(self, i: int) -> None:
        """Start, without waiting, bringing layer ``i``'s full parameters back into its flat
        buffer from every rank's shard, if they are out of date; nothing for a layer that is
        current, already under way, or does not exist. Keep the handle where the given wait
        method below finds it."""
        ### BEGIN SOLUTION
        ### hint 1: an all-gather is the second half of an all-reduce: every rank's slice,
        ###     concatenated on every rank (lesson 9, "The ZeRO step, layer by layer")
        ### hint 2: if the layer is out of date: mark it current, make sure its flat buffer has
        ###     storage again, start an asynchronous all-gather of this rank's shard into that
        ###     buffer, keep the handle
        ### hint 3: if i not in self.stale: return; self.stale.remove(i); flat = self.flats[i];
        ###     flat.alloc_params(); self.gathers[i] = dist.all_gather_into_tensor(flat.data,
        ###     self.shards[i].detach(), async_op=True)
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
        """Layer ``i`` is about to run forward: its parameters must be complete, and the next
        layer's must be on their way while it computes."""
        ### BEGIN SOLUTION
        ### hint 1: prefetch one layer ahead: the gather of the next layer hides behind this layer's
        ###     compute; start_gather does nothing for a layer already current or under way, so
        ###     asking twice costs nothing (lesson 9, "The ZeRO step, layer by layer")
        ### hint 2: make sure this layer's gather has started and wait for it; then start the next
        ###     layer's
        ### hint 3: self.start_gather(i); self.wait_gather(i); self.start_gather(i + 1)
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


# --------------------------------------------------------------------------- 5. ZeRO-3
class Zero3(ShardedTrainer):
    """ZeRO-3: the parameters sharded at rest too.

    Given: between steps a rank holds only its shards (its own copy of its slice of each layer),
    every flat parameter and gradient buffer freed; the forward pass gathers what it needs (as
    in ZeRO-1/2, one layer ahead).

    Contract, per step: a layer's full parameters exist only while it computes. After its
    forward pass a layer is freed (except the last one: the backward pass starts with it);
    before its backward pass it is gathered again, the layer before it already on its way
    (one layer ahead, in backward order); its gradient buffer is made ready just before its
    backward, and once its gradients are reduced (as in ZeRO-1/2) the layer is freed again.
    Collectives: forward, one all-gather per layer; backward, one all-gather per layer but the
    last and one reduce-scatter per layer; nothing else. Lesson 9, "ZeRO-3: gather one layer
    ahead"."""

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
        """Layer ``i``'s forward pass ran and produced ``out``: arrange for this layer's
        before-backward step (below) to run when the backward pass reaches it, and free the
        layer's parameters unless it is the last layer (marking them out of date)."""
        ### BEGIN SOLUTION
        ### hint 1: the gradient of a layer's output arrives just before that layer's backward, so a
        ###     hook on the output tells you when to gather it again (lesson 9, "ZeRO-3: gather one
        ###     layer ahead")
        ### hint 2: register a hook on the output tensor's gradient that calls the before-backward
        ###     method with this layer's index; unless this is the last layer, free its flat
        ###     parameter buffer and record it as out of date
        ### hint 3: out.register_hook(lambda _grad: self.before_backward(i)); if i < len(self.flats)
        ###     - 1: self.flats[i].free_params(); self.stale.add(i)
        out.register_hook(lambda _grad: self.before_backward(i))
        if i < len(self.flats) - 1:
            self.flats[i].free_params()
            self.stale.add(i)
        ### END SOLUTION

    def before_backward(self, i: int) -> None:
        """Layer ``i``'s backward is about to run: its parameters complete, its gradient buffer
        ready (zeroed), and the layer before it on its way."""
        ### BEGIN SOLUTION
        ### hint 1: the backward pass mirrors the forward pass: prefetch the layer it reaches next,
        ###     the one before (lesson 9, "ZeRO-3: gather one layer ahead")
        ### hint 2: make sure this layer's gather has started and wait for it; give its gradients a
        ###     zeroed buffer again; start the previous layer's gather
        ### hint 3: self.start_gather(i); self.wait_gather(i); self.flats[i].zero_grads();
        ###     self.start_gather(i - 1)
        self.start_gather(i)
        self.wait_gather(i)
        self.flats[i].zero_grads()
        self.start_gather(i - 1)
        ### END SOLUTION

    def reduce_scatter_grads(self, i: int) -> None:
        """Layer ``i``'s gradients are complete: reduce them as ZeRO-1/2 does; its backward is
        done, so its full parameters go (out of date until the next gather)."""
        super().reduce_scatter_grads(i)
        self.flats[i].free_params()
        self.stale.add(i)

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
