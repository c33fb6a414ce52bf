"""Lab 5 -- sequence parallelism (Korthikanti et al. 2022, arXiv 2205.05198 sec. 4.2.2): lab 4's
tensor-parallel model with everything between the parallel regions run on this rank's S/n
positions, every result equal to one device's.

You build, in order: the two collectives along the sequence and the operators that enter and
leave a parallel region from sequence shards; the column- and row-parallel linears on shards;
attention, MLP, norms and the block on shards; then the embedding, the model and the gradient
sync of the replicated parameters. Each task's docstring is its spec; lesson 5
(``lessons/05_sequence_parallel``) teaches the ideas, and ``workbook hint sp TASK`` gives hints,
one rung at a time. A shard of [B, S, H] is this rank's positions, ``x[:, s0:s1]``.

Given: the reference model (``workbook.model``) and ``workbook.tensor_parallel.mappings`` (where
this rank stands, which slice of a reference parameter it holds, the sequence-parallel tag, an
autograd operator made of a forward and a backward function, and the vocab-parallel loss: lab 5
is graded on its own, never on your lab 4). Run: ``workbook run sp`` or
``torchrun --nproc_per_node=4 labs/sp.py``; grade: ``workbook grade --lab sp``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from workbook.model import ModelConfig, dropout_mask
from workbook.model import ops as model_ops    # (not "ops": cloudpickle would mistake it for torch.ops)
from workbook.model.reference import make_norm, rope_tables
from workbook.tensor_parallel.mappings import conjugate_op, local_param, mark_sequence_parallel, sequence_range, tp_world_size, vocab_parallel_cross_entropy, vocab_range
from workbook.runtime import ranks


# --------------------------------------------------------------------------- 1. sequence collectives
### BEGIN CHALLENGE: the sequence collectives, their two operators and the SP linears: entering and leaving a region from sequence shards (lesson 5, "Two ways to shard one block", "Same bytes")
def all_gather_sequence(x: torch.Tensor) -> torch.Tensor:
    """Every rank's sequence shard joined into the whole sequence (lesson 5, "Two ways to
    shard one block", on the lab's layout, and "Same bytes").

    * In: [B, S/n, ...], this rank's positions. Out: [B, S, ...], every rank's positions in
      rank order, on every rank, as a new contiguous tensor (lesson 5, "How much memory it
      saves", says why a view will not do).
    * Communication: one single-tensor all-gather of torch.distributed; none for n = 1."""
    n = tp_world_size()
    if n == 1:
        return x
    ### BEGIN SOLUTION
    ### hint 1: the single-tensor collectives join along dim 0, the lab's sequence is dim 1; lesson
    ###     5, "Two ways to shard one block"
    ### hint 2: move the sequence to the front (contiguous), gather every rank's piece into a
    ###     buffer n times as long along it, move the sequence back and make it contiguous
    ### hint 3: xt = x.transpose(0, 1).contiguous(); full = torch.empty((n * S/n, B, ...));
    ###     dist.all_gather_into_tensor(full, xt); full.transpose(0, 1).contiguous()
    xt = x.transpose(0, 1).contiguous()                                       # [S/n, B, H]
    full = torch.empty((n * xt.shape[0], *xt.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(full, xt)                                     # [S, B, H]
    return full.transpose(0, 1).contiguous()                                  # [B, S, H]
    ### END SOLUTION


def reduce_scatter_sequence(x: torch.Tensor) -> torch.Tensor:
    """The sum over the ranks of a full-sequence tensor, keeping this rank's positions only
    (lesson 5, "Same bytes").

    * In: [B, S, ...], a partial result on each rank. Out: [B, S/n, ...], this rank's
      positions of the sum over the ranks.
    * A sequence length that does not split over the ranks raises a one-line ValueError that
      names it.
    * Communication: one single-tensor reduce-scatter of torch.distributed; none for n = 1."""
    n = tp_world_size()
    if n == 1:
        return x
    ### BEGIN SOLUTION
    ### hint 1: the mirror image of the all-gather above, with the same move of the sequence to the
    ###     front; lesson 5, "Same bytes"
    ### hint 2: sequence first (contiguous), check that it splits, reduce-scatter into a buffer n
    ###     times shorter along it, sequence back (contiguous)
    ### hint 3: xt = x.transpose(0, 1).contiguous(); mine = torch.empty((S // n, B, ...));
    ###     dist.reduce_scatter_tensor(mine, xt); mine.transpose(0, 1).contiguous()
    xt = x.transpose(0, 1).contiguous()                                       # [S, B, H]
    if xt.shape[0] % n:
        raise ValueError(f"sequence length {xt.shape[0]} is not divisible by tp={n}")
    mine = torch.empty((xt.shape[0] // n, *xt.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(mine, xt)                                      # [S/n, B, H]
    return mine.transpose(0, 1).contiguous()                                  # [B, S/n, H]
    ### END SOLUTION


def gather_from_sequence_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """Enter a parallel region from sequence shards: the sequence-parallel counterpart of lab
    4's f (lesson 5, "Same bytes", the table of the two operators).

    Forward: [B, S/n, ...] to [B, S, ...] on every rank. Backward: from each rank's gradient of
    the whole sequence, this rank's shard's gradient as one device would have it. Communication:
    only the two sequence collectives above, one per pass."""
    ### BEGIN SOLUTION
    ### hint 1: an operator is a pair of functions, one per pass; lesson 5's table gives the pair,
    ###     the mappings module turns a pair into an autograd op
    ### hint 2: forward: gather the shards along the sequence; backward: sum the gradients over the
    ###     ranks and keep this rank's positions
    ### hint 3: conjugate_op(x, forward=all_gather_sequence, backward=reduce_scatter_sequence)
    return conjugate_op(x, forward=all_gather_sequence, backward=reduce_scatter_sequence)
    ### END SOLUTION


def reduce_scatter_to_sequence_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """Leave a parallel region to sequence shards: the sequence-parallel counterpart of lab 4's
    g (lesson 5, "Same bytes", the table of the two operators).

    Forward: partial [B, S, ...] on each rank to [B, S/n, ...], this rank's positions of the
    sum. Backward: the gradient of the whole partial input, on every rank."""
    ### BEGIN SOLUTION
    ### hint 1: the operator above with its two directions swapped
    ### hint 2: forward: sum over ranks and keep this rank's positions; backward: gather the
    ###     shards' gradients along the sequence
    ### hint 3: conjugate_op(x, forward=reduce_scatter_sequence, backward=all_gather_sequence)
    return conjugate_op(x, forward=reduce_scatter_sequence, backward=all_gather_sequence)
    ### END SOLUTION


# --------------------------------------------------------------------------- 2. the linears
class SPColumnParallelLinear(nn.Module):
    """Lab 4's column-parallel linear, entered from sequence shards (lesson 5, "Two ways to
    shard one block").

    * Parameters: as lab 4's, this rank's output features of the reference layer's weight and
      bias, under the reference ``Linear``'s names (bias by default as in the reference).
    * In: [B, S/n, in], this rank's positions, gathered along the sequence by the layer itself;
      with its input-gathering option off, the caller has already gathered it (once for q, k
      and v): [B, S, in]. Out: [B, S, out/n], this rank's features of the whole sequence.
    * Communication: at most one all-gather forward (and its reduce-scatter backward)."""

    def __init__(self, cfg: ModelConfig, name: str, in_features: int, out_features: int, *,
                 bias: bool | None = None, gather_input: bool = True, device=None):
        super().__init__()
        self.name, self.gather_input = name, gather_input
        bias = cfg.style == "gpt" if bias is None else bias
        self.weight = local_param(cfg, f"{name}.weight", device)
        self.bias = local_param(cfg, f"{name}.bias", device) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        ### hint 1: the column layer needs every position of its input; lesson 5, "Two ways to
        ###     shard one block"
        ### hint 2: enter the region from the shards (unless the caller did), then the local slice
        ###     of the layer
        ### hint 3: gather_from_sequence_parallel_region(x) if self.gather_input;
        ###     model_ops.linear(x, self.weight, self.bias)
        if self.gather_input:
            x = gather_from_sequence_parallel_region(x)
        return model_ops.linear(x, self.weight, self.bias)
        ### END SOLUTION


class SPRowParallelLinear(nn.Module):
    """Lab 4's row-parallel linear, leaving to sequence shards (lesson 5, "Two ways to shard
    one block", and "Two new duties").

    * Parameters: this rank's input features of the reference weight; the bias (by default as
      in the reference) replicated, whole, and tagged sequence-parallel: a rank adds it to its
      own positions only, so its gradient there is partial.
    * In: [B, S, in/n], this rank's features of the whole sequence. Out: [B, S/n, out], this
      rank's positions of the single-device output, bias included once.
    * Communication: one reduce-scatter forward (and its all-gather backward)."""

    def __init__(self, cfg: ModelConfig, name: str, in_features: int, out_features: int, *,
                 bias: bool | None = None, device=None):
        super().__init__()
        self.name = name
        bias = cfg.style == "gpt" if bias is None else bias
        self.weight = local_param(cfg, f"{name}.weight", device)
        ### BEGIN SOLUTION
        ### hint 1: the bias is replicated but, after the reduce-scatter, only meets this rank's
        ###     positions; lesson 5, "Two new duties"
        ### hint 2: the whole reference bias (if there is one), tagged with the given
        ###     sequence-parallel tag, else None
        ### hint 3: self.bias = mark_sequence_parallel(local_param(cfg, f"{name}.bias", device)) if
        ###     bias else None
        self.bias = mark_sequence_parallel(local_param(cfg, f"{name}.bias", device)) if bias else None
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        ### hint 1: lab 4's row layer, leaving the region to shards instead of to a replicated
        ###     output
        ### hint 2: multiply by the local weight without the bias, leave the region (sum and
        ###     shard), then add the bias
        ### hint 3: y = reduce_scatter_to_sequence_parallel_region(model_ops.linear(x,
        ###     self.weight)); y + self.bias
        y = reduce_scatter_to_sequence_parallel_region(model_ops.linear(x, self.weight))
        return y + self.bias if self.bias is not None else y
        ### END SOLUTION
### END CHALLENGE


# --------------------------------------------------------------------------- 3. attention, MLP, block
### BEGIN CHALLENGE: SPAttention, SPMLP, sp_norm and SPBlock: the sequence-parallel block, whole (lesson 5, "Two ways to shard one block", "Two new duties")
class SPAttention(nn.Module):
    """The reference's attention (``workbook.model.reference.Attention``) from sequence shards
    to sequence shards (lesson 5, "Two ways to shard one block").

    * Submodules: the sequence-parallel linears above, named as the reference's, whole heads
      per rank (``heads/n``); shapes that do not split raise the configuration's one-line
      ValueError (with sequence parallelism on).
    * In and out: [B, S/n, H], this rank's positions; attention runs on this rank's heads over
      the whole sequence (llama: RoPE of the full positions, as the reference).
    * Communication: one all-gather for the three input projections together and one
      reduce-scatter at the output, per pass."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        self.cfg, self.name = cfg, f"blocks.{layer}.attn"
        H, self.local_heads = cfg.hidden, cfg.heads // tp_world_size()
        for w in ("wq", "wk", "wv"):
            setattr(self, w, SPColumnParallelLinear(cfg, f"{self.name}.{w}", H, H,
                                                    gather_input=False, device=device))
        self.wo = SPRowParallelLinear(cfg, f"{self.name}.wo", H, H, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        ### hint 1: lab 4's attention, entered from shards: the sequence must be whole before the
        ###     projections; lesson 5, "Two ways to shard one block"
        ### hint 2: enter the region once (gathering the sequence), project, run the reference's
        ###     causal attention on the local heads with the RoPE tables of the whole sequence,
        ###     project out
        ### hint 3: x = gather_from_sequence_parallel_region(x); ctx =
        ###     model_ops.causal_attention(self.wq(x), self.wk(x), self.wv(x), self.local_heads,
        ###     rope_tables(self.cfg, x)); self.wo(ctx)
        x = gather_from_sequence_parallel_region(x)                          # [B, S, H]
        ctx = model_ops.causal_attention(self.wq(x), self.wk(x), self.wv(x), self.local_heads,
                                         rope_tables(self.cfg, x))
        return self.wo(ctx)                                                   # [B, S/n, H]
        ### END SOLUTION


class SPMLP(nn.Module):
    """The reference's MLP (``workbook.model.reference.MLP``, both styles) from sequence shards
    to sequence shards (lesson 5, "Two ways to shard one block").

    * Submodules: the sequence-parallel linears above, named as the reference's; shapes that
      do not split raise the configuration's one-line ValueError.
    * In and out: [B, S/n, H], this rank's positions; the hidden activation stays split by
      features (F/n per rank).
    * Communication: one all-gather in, one reduce-scatter out, per pass."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        self.cfg, self.name = cfg, f"blocks.{layer}.mlp"
        H, F = cfg.hidden, cfg.ffn_hidden
        col = dict(gather_input=False, device=device)
        if cfg.style == "gpt":
            self.fc1 = SPColumnParallelLinear(cfg, f"{self.name}.fc1", H, F, **col)
            self.fc2 = SPRowParallelLinear(cfg, f"{self.name}.fc2", F, H, device=device)
        else:
            self.w_gate = SPColumnParallelLinear(cfg, f"{self.name}.w_gate", H, F, **col)
            self.w_up = SPColumnParallelLinear(cfg, f"{self.name}.w_up", H, F, **col)
            self.w_down = SPRowParallelLinear(cfg, f"{self.name}.w_down", F, H, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        ### hint 1: lab 4's MLP, entered from shards instead of from a replicated input
        ### hint 2: enter the region once (gathering the sequence), then the reference's formula of
        ###     this style; the last layer leaves to shards
        ### hint 3: x = gather_from_sequence_parallel_region(x); gpt:
        ###     self.fc2(model_ops.gelu(self.fc1(x))); llama: w_down(silu(w_gate x) * w_up x)
        x = gather_from_sequence_parallel_region(x)
        if self.cfg.style == "gpt":
            return self.fc2(model_ops.gelu(self.fc1(x)))
        return self.w_down(model_ops.silu(self.w_gate(x)) * self.w_up(x))
        ### END SOLUTION


def sp_norm(cfg: ModelConfig, name: str, device) -> nn.Module:
    """The reference norm of that name, on this device, made ready to run on this rank's
    positions only: every one of its parameters tagged sequence-parallel, so that the gradient
    sync adds up their partial gradients (lesson 5, "Two new duties")."""
    norm = make_norm(cfg, name).to(device)
    ### BEGIN SOLUTION
    ### hint 1: a norm's gain and bias are replicated but see only this rank's positions; lesson 5,
    ###     "Two new duties"
    ### hint 2: tag each of the norm's parameters with the given sequence-parallel tag
    ### hint 3: for p in norm.parameters(): mark_sequence_parallel(p)
    for p in norm.parameters():
        mark_sequence_parallel(p)
    ### END SOLUTION
    return norm


class SPBlock(nn.Module):
    """The reference's pre-norm block (``workbook.model.reference.Block``) on sequence shards
    (lesson 5, "Two ways to shard one block", and "Two new duties").

    * Submodules named as the reference's: the norms (tagged as above), and the
      sequence-parallel attention and MLP. Norms, dropouts and residual adds run on this rank's
      positions only.
    * Forward: [B, S/n, H] in and out, this rank's positions of the reference block's output
      for the same step number (which selects the dropout masks, in training mode).
    * Communication per pass: two all-gathers and two reduce-scatters of B*S*H numbers, no
      all-reduce; activation memory: TP's for the parallel regions, 1/n of TP's for the rest
      (lesson 5, "How much memory it saves")."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        device = device or ranks.device()
        self.cfg, self.layer, self.name = cfg, layer, f"blocks.{layer}"
        self.norm1 = sp_norm(cfg, f"{self.name}.norm1", device)
        self.attn = SPAttention(cfg, layer, device)
        self.norm2 = sp_norm(cfg, f"{self.name}.norm2", device)
        self.mlp = SPMLP(cfg, layer, device)

    def dropout(self, x: torch.Tensor, site: str, step: int) -> torch.Tensor:
        """Dropout of a shard [B, S/n, H] (training mode, gpt's nonzero rate; else the identity)
        with this rank's positions of the reference's mask for the same site and step (lesson
        5, "Two new duties"), keeping nothing as large as the whole mask alive."""
        if not self.training or self.cfg.dropout == 0.0:
            return x
        ### BEGIN SOLUTION
        ### hint 1: the reference draws one mask for the whole sequence of a site and step; lesson
        ###     5, "Two new duties"
        ### hint 2: draw the reference's mask for the full sequence length (the shard's times n)
        ###     and this block's site, keep this rank's positions as a copy, multiply
        ### hint 3: S = x.shape[1] * n; s0, s1 = sequence_range(S); mask = dropout_mask(self.cfg,
        ###     f"{self.name}.{site}.dropout", (B, S, H), step, x.device); x * mask[:,
        ###     s0:s1].contiguous()
        S = x.shape[1] * tp_world_size()
        s0, s1 = sequence_range(S)
        mask = dropout_mask(self.cfg, f"{self.name}.{site}.dropout", (x.shape[0], S, x.shape[2]),
                            step, x.device)
        return x * mask[:, s0:s1].contiguous()      # a copy: a view would keep the full mask alive
        ### END SOLUTION

    def forward(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
        ### BEGIN SOLUTION
        ### hint 1: the same residual stream as the reference block; the shards only change what
        ###     each tensor holds
        ### hint 2: two residual steps, each: normalise, run the sublayer, drop out (this block's
        ###     method, with its site and the step), add
        ### hint 3: x = x + self.dropout(self.attn(self.norm1(x)), "attn", step); the same with
        ###     norm2, mlp, "mlp"
        x = x + self.dropout(self.attn(self.norm1(x)), "attn", step)
        x = x + self.dropout(self.mlp(self.norm2(x)), "mlp", step)
        return x
        ### END SOLUTION
### END CHALLENGE


# --------------------------------------------------------------------------- 4. the model
class SPEmbedding(nn.Module):
    """The reference's embedding, ending in sequence shards (lesson 5, "The ends of the model").

    * Parameters (given): rank r's rows of the token table (``vocab_range``), and for gpt the
      learned positions, replicated and tagged sequence-parallel.
    * Forward: token ids [B, S] (the whole sequence, the same on every rank) to [B, S/n, H],
      this rank's positions of the reference's embedding.
    * Communication: one reduce-scatter of B*S*H numbers in forward, no all-reduce."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        device = device or ranks.device()
        self.cfg, self.name = cfg, "embed"
        self.tok = nn.Module()
        self.tok.weight = local_param(cfg, "embed.tok.weight", device)
        if cfg.style == "gpt":
            self.pos = nn.Module()
            self.pos.weight = mark_sequence_parallel(local_param(cfg, "embed.pos.weight", device))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        start, stop = vocab_range(self.cfg.vocab_size)
        ### BEGIN SOLUTION
        ### hint 1: lab 4's vocab-parallel lookup, but the sum over ranks can shard at the same
        ###     time; lesson 5, "The ends of the model"
        ### hint 2: look up the tokens this rank holds (zeros for the others), sum over ranks
        ###     keeping this rank's positions, then add the positions' rows of this rank (gpt)
        ### hint 3: as lab 4's lookup; h = reduce_scatter_to_sequence_parallel_region(h); s0, s1 =
        ###     sequence_range(S); h + self.pos.weight[s0:s1]
        mine = (tokens >= start) & (tokens < stop)
        local_ids = (tokens - start).clamp(0, stop - start - 1)
        h = self.tok.weight[local_ids] * mine.unsqueeze(-1).to(self.tok.weight.dtype)
        h = reduce_scatter_to_sequence_parallel_region(h)                    # [B, S/n, H]
        if self.cfg.style == "gpt":
            s0, s1 = sequence_range(tokens.shape[1])
            h = h + self.pos.weight[s0:s1]
        return h
        ### END SOLUTION


class SPModel(nn.Module):
    """The reference model (``workbook.model.ReferenceModel``), sequence-parallel, every
    parameter under its reference name (lesson 5, "The ends of the model").

    * Parts: this lab's embedding and blocks, the final norm on shards, a column-parallel head
      without bias entered from shards whose logits stay split by vocabulary, and the given
      vocab-parallel loss. A sequence length (or any shape) that does not split over the ranks
      raises the configuration's one-line ValueError, checked with sequence parallelism on.
    * Forward: token ids and target ids [B, S] and the step number in, the reference's scalar
      loss out, on every rank. After backward and the gradient sync below, every gradient is
      this rank's piece of the reference's."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        ### BEGIN SOLUTION
        ### hint 1: lab 4's model, made of this lab's parts; the configuration must be checked for
        ###     sequence parallelism first
        ### hint 2: validate the configuration for this many ranks with sequence parallelism; then
        ###     embedding, one block per layer, a tagged final norm, the head (no bias, gathering
        ###     its input)
        ### hint 3: cfg.validate(tp=n, sequence_parallel=True); embed = SPEmbedding; blocks =
        ###     nn.ModuleList(SPBlock...); norm_f = sp_norm(cfg, "norm_f", device); head =
        ###     SPColumnParallelLinear(cfg, "head", H, V, bias=False)
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        device = device or ranks.device()
        self.cfg, self.name = cfg, ""
        self.embed = SPEmbedding(cfg, device)
        self.blocks = nn.ModuleList(SPBlock(cfg, i, device) for i in range(cfg.n_layers))
        self.norm_f = sp_norm(cfg, "norm_f", device)
        self.head = SPColumnParallelLinear(cfg, "head", cfg.hidden, cfg.vocab_size, bias=False,
                                           device=device)
        ### END SOLUTION

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, step: int = 0) -> torch.Tensor:
        ### BEGIN SOLUTION
        ### hint 1: lab 4's model forward; the given mappings module has the vocab-parallel loss
        ### hint 2: embed, every block (with the step), the final norm, the head, the loss of the
        ###     split logits
        ### hint 3: h = self.embed(tokens); blocks; local_logits = self.head(self.norm_f(h));
        ###     vocab_parallel_cross_entropy(local_logits, targets, V)
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h, step)
        local_logits = self.head(self.norm_f(h))                             # [B, S, V/n]
        return vocab_parallel_cross_entropy(local_logits, targets, self.cfg.vocab_size)
        ### END SOLUTION


def sync_sequence_parallel_grads(module: nn.Module) -> int:
    """After backward: make the gradient of every parameter tagged sequence-parallel the sum
    over the ranks, which is the reference's gradient, so that the replicas stay equal (lesson
    5, "Two new duties").

    Communication: one collective for all of them together. Returns how many parameters were
    synchronised (the tagged ones that have a gradient)."""
    params = [p for p in module.parameters()
              if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if not params or tp_world_size() == 1:
        return len(params)
    ### BEGIN SOLUTION
    ### hint 1: each rank's gradient is one term of the sum over positions; lesson 5, "Two new
    ###     duties"
    ### hint 2: flatten every gradient into one buffer, sum it over the ranks, copy each piece back
    ###     into its gradient
    ### hint 3: flat = torch.cat([p.grad.reshape(-1) ...]); dist.all_reduce(flat); for p, piece in
    ###     zip(params, flat.split(sizes)): p.grad.copy_(piece.view_as(p.grad))
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    for p, summed in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(summed.view_as(p.grad))
    ### END SOLUTION
    return len(params)


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
