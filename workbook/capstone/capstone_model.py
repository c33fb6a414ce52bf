"""The capstone's model, given: the ends of the sequence-parallel model around any block, and a
pipeline stage holding the blocks a stage rule chose.

* ``SPLanguageModel(cfg, make_block)``: the reference model (``workbook.model.ReferenceModel``)
  in sequence-parallel TP (Korthikanti et al. 2022, arXiv 2205.05198): the vocab-parallel
  embedding, summed and cut into sequence shards by one reduce-scatter; the blocks, from
  ``make_block(cfg, layer, device)`` (the learner's ``tp_overlap`` ``OverlapBlock``, or the
  stand-in of ``capstone_standins``); the final norm on shards; the column-parallel head,
  entered by one all-gather, whose logits stay split by vocabulary; the vocab-parallel loss.
  It runs inside the TP group seen as the world (``Mesh.as_world``): every collective of it
  is the TP group's. Replicated parameters whose gradient a rank computes from its own
  positions only (norms, the position table, row-parallel biases) carry the given
  ``sequence_parallel`` tag; the rest are this rank's shard.
* ``stage_with_blocks(cfg, blocks, stage, p)``: pipeline stage ``stage`` of ``p``
  (``workbook.pipeline_parallel.PipelineStage``: embedding on the first, norm and head on the
  last) holding exactly the blocks listed: the learner's ``stage_blocks`` decides the split.

Communication per forward of ``SPLanguageModel`` on n TP ranks, b rows, S positions, H wide:
one reduce-scatter (embedding) and one all-gather (head) of ``[b, S, H]``, three all-reduces of
``[b, S]`` in the loss; the backward: the conjugates (an all-gather, a reduce-scatter).
"""
from __future__ import annotations

import torch
from torch import nn

from workbook.model import Block, ModelConfig
from workbook.model import ops as model_ops
from workbook.model.reference import make_norm
from workbook.pipeline_parallel import PipelineStage
from workbook.runtime import ranks
from workbook.tensor_parallel import (
    all_gather_sequence,
    conjugate_op,
    local_param,
    mark_sequence_parallel,
    reduce_scatter_sequence,
    sequence_range,
    tp_world_size,
    vocab_parallel_cross_entropy,
    vocab_range,
)


class SPLanguageModel(nn.Module):
    """The whole model on one TP rank, blocks from ``make_block``; ``forward(tokens, targets,
    step)`` -> the mean loss over this replica's rows, the same on every TP rank."""

    def __init__(self, cfg: ModelConfig, make_block, device=None):
        super().__init__()
        cfg.validate(tp=tp_world_size(), sequence_parallel=True)
        device = device or ranks.device()
        self.cfg = cfg
        self.tok = local_param(cfg, "embed.tok.weight", device)              # [V/n, H]
        self.pos = mark_sequence_parallel(local_param(cfg, "embed.pos.weight", device)) \
            if cfg.style == "gpt" else None                                   # [S, H], whole
        self.blocks = nn.ModuleList(make_block(cfg, i, device) for i in range(cfg.n_layers))
        self.norm_f = make_norm(cfg, "norm_f").to(device)
        for p in self.norm_f.parameters():
            mark_sequence_parallel(p)
        self.head = local_param(cfg, "head.weight", device)                  # [V/n, H]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[b, S]`` ids -> this rank's positions ``[b, S/n, H]`` of the embedding."""
        start, stop = vocab_range(self.cfg.vocab_size)
        mine = ((tokens >= start) & (tokens < stop)).unsqueeze(-1).to(self.tok.dtype)
        h = self.tok[(tokens - start).clamp(0, stop - start - 1)] * mine     # [b, S, H] partial
        h = conjugate_op(h, reduce_scatter_sequence, all_gather_sequence)    # [b, S/n, H]
        if self.pos is not None:
            s0, s1 = sequence_range(tokens.shape[1])
            h = h + self.pos[s0:s1]
        return h

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, step: int = 0) -> torch.Tensor:
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h, step)                                               # [b, S/n, H]
        h = conjugate_op(self.norm_f(h), all_gather_sequence, reduce_scatter_sequence)
        local_logits = model_ops.linear(h, self.head)                        # [b, S, V/n]
        return vocab_parallel_cross_entropy(local_logits, targets, self.cfg.vocab_size)


def stage_with_blocks(cfg: ModelConfig, blocks: list[int], stage: int, p: int,
                      device=None) -> PipelineStage:
    """Pipeline stage ``stage`` of ``p`` holding the blocks ``blocks`` (indices into the
    reference model's), the reference weights; the embedding on stage 0, the final norm and
    the head on the last stage."""
    blocks = [int(i) for i in blocks]
    module = PipelineStage(cfg, stage, p)
    module.blocks = nn.ModuleList(Block(cfg, i) for i in blocks)
    module.unit_names = (["embed"] if stage == 0 else []) + [f"blocks.{i}" for i in blocks] \
        + (["norm_f", "head"] if stage == p - 1 else [])
    return module.to(device) if device is not None else module
