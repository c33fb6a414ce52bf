"""Measuring Domino on ranks: what lesson 6, ``workbook bench domino``, the domino figures and
the grader share.

* ``recalibrate``: re-make the simulated link from this machine's matmul rate *now* (the ranks
  agree on the highest of their best measurements): a busy machine slows compute, not the
  modelled link, so a calibration from a quieter moment would hide too much;
* ``inputs``: the deterministic batch ``(x, targets)`` of a model;
* ``training_step``: one step of a variant through the lab's ``train_step``: ``vanilla_tp``,
  ``no_comm`` (vanilla TP with ``comm=False``), ``domino_intra``, ``domino``, and
  ``no_comm_domino``: Domino's own schedule with a registry whose ``start`` files a finished
  handle instead of an all-reduce (on a CPU the chunks' smaller working set can be faster);
* ``measure`` / ``run_measured``: the lesson's round, a warm-up then a profiled step of each
  variant into ``run_dir/VARIANT``;
* ``profiled_step``, ``overlap_fields``, ``fold_optimum``: one profiled step and its figures,
  and the optimum, as ``workbook bench domino`` and ``workbook bench tp_overlap`` measure them;
* ``agrees``, ``registry_problem``, ``PretendWork``: is the learner's lab usable yet?
"""
from __future__ import annotations

import tempfile
import time
from contextlib import nullcontext
from pathlib import Path


def recalibrate(preset: str | None = None, tries: int = 3) -> float | None:
    """On every rank: set the link ``preset`` (default: the current one's) calibrated to the
    matmul rate measured now; returns that rate, or None when there is no link to calibrate."""
    import torch
    import torch.distributed as dist

    from workbook import link
    preset = preset or (link.current_link().preset if link.current_link() else None)
    if preset in (None, "none"):
        return None
    rate = torch.tensor([max(link.measure_local_flops(seconds=0.1) for _ in range(tries))],
                        dtype=torch.float64)
    dist.all_reduce(rate, op=dist.ReduceOp.MAX)
    from workbook.ranks import link_nodes
    link.set_link(link.make_link(preset, float(rate), link_nodes()))     # the same nodes
    return float(rate)


def inputs(cfg, batch: int, seed: int = 0):
    """``(x [batch, seq, hidden], targets [batch, seq])`` in the model's dtype, from ``seed``."""
    import torch
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, cfg.seq_len, cfg.hidden, generator=g, dtype=cfg.torch_dtype)
    return x, torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=g)


class _Done:
    """The handle of an all-reduce that was never started."""

    def wait(self, *args, **kwargs):
        return True

    def is_completed(self):
        return True


def silent_registry(lab):
    """A registry of ``lab`` whose ``start`` communicates nothing (Domino, no communication)."""
    class Silent(lab.HandleRegistry):
        def start(self, key, tensor):
            self.put(key, _Done())
    return Silent()


def training_step(lab, m, x, targets, variant: str, *, p: int = 4, step: int = 0,
                  lookahead: int = 1) -> None:
    """One training step of ``variant`` (see the module docstring), then zero the gradients."""
    silent = variant == "no_comm_domino"
    lab.train_step(m, x, targets, variant="domino" if silent else variant, p=p, step=step,
                   lookahead=lookahead, registry=silent_registry(lab) if silent else None)
    m.zero_grad()


# --------------------------------------------------------------------------- the lesson's round
def measure(impl, model: dict, batch: int, p: int, preset: str, run_dir: str,
            variants=("vanilla_tp", "no_comm", "domino")) -> dict:
    """On every rank: recalibrate, then two rounds of one step per variant, a warm-up and one
    under the profiler (``run_dir/VARIANT``). Returns ``{variant: ms, "local_flops": rate}``."""
    import torch.distributed as dist

    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig
    from workbook.tp_stack import TPStack
    from workbook.trace.capture import rank_trace
    lab = load_lab("domino", impl)
    cfg = ModelConfig(**model)
    x, targets = inputs(cfg, batch)
    m = TPStack(cfg, dist.get_rank(), dist.get_world_size())
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
    from workbook.lessons import on_ranks
    run_dir = Path(tempfile.mkdtemp(prefix="lesson6-"))
    res = on_ranks(measure, ranks, impl, model, batch, p, preset, str(run_dir), link=preset,
                   timeout=timeout)
    return res, run_dir


# --------------------------------------------------------------------------- the benchmarks' step
def profiled_step(step, tdir, rank: int, lab: str):
    """``step()`` after a barrier, inside the profiler (traces in ``tdir``): ``(elapsed ms, the
    link ops it issued, this rank's trace)``. Shared by the model benchmarks."""
    import torch.distributed as dist

    from workbook import link, trace
    from workbook.trace.capture import rank_trace
    sync = _synchronize()
    dist.barrier()
    since = len(link.op_log())
    with rank_trace(tdir, lab=lab):
        sync()
        t0 = time.perf_counter()
        step()
        sync()                                  # on a GPU: until its last kernel has run
        elapsed = (time.perf_counter() - t0) * 1e3
    ops = [r for r in link.op_log()[since:] if r.op != "barrier"]
    return elapsed, ops, trace.load_trace(Path(tdir) / f"rank{rank}.trace.json")


def _synchronize():
    """``torch.cuda.synchronize`` on a rank whose tensors live on a GPU (kernels run after the
    host launched them: a step's time is until the last one ends), else nothing."""
    import torch
    from workbook.trace.capture import rank_device
    return torch.cuda.synchronize if rank_device().type == "cuda" else (lambda: None)


def overlap_fields(t, ops) -> dict:
    """A step's exposed communication and the hidden share of each pass, from its trace."""
    from workbook import trace
    out = {"exposed_comm_ms": trace.overlap(t).exposed_comm_us / 1e3}
    for phase, key in (("forward", "overlap_fwd_pct"), ("backward", "overlap_bwd_pct")):
        out[key] = trace.overlap_pct(t, within=phase) if ops else None
    return out


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


# --------------------------------------------------------------------------- is the lab usable?
def agrees(impl) -> str:
    """On every rank: ``"ok"`` if the lab's Domino step equals vanilla TP's (fp64, tiny model,
    loss and every gradient), else what went wrong."""
    import torch.distributed as dist

    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig
    from workbook.tp_stack import TPStack
    lab = load_lab("domino", impl)
    cfg = ModelConfig(hidden=32, heads=4, ffn_hidden=64, n_layers=2, seq_len=8, vocab_size=32,
                      dropout=0.1, dtype="float64")
    x, t = inputs(cfg, 8, seed=1)
    try:
        m = TPStack(cfg, dist.get_rank(), dist.get_world_size())
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


def save_outputs(result: dict, json_path=None, html_path=None, make_figure=None) -> None:
    """A model benchmark's ``--json`` (the result, indented) and ``--figure`` (plotly HTML from
    ``make_figure(result)``), each written only when its path is given (folders made)."""
    import json
    from pathlib import Path
    for path, write in ((json_path, lambda p: p.write_text(json.dumps(result, indent=2) + "\n")),
                        (html_path, lambda p: make_figure(result).write_html(p))):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            write(Path(path))
