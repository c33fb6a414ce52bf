"""Measuring Domino on ranks: what lesson 6, the domino figures and ``workbook bench domino`` share.

* ``measure`` / ``run_measured``: the lesson's round, a warm-up then a profiled step of each
  variant into ``run_dir/VARIANT``;
* ``agrees``, ``registry_problem``, ``PretendWork``: is the learner's lab usable yet?

A step of each variant: ``variant_step``; the link's calibration and a profiled step are every
family's: ``workbook.measure``. Each rank's model and batch sit on its device
(``workbook.runtime.ranks.device()``): a GPU rank's collectives take no CPU tensor.
"""
from __future__ import annotations

import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

from workbook.measure.calibration import recalibrate
from workbook.tensor_parallel.block_bench import inputs
from workbook.tensor_parallel.variant_step import training_step


# --------------------------------------------------------------------------- the lesson's round
def measure(impl, model: dict, batch: int, p: int, preset: str, run_dir: str,
            variants=("vanilla_tp", "no_comm", "domino")) -> dict:
    """On every rank: recalibrate, then two rounds of one step per variant, a warm-up and one
    under the profiler (``run_dir/VARIANT``). Returns ``{variant: ms, "local_flops": rate}``."""
    import torch.distributed as dist

    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig
    from workbook.runtime import ranks
    from workbook.tensor_parallel.layer_stack import TPStack
    from workbook.trace.capture import rank_trace
    lab = load_lab("domino", impl)
    cfg = ModelConfig(**model)
    x, targets = inputs(cfg, batch, device=ranks.device())
    m = TPStack(cfg, dist.get_rank(), dist.get_world_size(), device=ranks.device())
    out = {"local_flops": recalibrate(preset)}
    for traced in (False, True):
        for variant in variants:
            dist.barrier()
            with rank_trace(f"{run_dir}/{variant}", lab="domino") if traced else nullcontext():
                t0 = time.perf_counter()
                training_step(lab, m, x, targets, variant, p=p)
                out[variant] = (time.perf_counter() - t0) * 1e3
    return out


def run_measured(impl, p: int, preset: str, model: dict, batch: int, ranks: int = 2,
                 timeout: float = 300):
    """``measure`` on ``ranks`` warm ranks over the simulated ``preset``: (results, run_dir)."""
    from workbook.runtime.launch import on_ranks
    run_dir = Path(tempfile.mkdtemp(prefix="lesson6-"))
    res = on_ranks(measure, ranks, impl, model, batch, p, preset, str(run_dir), link=preset,
                   timeout=timeout)
    return res, run_dir


# --------------------------------------------------------------------------- the benchmarks' step
# --------------------------------------------------------------------------- is the lab usable?
def agrees(impl) -> str:
    """On every rank: ``"ok"`` if the lab's Domino step equals vanilla TP's (fp64, tiny model,
    loss and every gradient), else what went wrong."""
    import torch.distributed as dist

    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig
    from workbook.runtime import ranks
    from workbook.tensor_parallel.layer_stack import TPStack
    lab = load_lab("domino", impl)
    cfg = ModelConfig(hidden=32, heads=4, ffn_hidden=64, n_layers=2, seq_len=8, vocab_size=32,
                      dropout=0.1, dtype="float64")
    x, t = inputs(cfg, 8, seed=1, device=ranks.device())
    try:
        m = TPStack(cfg, dist.get_rank(), dist.get_world_size(), device=ranks.device())
        want = lab.train_step(m, x, t, variant="vanilla_tp")
        grads = {n: w.grad.clone() for n, w in m.params.items()}
        m.zero_grad()
        got = lab.train_step(m, x, t, variant="domino", p=4)
        err = max([abs(got.item() - want.item())] + [(w.grad - grads[n]).abs().max().item()
                                                        for n, w in m.params.items()])
        return "ok" if err < 1e-9 else f"differs from vanilla TP by {err:.1e}"
    except NotImplementedError as exc:
        return f"not implemented yet ({exc})"
    except Exception as exc:                         # noqa: BLE001 - reported, then the reference
        return f"{type(exc).__name__}: {exc}"


class PretendWork:
    """Stands in for an async all-reduce's work handle: ``wait()`` says so."""

    def __init__(self, name: str, say: bool = True):
        self.name, self.say = name, say

    def wait(self):
        if self.say:
            print(f"  wait() on {self.name}")


def registry_problem(module) -> str | None:
    """None if ``module.HandleRegistry`` keeps, waits for and forgets handles; else what went wrong."""
    try:
        r = module.HandleRegistry()
        r.put("a", PretendWork("a", say=False))
        assert r.pending() == ["a"], f"pending() is {r.pending()} after one put"
        r.wait("a")
        r.check_empty()
    except NotImplementedError as exc:
        return f"not finished yet ({exc})"
    except Exception as exc:                         # noqa: BLE001 - reported, then the reference
        return f"{type(exc).__name__}: {exc}"
    return None

