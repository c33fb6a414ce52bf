"""What the tp, sp and tp_overlap graders share: inputs, the cases run on ranks, the single-device
reference, and the comparisons (with the pattern of a traced block and the divisibility errors).

Each grader runs every part of a lab (linears, MLP, attention, block, model) on 1-4 ranks for
several configs (a case each: ``run_case``), brings each rank's outputs and gradient pieces back,
and compares each piece with the matching piece of the single-device reference
(``workbook.model``): a *layout* says which piece a rank holds -- ``None`` (the whole tensor),
``"seq"`` (its positions, dim 1) or ``"last"`` (its slice of the last dim); parameters are cut by
their shard spec.

Tolerances: fp64 rtol 1e-9 / atol 1e-12 (sums in another order differ by a few ulps); fp32
rtol 1e-4 / atol 1e-6.

Devices: ``randn`` and ``ints`` draw on the CPU, because the reference uses the same draws in the
judging process (on a GPU rank too, under torchrun); the rank side moves its pieces to the rank's
device (``dev``, ``workbook.runtime.ranks.device()``: a GPU rank's collectives take no CPU
tensor), and ``to_cpu`` brings the results back before they are judged.
"""
from __future__ import annotations

import traceback

import torch

from workbook.grading.checks import assert_equal_on_rank

B = 2                                            # batch of every case
STEP = 3                                         # dropout step of the block and model cases


# --------------------------------------------------------------------------- inputs
def configs(n: int) -> list:
    """``(tag, ModelConfig)`` pairs graded on n ranks: gpt with dropout and llama, fp64 and
    fp32; shapes that are not powers of two on 3 ranks (and once on 2)."""
    from workbook.model import ModelConfig
    base = dict(n_layers=2)
    default = [("gpt fp64", ModelConfig(dtype="float64", dropout=0.1, **base)),
               ("llama fp64", ModelConfig(style="llama", dtype="float64", **base)),
               ("gpt fp32", ModelConfig(dtype="float32", dropout=0.1, **base))]
    odd = [("gpt fp64 odd shapes", ModelConfig.odd_shapes(dtype="float64", dropout=0.1, **base)),
           ("llama fp64 odd shapes", ModelConfig.odd_shapes(style="llama", dtype="float64", **base)),
           ("gpt fp32 odd shapes", ModelConfig.odd_shapes(dtype="float32", dropout=0.1, **base))]
    return odd if n == 3 else default + odd[:1] if n == 2 else default


def tolerance(cfg) -> dict:
    return dict(rtol=1e-9, atol=1e-12) if cfg.dtype == "float64" else dict(rtol=1e-4, atol=1e-6)


def randn(lab: str, shape, dtype, *seed) -> torch.Tensor:
    """A normal tensor that every rank and the reference draw alike (seeded by name)."""
    from workbook.model import stable_seed
    g = torch.Generator().manual_seed(stable_seed(f"grading-{lab}", *seed))
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def ints(lab: str, shape, *seed) -> torch.Tensor:
    """Integer-valued fp64 (sums of them are exact in any order: the ops are checked exactly)."""
    from workbook.model import stable_seed
    g = torch.Generator().manual_seed(stable_seed(f"grading-{lab}-ints", *seed))
    return torch.randint(-20, 21, shape, generator=g).double()


def sequence_parallel_linears(cfg, column: str, row: str) -> list:
    """The parallel linears a sequence-parallel lab is graded on (sp, tp_overlap), ``column``
    and ``row`` naming the lab's two kinds: ``(label, reference name, in, out, kind, input
    layout, output layout)``."""
    H, F = cfg.hidden, cfg.ffn_hidden
    up, down = ("fc1", "fc2") if cfg.style == "gpt" else ("w_up", "w_down")
    return [(column, f"blocks.1.mlp.{up}", H, F, "column", "seq", "last"),
            (row, f"blocks.1.mlp.{down}", F, H, "row", "last", "seq"),
            (row, "blocks.0.attn.wo", H, H, "row", "last", "seq")]


def cut(t: torch.Tensor, layout, rank: int, n: int) -> torch.Tensor:
    """Rank ``rank``'s piece of ``t`` under ``layout`` (None, ``"seq"`` or ``"last"``)."""
    if layout is None:
        return t
    return t.chunk(n, dim={"seq": 1, "last": -1}[layout])[rank].contiguous()


# --------------------------------------------------------------------------- rank side
def rank_error(exc: BaseException) -> dict:
    """What a rank reports when a part raised: graded by that part's test."""
    if isinstance(exc, NotImplementedError):
        return {"not_implemented": str(exc)}
    return {"error": f"{type(exc).__name__}: {exc}",
            "traceback": "".join(traceback.format_exception(exc))[-2500:]}


def to_cpu(obj):
    """Tensors moved to the CPU, recursively (results travel back to the grading process)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def grads(module) -> dict:
    """``{reference name: gradient}`` of a module's parameters."""
    from workbook.model import grads_by_name
    return grads_by_name(module)


def run_case(lab: str, tag: str, cfg, rank: int, n: int, dev, *, seed: str, module, forward,
             label: str, features=None, layouts=(None, None), sync=None, **extra) -> dict:
    """One case of a part on one rank: the reference's input and output gradient (drawn for
    ``lab``, ``tag`` and ``seed``; ``features``: their last dims, by default the hidden size)
    cut to this rank's pieces by ``layouts`` (input, output), ``y = forward(x)``,
    ``y.backward(dy)``, then ``sync(module)`` when given (the gradient sync of sequence-parallel
    parameters). What ``check_part`` reads: ``{"label", "out", "grad_in", "grads", "in",
    "out_layout"}`` and ``extra``."""
    (fin, fout), (lin, lout) = features or (cfg.hidden, cfg.hidden), layouts
    S, dt = cfg.seq_len, cfg.torch_dtype
    x = cut(randn(lab, (B, S, fin), dt, tag, seed, "x"), lin, rank, n).to(dev).requires_grad_()
    y = forward(x)
    y.backward(cut(randn(lab, (B, S, fout), dt, tag, seed, "dy"), lout, rank, n).to(dev))
    if sync is not None:
        sync(module)
    return {"label": label, **extra, "out": y.detach(), "grad_in": x.grad, "grads": grads(module),
            "in": lin, "out_layout": lout}


def build_error(build) -> dict | None:
    """None if ``build()`` succeeds, else what it raised (for the divisibility tests)."""
    try:
        build()
        return None
    except NotImplementedError as exc:
        return {"not_implemented": str(exc)}
    except Exception as exc:                   # noqa: BLE001 - graded by the divisibility test
        return {"type": type(exc).__name__, "message": str(exc)}


def build_errors(good, bad: dict, config: str) -> dict:
    """For the divisibility test: what ``good()`` (a build with shapes that split) raised, and
    what each build of ``bad`` (``{class name: build}``, shapes that do not split, named by
    ``config``) raised; ``build_error`` for each."""
    return {"config": config, "good": build_error(good),
            "bad": {name: build_error(build) for name, build in bad.items()}}


def run_every_part(lab, run_ops, parts: dict, skip=lambda part, tag: False) -> dict:
    """On one rank: ``run_ops(lab, rank, n, dev)`` under ``"ops"`` and each runner of ``parts``
    (``{part: run(lab, tag, cfg, rank, n, dev)}``) on every config, under ``(part, tag)``; what
    raised is kept as ``rank_error`` for that part's test to report."""
    import torch.distributed as dist
    from workbook.runtime.launch import device
    rank, n, dev = dist.get_rank(), dist.get_world_size(), device()
    res: dict = {}
    try:
        res["ops"] = run_ops(lab, rank, n, dev)
    except Exception as exc:                   # noqa: BLE001 - graded by the ops test
        res["ops"] = rank_error(exc)
    for tag, cfg in configs(n):
        for part, run in parts.items():
            if skip(part, tag):
                continue
            try:
                res[(part, tag)] = run(lab, tag, cfg, rank, n, dev)
            except Exception as exc:           # noqa: BLE001 - graded by that part's test
                res[(part, tag)] = rank_error(exc)
    return res


def run_traced_block(lab_name: str, trace_dir: str, block_class: str, layout=None,
                     variant: str | None = None) -> dict:
    """On every rank: one block of the lab inside a profiler trace, each phase in a
    ``record_function`` range -- forward, backward and, when the lab has one, the gradient sync
    of sequence-parallel parameters. ``layout``: the piece of ``[B, S, H]`` a rank feeds it;
    ``variant``: a key of the lab's ``VARIANTS``, passed to the block (tp_overlap).
    Returns the collectives per phase from the trace and from the flight recorder."""
    from pathlib import Path

    import torch.distributed as dist
    from workbook import trace
    from workbook.runtime.flight import RECORDER
    from workbook.grading.labs import load_lab
    from workbook.grading.traffic_link import untimed_link
    from workbook.runtime.launch import device
    from workbook.model import ModelConfig
    from workbook.trace.capture import rank_trace
    lab = load_lab(lab_name)
    rank, n, dev = dist.get_rank(), dist.get_world_size(), device()
    cfg = ModelConfig(n_layers=2, dropout=0.1) if n != 3 else ModelConfig.odd_shapes(n_layers=2)
    shape = (B, cfg.seq_len, cfg.hidden)
    x = cut(randn(lab_name, shape, cfg.torch_dtype, "trace", "x"), layout, rank, n).to(dev)
    dy = cut(randn(lab_name, shape, cfg.torch_dtype, "trace", "dy"), layout, rank, n).to(dev)
    calls = {}
    try:
        extra = () if variant is None else (lab.VARIANTS[variant],)
        block = getattr(lab, block_class)(cfg, 0, dev, *extra)
        steps = {"forward": lambda _: block(x.requires_grad_(), step=1),
                 "backward": lambda y: y.backward(dy)}
        if hasattr(lab, "sync_sequence_parallel_grads"):
            steps["grad_sync"] = lambda _: lab.sync_sequence_parallel_grads(block)
        dist.barrier()
        with untimed_link(), rank_trace(trace_dir, lab=lab_name):   # counted, not timed
            out = None
            for phase, step in steps.items():
                RECORDER.reset()
                with torch.profiler.record_function(phase):
                    out = step(out)
                calls[phase] = [(c.name, c.size_bytes) for c in RECORDER.calls]
    except NotImplementedError as exc:
        return {"not_implemented": str(exc)}
    t = trace.load_trace(Path(trace_dir) / f"rank{rank}.trace.json")
    return {"elements": B * cfg.seq_len * cfg.hidden, "elsize": x.element_size(),
            "trace": {p: trace.collectives(t, within=p) for p in ("forward", "backward")},
            "recorder": calls}


# --------------------------------------------------------------------------- test side
def ranks_label(n: int) -> str:
    return "1 rank" if n == 1 else f"{n} ranks"


def raise_if_failed(entry, rank: int, n: int, what: str) -> None:
    if isinstance(entry, dict) and "not_implemented" in entry:
        raise NotImplementedError(entry["not_implemented"])
    if isinstance(entry, dict) and "error" in entry:
        raise AssertionError(f"rank {rank}: {what} on {ranks_label(n)} raised {entry['error']}\n"
                             f"{entry['traceback']}")


def traced_block_phases(lab: str, n: int, trace_dir, block_class: str, layout=None,
                        variant: str | None = None, *, timeout: float):
    """One block of the lab traced on ``n`` ranks (``run_traced_block``, over the simulated link;
    none on NCCL): ``(rank, its result, phase, the phase's collectives from the trace, where)``
    for every rank, forward then backward, after failing on a rank that raised."""
    from workbook.grading.engine import on_ranks, simulated_link
    label = block_class + (f" [{variant}]" if variant else "")
    res = on_ranks(n, run_traced_block, lab, str(trace_dir), block_class, layout, variant,
                   link=simulated_link(n), timeout=timeout, key=f"trace:{trace_dir}")
    for rank, r in enumerate(res):
        raise_if_failed(r, rank, n, f"the traced {label}")
        for phase in ("forward", "backward"):
            yield rank, r, phase, r["trace"][phase], \
                f"{label} {phase} on {ranks_label(n)} (from the trace)"


def check_divisibility(results, sizes, *, model: str, names: str, why: str, fix: str) -> None:
    """On each world size of ``sizes``, every rank's ``results(n)[rank]["divisibility"]``
    (``build_errors``): ``model`` built with shapes that split, and each build with shapes that do
    not raised a one-line ValueError naming ``names``. ``why``: what does not divide by tp, in the
    message (``{config}``: the shapes); ``fix``: how to raise the error; both may hold ``{n}``."""
    from workbook.grading.engine import world_sizes
    for n in world_sizes(*sizes):
        for rank, res in enumerate(results(n)):
            info = res["divisibility"]
            good, named = info["good"], names.format(n=n)
            if good and "not_implemented" in good:
                raise NotImplementedError(good["not_implemented"])
            if good:
                raise AssertionError(f"rank {rank}: {model} with shapes that split over tp={n} "
                                     f"raised {good['type']}: {good['message']}")
            for what, err in info["bad"].items():
                if err and "not_implemented" in err:
                    raise NotImplementedError(err["not_implemented"])
                where = f"rank {rank}: {what}({info['config']}) on {ranks_label(n)}"
                if err is None:
                    raise AssertionError(f"{where} was built, but "
                                         f"{why.format(config=info['config'], n=n)} by tp={n}: "
                                         f"raise a ValueError ({fix.format(n=n)})")
                if err["type"] != "ValueError" or "\n" in err["message"] or \
                        named not in err["message"]:
                    raise AssertionError(f"{where} raised {err['type']}: {err['message']!r}; "
                                         f"expected a one-line ValueError that names {named}")


def compare(got, expected, *, rank: int, what: str, rtol: float, atol: float) -> None:
    assert_equal_on_rank(got, expected, rank=rank, what=what, rtol=rtol, atol=atol,
                         against="the reference")


def check_ops(n: int, per_rank: list, expected) -> None:
    """The communication ops, exactly: ``expected(rank)`` gives ``{op: (output, gradient of
    the input)}`` for integer-valued inputs (their sums are exact in any order)."""
    for rank, res in enumerate(per_rank):
        raise_if_failed(res["ops"], rank, n, "the communication ops")
        want = expected(rank)
        for case in res["ops"]:
            out, grad = want[case["op"]]
            where = f"{case['op']} on {ranks_label(n)}"
            compare(case["out"], out, rank=rank, what=f"{where}: forward output", rtol=0, atol=0)
            compare(case["grad"], grad, rank=rank, what=f"{where}: gradient of the input",
                    rtol=0, atol=0)


_REFERENCES: dict = {}


def reference(lab: str, part: str, tag: str, cfg, linears: list):
    """The reference results of one part (cached): ``{name: RunResult}`` for ``"linear"`` (one
    per entry of ``linears``: ``(label, name, in, out, ...)``), a ``RunResult`` for ``"mlp"``,
    ``"attn"`` and ``"block"`` (of layer 1), ``(loss, {name: grad})`` for ``"model"``."""
    from workbook.model import MLP, Attention, Block, Linear, ReferenceModel, grads_by_name, \
        make_batch, run_reference
    key = (lab, part, tag)
    if key not in _REFERENCES:
        S, H, dt = cfg.seq_len, cfg.hidden, cfg.torch_dtype
        if part == "linear":
            ref = {name: run_reference(Linear(cfg, name, fin, fout), randn(lab, (B, S, fin), dt, tag, name, "x"),
                                       randn(lab, (B, S, fout), dt, tag, name, "dy"))
                   for _, name, fin, fout, *_ in linears}
        elif part in ("mlp", "attn", "block"):
            module = {"mlp": lambda: MLP(cfg, "blocks.1.mlp"), "attn": lambda: Attention(cfg, "blocks.1.attn"),
                      "block": lambda: Block(cfg, 1)}[part]()
            ref = run_reference(module, randn(lab, (B, S, H), dt, tag, part, "x"),
                                randn(lab, (B, S, H), dt, tag, part, "dy"),
                                **({"step": STEP} if part == "block" else {}))
        else:
            model = ReferenceModel(cfg)
            tokens, targets = make_batch(cfg, B, seed=5)
            loss = model(tokens, targets, step=STEP)
            loss.backward()
            ref = (loss.detach(), grads_by_name(model))
        _REFERENCES[key] = ref
    return _REFERENCES[key]


def check_grads(got: dict, expected: dict, *, rank: int, n: int, where: str, tol: dict,
                synced: bool = False) -> None:
    """Each parameter gradient against rank ``rank``'s piece of the reference's. ``synced``:
    replicated gradients were summed over the ranks after backward (sequence parallelism)."""
    from workbook.model import shard_spec, slice_for_rank
    missing = sorted(set(expected) - set(got))
    if missing:
        raise AssertionError(f"rank {rank}: {where}: no parameter named {missing[0]} (parameter "
                             f"names must match the reference's; have {sorted(got)[:6]}...)")
    for name, full in expected.items():
        spec = shard_spec(name)
        how = "replicated" if spec.kind == "replicated" else f"rank {rank}'s {spec.kind} slice"
        if synced and spec.kind == "replicated" and n > 1 and not name.startswith("head"):
            how += ", synchronised after backward"
        if got[name] is None:
            raise AssertionError(f"rank {rank}: {where}: the gradient of {name} is missing (None): "
                                 f"is the parameter used, and does the gradient reach it?")
        compare(got[name], slice_for_rank(full, spec, rank, n), rank=rank,
                what=f"{where}: gradient of {name} ({how})", **tol)


def check_part(lab: str, part: str, results, linears, synced: bool = False,
               sizes=(1, 2, 3, 4)) -> None:
    """Every case of ``part`` on every rank, on each world size of ``sizes``, against the
    reference. ``results(n)``: one result dict per rank on n ranks; a case is ``{"label", "out",
    "grads"}`` plus, except for the model, ``"grad_in"`` and the layouts ``"in"`` and
    ``"out_layout"`` of input and output."""
    from workbook.grading.engine import world_sizes
    for n in world_sizes(*sizes):
        per_rank = results(n)
        for tag, cfg in configs(n):
            tol = tolerance(cfg)
            for rank, res in enumerate(per_rank):
                entry = res[(part, tag)]
                raise_if_failed(entry, rank, n, f"{part} ({tag})")
                ref = reference(lab, part, tag, cfg, linears(cfg))
                for case in entry:
                    where = f"{case['label']} ({tag}, tp={n})"
                    if part == "model":
                        loss, grads = ref
                        compare(case["out"], loss, rank=rank, what=f"{where}: loss", **tol)
                        check_grads(case["grads"], grads, rank=rank, n=n, where=where, tol=tol,
                                    synced=synced)
                        continue
                    r = ref[case["name"]] if part == "linear" else ref
                    compare(case["out"], cut(r.out, case["out_layout"], rank, n), rank=rank,
                            what=f"{where}: output", **tol)
                    compare(case["grad_in"], cut(r.grad_input, case["in"], rank, n), rank=rank,
                            what=f"{where}: gradient of the input", **tol)
                    check_grads(case["grads"], r.grads, rank=rank, n=n, where=where, tol=tol,
                                synced=synced)
