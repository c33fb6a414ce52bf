# Generated from solutions/sp.py by `workbook assign` (level: standard): this is your file to edit.
# Replace each `raise NotImplementedError` with your code; check it with `workbook run sp`
# (or `workbook watch sp`). Stuck on task N? `workbook hint sp N`, one hint at a time.
#
# Your tasks (29 pts in all):
#    1. all_gather_sequence (0.75 pts): Every rank's sequence shard joined into the whole sequence
#       (lesson 5, "Two ways to shard one block", on the lab's layout, and "Same bytes").
#    2. reduce_scatter_sequence (0.75 pts): The sum over the ranks of a full-sequence tensor,
#       keeping this rank's positions only (lesson 5, "Same bytes").
#    3. gather_from_sequence_parallel_region (0.75 pts): Enter a parallel region from sequence
#       shards: the sequence-parallel counterpart of lab 4's f (lesson 5, "Same bytes", the table
#       of the two operators).
#    4. reduce_scatter_to_sequence_parallel_region (0.75 pts): Leave a parallel region to sequence
#       shards: the sequence-parallel counterpart of lab 4's g (lesson 5, "Same bytes", the table
#       of the two operators).
#    5. SPColumnParallelLinear.forward (1 pt): Lab 4's column-parallel linear, entered from
#       sequence shards (lesson 5, "Two ways to shard one block").
#    6. SPRowParallelLinear.__init__ and .forward (1 pt): Lab 4's row-parallel linear, leaving to
#       sequence shards (lesson 5, "Two ways to shard one block", and "Two new duties").
#    7. SPAttention.forward (3 pts): The reference's attention
#       (`workbook.model.reference.Attention`) from sequence shards to sequence shards (lesson 5,
#       "Two ways to shard one block").
#    8. SPMLP.forward (3 pts): The reference's MLP (`workbook.model.reference.MLP`, both styles)
#       from sequence shards to sequence shards (lesson 5, "Two ways to shard one block").
#    9. sp_norm (1.5 pts): The reference norm of that name, on this device, made ready to run on
#       this rank's positions only: every one of its parameters tagged sequence-parallel, so that
#       the gradient sync adds up their partial gradients (lesson 5, "Two new duties").
#   10. SPBlock.dropout and .forward (7.5 pts): The reference's pre-norm block
#       (`workbook.model.reference.Block`) on sequence shards (lesson 5, "Two ways to shard one
#       block", and "Two new duties").
#   11. SPEmbedding.forward (2 pts): The reference's embedding, ending in sequence shards (lesson
#       5, "The ends of the model").
#   12. SPModel.__init__ and .forward (3 pts): The reference model
#       (`workbook.model.ReferenceModel`), sequence-parallel, every parameter under its reference
#       name (lesson 5, "The ends of the model").
#   13. sync_sequence_parallel_grads (4 pts): After backward: make the gradient of every parameter
#       tagged sequence-parallel the sum over the ranks, which is the reference's gradient, so that
#       the replicas stay equal (lesson 5, "Two new duties").
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
    raise NotImplementedError("not implemented yet: sp.all_gather_sequence")


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
    raise NotImplementedError("not implemented yet: sp.reduce_scatter_sequence")


def gather_from_sequence_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """Enter a parallel region from sequence shards: the sequence-parallel counterpart of lab
    4's f (lesson 5, "Same bytes", the table of the two operators).

    Forward: [B, S/n, ...] to [B, S, ...] on every rank. Backward: from each rank's gradient of
    the whole sequence, this rank's shard's gradient as one device would have it. Communication:
    only the two sequence collectives above, one per pass."""
    raise NotImplementedError("not implemented yet: sp.gather_from_sequence_parallel_region")


def reduce_scatter_to_sequence_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """Leave a parallel region to sequence shards: the sequence-parallel counterpart of lab 4's
    g (lesson 5, "Same bytes", the table of the two operators).

    Forward: partial [B, S, ...] on each rank to [B, S/n, ...], this rank's positions of the
    sum. Backward: the gradient of the whole partial input, on every rank."""
    raise NotImplementedError("not implemented yet: sp.reduce_scatter_to_sequence_parallel_region")


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
        raise NotImplementedError("not implemented yet: sp.SPColumnParallelLinear.forward")


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
        raise NotImplementedError("not implemented yet: sp.SPRowParallelLinear.__init__")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("not implemented yet: sp.SPRowParallelLinear.forward")


# --------------------------------------------------------------------------- 3. attention, MLP, block
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
        raise NotImplementedError("not implemented yet: sp.SPAttention.forward")


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
        raise NotImplementedError("not implemented yet: sp.SPMLP.forward")


def sp_norm(cfg: ModelConfig, name: str, device) -> nn.Module:
    """The reference norm of that name, on this device, made ready to run on this rank's
    positions only: every one of its parameters tagged sequence-parallel, so that the gradient
    sync adds up their partial gradients (lesson 5, "Two new duties")."""
    norm = make_norm(cfg, name).to(device)
    raise NotImplementedError("not implemented yet: sp.sp_norm")
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
        raise NotImplementedError("not implemented yet: sp.SPBlock.dropout")

    def forward(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
        raise NotImplementedError("not implemented yet: sp.SPBlock.forward")


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
        raise NotImplementedError("not implemented yet: sp.SPEmbedding.forward")


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
        raise NotImplementedError("not implemented yet: sp.SPModel.__init__")

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, step: int = 0) -> torch.Tensor:
        raise NotImplementedError("not implemented yet: sp.SPModel.forward")


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
    raise NotImplementedError("not implemented yet: sp.sync_sequence_parallel_grads")
    return len(params)


if __name__ == "__main__":
    from workbook.selfcheck import main
    main(__file__)
