"""The block the tp and sp reports measure: a small GPT config in fp64 that splits over the job's
ranks, with a full input and output gradient."""
from __future__ import annotations


def block_case(sequence_parallel: bool = False):
    """``(cfg, x, dy)`` for the tp and sp figures: a GPT config in fp64 with dropout that splits
    over this job's ranks, and a full ``[B=2, S, H]`` input and output gradient (same on every
    rank)."""
    import torch

    from workbook.model import ModelConfig
    from workbook.tensor_parallel.mappings import tp_world_size
    from workbook.runtime import ranks
    cfg = ModelConfig(dtype="float64", dropout=0.1)
    try:
        cfg.validate(tp=tp_world_size(), sequence_parallel=sequence_parallel)
    except ValueError:
        cfg = ModelConfig.odd_shapes(dtype="float64", dropout=0.1)
    g = torch.Generator().manual_seed(0)
    shape = (2, cfg.seq_len, cfg.hidden)
    x = torch.randn(*shape, generator=g, dtype=torch.float64).to(ranks.device())
    dy = torch.randn(*shape, generator=g, dtype=torch.float64).to(ranks.device())
    return cfg, x, dy
