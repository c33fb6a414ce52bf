"""The capstone's training run, given: its settings, the reference learning-rate schedule, the
global batches, and the single-device run every configuration must reproduce.

* ``TrainSetup``: the model (``ModelConfig``), the global batch ``[batch, seq]``, the steps, Adam,
  the schedule (linear warm-up to ``max_lr``, then cosine decay to ``min_lr``, as in
  Loshchilov & Hutter 2017, arXiv 1608.03983, and the GPT-3/Llama recipes), the clipping norm,
  the micro-batches of the pipeline and the DP bucket cap. ``check(kind, inner, dp)``: the
  one-line errors of a setup that does not split over a mesh (a batch that does not cut into DP
  shards, or into micro-batches; a model that does not split over TP);
* ``reference_lr(step, setup)``: the schedule::

      step < warmup:  lr = max_lr * (step + 1) / warmup
      after:          t = min(1, (step - warmup) / max(1, steps - warmup))
                      lr = min_lr + (max_lr - min_lr) * (1 + cos(pi t)) / 2

* ``global_batches(setup)``: ``setup.steps`` global batches of real text (``capstone_data``);
* ``train_single_device(setup)``: the ground truth: ``ReferenceModel`` on the whole global
  batch, ``torch.nn.utils.clip_grad_norm_``, the schedule, Adam; the losses and the gradient
  norms (before clipping) of every step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from workbook.model import ModelConfig


def _model() -> ModelConfig:
    return ModelConfig(vocab_size=256, hidden=32, heads=4, ffn_hidden=64, n_layers=2, seq_len=16,
                       style="gpt", dtype="float64", seed=0)


@dataclass
class TrainSetup:
    """Everything a capstone run needs to be reproduced on one device."""
    cfg: ModelConfig = field(default_factory=_model)
    batch: int = 8                  # rows of the global batch (every DP replica together)
    steps: int = 20
    max_lr: float = 1e-2
    min_lr: float = 1e-3
    warmup: int = 3
    betas: tuple = (0.9, 0.95)
    eps: float = 1e-8
    max_norm: float = 1.0           # clip to this global gradient norm
    micro_batches: int = 2          # per DP replica, in the pipeline
    bucket_bytes: int = 64 << 10    # the DP bucket cap: a few buckets in this small model
    seed: int = 0                   # which rows of the corpus each step reads

    @classmethod
    def for_overlap(cls) -> "TrainSetup":
        """The traced step's setup: GEMMs and a token count large enough that compute can cover
        the simulated link (fp32, hidden 512, 2 048 tokens per DP replica: on ``dgx-h100`` a
        GEMM covers its transfer when its width F gives F x 900 GB/s / (4 x 790 TFLOP/s) >= 1,
        and the backward covers the DP all-reduce when the replica's tokens do the same)."""
        cfg = ModelConfig(vocab_size=256, hidden=512, heads=8, ffn_hidden=2048, n_layers=2,
                          seq_len=256, style="gpt", dtype="float32", seed=0)
        return cls(cfg=cfg, batch=16, steps=2, micro_batches=2, bucket_bytes=2 << 20)

    @property
    def seq(self) -> int:
        return self.cfg.seq_len

    def check(self, kind: str, inner: int, dp: int) -> "TrainSetup":
        """One-line ``ValueError`` naming the rule when this setup cannot run on an
        ``inner x dp`` mesh of ``kind`` (``tp`` or ``pp``); returns ``self``."""
        if self.batch % dp:
            raise ValueError(f"batch={self.batch} rows do not split into dp={dp} equal DP shards: "
                             f"use a batch that is a multiple of {dp}")
        if kind == "tp":
            self.cfg.validate(tp=inner, sequence_parallel=True)
        elif kind == "pp":
            if self.cfg.n_layers % inner:
                raise ValueError(f"n_layers={self.cfg.n_layers} layers do not split into pp={inner} "
                                 f"stages of equal size: use a multiple of {inner} layers")
            if (self.batch // dp) % self.micro_batches:
                raise ValueError(f"a DP shard of {self.batch // dp} rows does not cut into "
                                 f"micro_batches={self.micro_batches} equal micro-batches: use a "
                                 f"batch that is a multiple of dp x micro_batches = "
                                 f"{dp * self.micro_batches}")
        else:
            raise ValueError(f"kind={kind!r}: use 'tp' or 'pp'")
        return self


def reference_lr(step: int, setup: TrainSetup) -> float:
    """The learning rate of ``step`` (0-based): the module docstring's schedule."""
    if step < setup.warmup:
        return setup.max_lr * (step + 1) / setup.warmup
    t = min(1.0, (step - setup.warmup) / max(1, setup.steps - setup.warmup))
    return setup.min_lr + (setup.max_lr - setup.min_lr) * (1 + math.cos(math.pi * t)) / 2


def global_batches(setup: TrainSetup, steps: int | None = None) -> list:
    """``[(tokens [batch, seq], targets [batch, seq]), ...]`` for steps ``0 .. steps-1``."""
    from workbook.capstone.capstone_data import text_loader
    loader = text_loader(setup.batch, setup.seq, setup.seed)
    return [loader.global_batch(step) for step in range(setup.steps if steps is None else steps)]


def train_single_device(setup: TrainSetup, steps: int | None = None) -> dict:
    """``{"losses": [...], "norms": [...]}``: one device, the whole global batch, every step."""
    import torch

    from workbook.model import ReferenceModel
    model = ReferenceModel(setup.cfg)
    opt = torch.optim.Adam(model.parameters(), lr=setup.max_lr, betas=setup.betas, eps=setup.eps)
    losses, norms = [], []
    for step, (tokens, targets) in enumerate(global_batches(setup, steps)):
        opt.zero_grad(set_to_none=True)
        loss = model(tokens, targets, step)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), setup.max_norm)))
        for group in opt.param_groups:
            group["lr"] = reference_lr(step, setup)
        opt.step()
        losses.append(float(loss.detach()))
    return {"losses": losses, "norms": norms}
