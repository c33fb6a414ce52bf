"""What the tensor-parallel family's benchmarks share (``workbook bench domino`` and
``workbook bench tp_overlap`` measure the same model shapes, like for like): the model options,
the deterministic batch, the optimum of the no-communication schedules, and the backward of the
sequence-parallel gather used by plain SP.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def add_model_arguments(parser, defaults: dict, variants, steps: int) -> None:
    """The options every model benchmark shares (``bench domino``, ``bench tp_overlap``): ranks,
    link, implementation, style, the model's shapes, steps, variants and where traces go."""
    parser.add_argument("--nproc", type=int, default=2, help="tensor-parallel ranks (default 2)")
    parser.add_argument("--link", default="dgx-h100", help="simulated link preset (default dgx-h100)")
    parser.add_argument("--impl", default="solutions", help="labs, solutions or a folder (default solutions)")
    parser.add_argument("--style", choices=["gpt", "llama"], default="gpt")
    for name, value in defaults.items():
        parser.add_argument(f"--{name}", type=int, default=value, help=f"default {value}")
    parser.add_argument("--steps", type=int, default=steps, help=f"measured steps per variant (default {steps})")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps per variant (default 1)")
    parser.add_argument("--variants", default=",".join(variants),
                        help="comma-separated subset of " + ",".join(variants))
    parser.add_argument("--trace-dir", default=None, help="keep the traces here")


def inputs(cfg, batch: int, seed: int = 0, device=None):
    """``(x [batch, seq, hidden], targets [batch, seq])`` in the model's dtype, from ``seed``, on
    ``device``: by default this rank's (``workbook.runtime.ranks.device()``: ``cuda:N`` on GPU
    ranks, whose collectives take no CPU tensor; ``cpu`` outside a rank). Drawn on the CPU, so
    every device gets the same numbers."""
    from workbook.runtime import ranks
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, cfg.seq_len, cfg.hidden, generator=g, dtype=cfg.torch_dtype)
    targets = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=g)
    dev = ranks.device() if device is None else torch.device(device)
    return x.to(dev), targets.to(dev)


def fold_optimum(merged: dict) -> dict | None:
    """The optimum is the faster no-communication schedule: fold ``no_comm_domino`` into
    ``no_comm`` (the faster row stays) and return ``{schedule: step ms}``, or None."""
    chunked = merged.pop("no_comm_domino", None)
    if chunked is None:
        return None
    schedules = {"whole batch": merged["no_comm"]["step_ms"], "domino chunks": chunked["step_ms"]}
    if chunked["step_ms"] < merged["no_comm"]["step_ms"]:
        merged["no_comm"] = chunked
    return schedules


class GatherSequenceSplitBackward(torch.autograd.Function):
    """All-gather along the sequence forward; backward keeps this rank's slice of a gradient
    that every rank already holds whole (the replicated head computed it redundantly)."""

    @staticmethod
    def forward(ctx, xs):
        n = dist.get_world_size()
        ctx.rank, ctx.piece = dist.get_rank(), xs.shape[1]
        parts = [torch.empty_like(xs) for _ in range(n)]
        dist.all_gather(parts, xs.contiguous())
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        return grad[:, ctx.rank * ctx.piece:(ctx.rank + 1) * ctx.piece]
