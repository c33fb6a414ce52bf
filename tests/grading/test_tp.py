"""Autograder for lab 4, ``tp``: Megatron tensor parallelism against the single-device reference.

One batched run per world size (1, 2, 3, 4) on a warm rank pool builds every part of the lab
under test (the conjugate ops, the parallel linears, MLP, attention, block, model) for several
configs (gpt with dropout and llama, fp64 and fp32, shapes that are not powers of two on 3
ranks) and returns each rank's outputs and gradient pieces. The reference runs once per config
in this process; each rank's piece is compared with the matching slice of the reference
(``workbook.model.shard_spec``). A second, traced run on a simulated link reads the block's
collectives per phase from the PyTorch-profiler trace.

Tolerances: fp64 rtol 1e-9 / atol 1e-12 (sums in another order differ by a few ulps); fp32
rtol 1e-4 / atol 1e-6.
"""
from __future__ import annotations

import os
import traceback

import pytest
import torch

from workbook.grading.engine import on_ranks, world_sizes

TIMEOUT_S = 120.0
B = 2                                            # batch of every case
STEP = 3                                         # dropout step of the block and model cases


# --------------------------------------------------------------------------- configs
def _configs(n: int) -> list:
    """(tag, ModelConfig) pairs graded on n ranks."""
    from workbook.model import ModelConfig
    base = dict(n_layers=2)
    default = [("gpt fp64", ModelConfig(dtype="float64", dropout=0.1, **base)),
               ("llama fp64", ModelConfig(style="llama", dtype="float64", **base)),
               ("gpt fp32", ModelConfig(dtype="float32", dropout=0.1, **base))]
    odd = [("gpt fp64 odd shapes", ModelConfig.odd_shapes(dtype="float64", dropout=0.1, **base)),
           ("llama fp64 odd shapes", ModelConfig.odd_shapes(style="llama", dtype="float64", **base)),
           ("gpt fp32 odd shapes", ModelConfig.odd_shapes(dtype="float32", dropout=0.1, **base))]
    if n == 3:
        return odd
    if n == 2:
        return default + odd[:1]
    return default


def _tol(cfg) -> dict:
    return dict(rtol=1e-9, atol=1e-12) if cfg.dtype == "float64" else dict(rtol=1e-4, atol=1e-6)


def _randn(shape, dtype, *seed) -> torch.Tensor:
    from workbook.model import stable_seed
    g = torch.Generator().manual_seed(stable_seed("grading-tp", *seed))
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def _ints(shape, *seed) -> torch.Tensor:
    from workbook.model import stable_seed
    g = torch.Generator().manual_seed(stable_seed("grading-tp-ints", *seed))
    return torch.randint(-20, 21, shape, generator=g).double()


# Parallel linears graded: (label, reference name, in, out, kind, options)
def _linears(cfg):
    H, F = cfg.hidden, cfg.ffn_hidden
    return [("ColumnParallelLinear", "blocks.1.mlp.fc1" if cfg.style == "gpt" else "blocks.1.mlp.w_up",
             H, F, "column", {"gather_output": False}),
            ("ColumnParallelLinear(gather_output=True)", "blocks.0.attn.wq", H, H, "column",
             {"gather_output": True}),
            ("RowParallelLinear", "blocks.1.mlp.fc2" if cfg.style == "gpt" else "blocks.1.mlp.w_down",
             F, H, "row", {"input_is_parallel": True}),
            ("RowParallelLinear(input_is_parallel=False)", "blocks.0.attn.wo", H, H, "row",
             {"input_is_parallel": False})]


# --------------------------------------------------------------------------- rank side
def _error(exc: BaseException) -> dict:
    if isinstance(exc, NotImplementedError):
        return {"not_implemented": str(exc)}
    return {"error": f"{type(exc).__name__}: {exc}",
            "traceback": "".join(traceback.format_exception(exc))[-2500:]}


def _last_slice(t: torch.Tensor, rank: int, n: int) -> torch.Tensor:
    return t.chunk(n, dim=-1)[rank].contiguous()


def _run_ops(lab, rank, n, dev) -> list[dict]:
    """The four conjugate ops on integer-valued fp64 tensors (exact in any summation order)."""
    shape = (B, 4, 6 * n)
    out = []
    x_full = _ints(shape, "x").to(dev).requires_grad_()
    y = lab.copy_to_tensor_parallel_region(x_full)
    y.backward(_ints(shape, "g", rank).to(dev))
    out.append({"op": "copy_to_tensor_parallel_region", "out": y.detach(), "grad": x_full.grad})
    x_r = _ints(shape, "x", rank).to(dev).requires_grad_()
    y = lab.reduce_from_tensor_parallel_region(x_r)
    y.backward(_ints(shape, "g").to(dev))
    out.append({"op": "reduce_from_tensor_parallel_region", "out": y.detach(), "grad": x_r.grad})
    x_full = _ints(shape, "x").to(dev).requires_grad_()
    y = lab.scatter_to_tensor_parallel_region(x_full)
    y.backward(_ints((B, 4, 6), "g", rank).to(dev))
    out.append({"op": "scatter_to_tensor_parallel_region", "out": y.detach(), "grad": x_full.grad})
    x_r = _ints((B, 4, 6), "x", rank).to(dev).requires_grad_()
    y = lab.gather_from_tensor_parallel_region(x_r)
    y.backward(_ints(shape, "g").to(dev))
    out.append({"op": "gather_from_tensor_parallel_region", "out": y.detach(), "grad": x_r.grad})
    return out


def _grads(module) -> dict:
    from workbook.model import grads_by_name
    return grads_by_name(module)


def _run_part(lab, part: str, tag: str, cfg, rank: int, n: int, dev) -> list[dict]:
    from workbook.flight import RECORDER
    from workbook.model import make_batch
    S, H, dt = cfg.seq_len, cfg.hidden, cfg.torch_dtype
    cases = []
    if part == "linear":
        for label, name, fin, fout, kind, opts in _linears(cfg):
            x = _randn((B, S, fin), dt, tag, name, "x").to(dev)
            dy = _randn((B, S, fout), dt, tag, name, "dy").to(dev)
            cls = lab.ColumnParallelLinear if kind == "column" else lab.RowParallelLinear
            layer = cls(cfg, name, fin, fout, device=dev, **opts)
            in_local = kind == "row" and opts["input_is_parallel"]
            out_local = kind == "column" and not opts["gather_output"]
            xin = (_last_slice(x, rank, n) if in_local else x).requires_grad_()
            y = layer(xin)
            y.backward(_last_slice(dy, rank, n) if out_local else dy)
            cases.append({"label": label, "name": name, "out": y.detach(), "grad_in": xin.grad,
                          "grads": _grads(layer), "in_local": in_local, "out_local": out_local})
        return cases
    if part in ("mlp", "attn", "block"):
        cls = {"mlp": lab.TPMLP, "attn": lab.TPAttention, "block": lab.TPBlock}[part]
        module = cls(cfg, 1, dev)
        x = _randn((B, S, H), dt, tag, part, "x").to(dev).requires_grad_()
        dy = _randn((B, S, H), dt, tag, part, "dy").to(dev)
        kwargs = {"step": STEP} if part == "block" else {}
        RECORDER.reset()
        y = module(x, **kwargs)
        fwd = RECORDER.counts()
        RECORDER.reset()
        y.backward(dy)
        bwd = RECORDER.counts()
        cases.append({"label": cls.__name__, "out": y.detach(), "grad_in": x.grad,
                      "grads": _grads(module), "calls": {"forward": fwd, "backward": bwd}})
        return cases
    if part == "model":
        model = lab.TPModel(cfg, dev)
        tokens, targets = make_batch(cfg, B, seed=5, device=dev)
        big = []                                   # saved activations as wide as the vocabulary

        def pack(t):
            if t.dim() >= 2 and t.shape[-1] == cfg.vocab_size and t.numel() >= B * S * cfg.vocab_size:
                big.append(tuple(t.shape))
            return t

        RECORDER.reset()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(tokens, targets, step=STEP)
        fwd = [(c.name, c.size_bytes, str(c.shapes[:1])) for c in RECORDER.calls]
        RECORDER.reset()
        loss.backward()
        bwd = [(c.name, c.size_bytes, str(c.shapes[:1])) for c in RECORDER.calls]
        cases.append({"label": "TPModel", "out": loss.detach(), "grads": _grads(model),
                      "calls": {"forward": fwd, "backward": bwd}, "full_logits": big})
        return cases
    raise ValueError(part)


PARTS = ("linear", "mlp", "attn", "block", "model")


def _cpu(obj):
    """Tensors moved to the CPU, recursively (results travel back to the grading process)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu(v) for v in obj)
    return obj


def _run_all() -> dict:
    """On every rank: every part of the lab on every config of this world size."""
    import torch.distributed as dist
    from workbook.grading.labs import load_lab
    from workbook.launch import device
    lab = load_lab("tp")
    rank, n, dev = dist.get_rank(), dist.get_world_size(), device()
    res: dict = {}
    try:
        res["ops"] = _run_ops(lab, rank, n, dev)
    except Exception as exc:                   # noqa: BLE001 - graded by the ops test
        res["ops"] = _error(exc)
    for tag, cfg in _configs(n):
        for part in PARTS:
            try:
                res[(part, tag)] = _run_part(lab, part, tag, cfg, rank, n, dev)
            except Exception as exc:           # noqa: BLE001 - graded by that part's test
                res[(part, tag)] = _error(exc)
    if n > 1:                                  # the divisibility error: shapes that do not split
        from workbook.model import ModelConfig
        good = ModelConfig() if n == 4 else ModelConfig.odd_shapes()
        bad = ModelConfig.odd_shapes() if n == 4 else ModelConfig()
        errors = {}
        try:                                   # shapes that do split must build
            lab.TPModel(good, dev)
            res["builds"] = None
        except NotImplementedError as exc:
            res["builds"] = {"not_implemented": str(exc)}
        except Exception as exc:               # noqa: BLE001
            res["builds"] = {"type": type(exc).__name__, "message": str(exc)}
        for what in ("TPModel", "TPAttention", "TPMLP"):
            try:
                getattr(lab, what)(bad) if what == "TPModel" else getattr(lab, what)(bad, 0)
                errors[what] = None
            except NotImplementedError as exc:
                errors[what] = {"not_implemented": str(exc)}
            except Exception as exc:           # noqa: BLE001
                errors[what] = {"type": type(exc).__name__, "message": str(exc)}
        res["divisibility"] = {"config": repr(bad), "errors": errors}
    return _cpu(res)


def _run_traced(trace_dir: str) -> dict:
    """On every rank: one TPBlock forward and backward inside a profiler trace."""
    from pathlib import Path

    import torch.distributed as dist
    from workbook import trace
    from workbook.flight import RECORDER
    from workbook.grading.labs import load_lab
    from workbook.launch import device
    from workbook.model import ModelConfig
    from workbook.trace.capture import rank_trace
    lab = load_lab("tp")
    rank, n, dev = dist.get_rank(), dist.get_world_size(), device()
    cfg = ModelConfig(n_layers=2, dropout=0.1) if n != 3 else ModelConfig.odd_shapes(n_layers=2)
    try:
        block = lab.TPBlock(cfg, 0, dev)
    except NotImplementedError as exc:
        return {"not_implemented": str(exc)}
    x = _randn((B, cfg.seq_len, cfg.hidden), cfg.torch_dtype, "trace", "x").to(dev).requires_grad_()
    dy = _randn((B, cfg.seq_len, cfg.hidden), cfg.torch_dtype, "trace", "dy").to(dev)
    dist.barrier()
    sizes = {}
    with rank_trace(trace_dir, lab="tp"):
        for phase in ("forward", "backward"):
            RECORDER.reset()
            with torch.profiler.record_function(phase):
                if phase == "forward":
                    y = block(x, step=1)
                else:
                    y.backward(dy)
            sizes[phase] = [(c.name, c.size_bytes) for c in RECORDER.calls]
    t = trace.load_trace(Path(trace_dir) / f"rank{rank}.trace.json")
    return {"elements": B * cfg.seq_len * cfg.hidden, "elsize": x.element_size(),
            "trace": {p: trace.collectives(t, within=p) for p in ("forward", "backward")},
            "recorder": sizes}


# --------------------------------------------------------------------------- test side
_REFS: dict = {}


def _ranks(n):
    return "1 rank" if n == 1 else f"{n} ranks"


def _pool_run(key, n, fn, *args, link="none"):
    return on_ranks(n, fn, *args, link=link, timeout=TIMEOUT_S, key=key)


def _results(n):
    return _pool_run("numerics", n, _run_all)


def _raise_if_failed(entry, rank, n, what):
    if isinstance(entry, dict) and "not_implemented" in entry:
        raise NotImplementedError(entry["not_implemented"])
    if isinstance(entry, dict) and "error" in entry:
        raise AssertionError(f"rank {rank}: {what} on {_ranks(n)} raised {entry['error']}\n"
                             f"{entry['traceback']}")


def _compare(got, expected, *, rank, what, rtol, atol):
    """Fail with rank, tensor and first differing element unless got ~ expected."""
    if got is None:
        raise AssertionError(f"rank {rank}: {what} is missing (None): is the parameter used, "
                             f"and does the gradient reach it?")
    if tuple(got.shape) != tuple(expected.shape):
        raise AssertionError(f"rank {rank}: {what} has shape {tuple(got.shape)}, expected "
                             f"{tuple(expected.shape)}")
    g, e = got.detach().cpu().double().reshape(-1), expected.detach().cpu().double().reshape(-1)
    close = torch.isclose(g, e, rtol=rtol, atol=atol)
    if bool(close.all()):
        return
    bad = (~close).nonzero().reshape(-1)
    i = int(bad[0])
    worst = float((g - e).abs().max())
    raise AssertionError(
        f"rank {rank}: {what} differs from the reference at flat index {i}: expected "
        f"{e[i].item():.6g}, got {g[i].item():.6g} ({len(bad)} of {e.numel()} elements differ, "
        f"max |diff| {worst:.3g}; tolerance rtol={rtol:g}, atol={atol:g})")


def _reference(part, tag, cfg):
    """The reference outputs and gradients of one part (cached per config)."""
    from workbook.model import Attention, Block, Linear, MLP, ReferenceModel, grads_by_name, \
        make_batch, run_reference
    key = (part, tag)
    if key in _REFS:
        return _REFS[key]
    S, H, dt = cfg.seq_len, cfg.hidden, cfg.torch_dtype
    if part == "linear":
        ref = {}
        for label, name, fin, fout, kind, opts in _linears(cfg):
            x = _randn((B, S, fin), dt, tag, name, "x")
            dy = _randn((B, S, fout), dt, tag, name, "dy")
            ref[label] = run_reference(Linear(cfg, name, fin, fout), x, dy)
    elif part in ("mlp", "attn", "block"):
        module = {"mlp": lambda: MLP(cfg, "blocks.1.mlp"), "attn": lambda: Attention(cfg, "blocks.1.attn"),
                  "block": lambda: Block(cfg, 1)}[part]()
        x = _randn((B, S, H), dt, tag, part, "x")
        dy = _randn((B, S, H), dt, tag, part, "dy")
        ref = run_reference(module, x, dy, **({"step": STEP} if part == "block" else {}))
    else:
        model = ReferenceModel(cfg)
        tokens, targets = make_batch(cfg, B, seed=5)
        loss = model(tokens, targets, step=STEP)
        loss.backward()
        ref = (loss.detach(), grads_by_name(model))
    _REFS[key] = ref
    return ref


def _check_grads(got: dict, expected: dict, *, rank, n, where, tol):
    from workbook.model import shard_spec, slice_for_rank
    missing = sorted(set(expected) - set(got))
    if missing:
        raise AssertionError(f"rank {rank}: {where}: no parameter named {missing[0]} (parameter "
                             f"names must match the reference's; have {sorted(got)[:6]}...)")
    for name, full in expected.items():
        spec = shard_spec(name)
        piece = slice_for_rank(full, spec, rank, n)
        how = "replicated" if spec.kind == "replicated" else f"rank {rank}'s {spec.kind} slice"
        _compare(got[name], piece, rank=rank, what=f"{where}: gradient of {name} ({how})", **tol)


def _check_part(part: str):
    for n in world_sizes(1, 2, 3, 4):
        results = _results(n)
        for tag, cfg in _configs(n):
            tol = _tol(cfg)
            for rank, res in enumerate(results):
                entry = res[(part, tag)]
                _raise_if_failed(entry, rank, n, f"{part} ({tag})")
                ref = _reference(part, tag, cfg)
                for case in entry:
                    where = f"{case['label']} ({tag}, tp={n})"
                    if part == "model":
                        loss, grads = ref
                        _compare(case["out"], loss, rank=rank, what=f"{where}: loss", **tol)
                        _check_grads(case["grads"], grads, rank=rank, n=n, where=where, tol=tol)
                        continue
                    r = ref[case["label"]] if part == "linear" else ref
                    out = _last_slice(r.out, rank, n) if case.get("out_local") else r.out
                    gin = _last_slice(r.grad_input, rank, n) if case.get("in_local") else r.grad_input
                    _compare(case["out"], out, rank=rank, what=f"{where}: output", **tol)
                    _compare(case["grad_in"], gin, rank=rank, what=f"{where}: gradient of the input",
                             **tol)
                    _check_grads(case["grads"], r.grads, rank=rank, n=n, where=where, tol=tol)


@pytest.mark.points(3)
def test_conjugate_ops():
    """f, g, scatter and gather: forward values and backward gradients, exactly."""
    for n in world_sizes(1, 2, 3, 4):
        for rank, res in enumerate(_results(n)):
            _raise_if_failed(res["ops"], rank, n, "the conjugate ops")
            shape = (B, 4, 6 * n)
            g_sum = sum(_ints(shape, "g", r) for r in range(n))
            x_sum = sum(_ints(shape, "x", r) for r in range(n))
            expected = {
                "copy_to_tensor_parallel_region": (_ints(shape, "x"), g_sum),
                "reduce_from_tensor_parallel_region": (x_sum, _ints(shape, "g")),
                "scatter_to_tensor_parallel_region": (
                    _last_slice(_ints(shape, "x"), rank, n),
                    torch.cat([_ints((B, 4, 6), "g", r) for r in range(n)], dim=-1)),
                "gather_from_tensor_parallel_region": (
                    torch.cat([_ints((B, 4, 6), "x", r) for r in range(n)], dim=-1),
                    _last_slice(_ints(shape, "g"), rank, n)),
            }
            for case in res["ops"]:
                out, grad = expected[case["op"]]
                where = f"{case['op']} on {_ranks(n)}"
                _compare(case["out"], out, rank=rank, what=f"{where}: forward output", rtol=0, atol=0)
                _compare(case["grad"], grad, rank=rank, what=f"{where}: gradient of the input",
                         rtol=0, atol=0)


@pytest.mark.points(3)
def test_parallel_linears():
    """Column- and row-parallel linears: outputs, input gradients and weight/bias gradient
    pieces; the row bias is added once, after the reduction."""
    _check_part("linear")


@pytest.mark.points(3)
def test_tp_mlp():
    _check_part("mlp")


@pytest.mark.points(3)
def test_tp_attention():
    _check_part("attn")


@pytest.mark.points(3)
def test_tp_block():
    """The whole pre-norm block with dropout (gpt) and without (llama)."""
    _check_part("block")


@pytest.mark.points(4)
def test_tp_model():
    """Vocab-parallel embedding, blocks, head and cross-entropy: the loss and every gradient."""
    _check_part("model")


def _ar_sizes(calls, name="all_reduce"):
    return [size for n, size, *_ in calls if n == name]


@pytest.mark.points(2)
def test_tp_model_collectives():
    """From the flight recorder: forward = 2 all-reduces of B*S*H per block + 1 (embedding)
    + a few small ones of B*S numbers (the cross-entropy); backward = 2 per block + 1 (the
    head's f); nothing else, and no rank holds logits as wide as the vocabulary."""
    for n in world_sizes(2, 3, 4):
        for tag, cfg in _configs(n):
            bsh = B * cfg.seq_len * cfg.hidden * cfg.torch_dtype.itemsize
            bs = B * cfg.seq_len * cfg.torch_dtype.itemsize
            L = cfg.n_layers
            for rank, res in enumerate(_results(n)):
                entry = res[("model", tag)]
                _raise_if_failed(entry, rank, n, f"model ({tag})")
                case = entry[0]
                where = f"TPModel ({tag}, tp={n})"
                for phase, want in (("forward", 2 * L + 1), ("backward", 2 * L + 1)):
                    calls = case["calls"][phase]
                    others = sorted({c[0] for c in calls} - {"all_reduce"})
                    if others:
                        raise AssertionError(f"rank {rank}: {where} {phase} called "
                                             f"{', '.join('dist.' + o for o in others)}; tensor "
                                             f"parallelism needs only all-reduces")
                    sizes = _ar_sizes(calls)
                    big = [s for s in sizes if s == bsh]
                    small = [s for s in sizes if s != bsh]
                    if len(big) != want:
                        raise AssertionError(
                            f"rank {rank}: {where} {phase}: expected {want} all-reduces of B*S*H = "
                            f"{bsh // cfg.torch_dtype.itemsize} elements (2 per block for "
                            f"{L} blocks + 1 for the "
                            f"{'embedding' if phase == 'forward' else 'head'}), got {len(big)}; "
                            f"all-reduce sizes in bytes: {sizes}")
                    limit = 0 if phase == "backward" else 3
                    if len(small) > limit or any(s > 2 * bs for s in small):
                        raise AssertionError(
                            f"rank {rank}: {where} {phase}: unexpected all-reduces of {small} bytes "
                            f"(the cross-entropy needs at most 3 of B*S = {bs // cfg.torch_dtype.itemsize} "
                            f"numbers in forward, none in backward)")
                if n > 1 and case["full_logits"]:
                    raise AssertionError(f"rank {rank}: {where} saved a tensor of shape "
                                         f"{case['full_logits'][0]} for backward: full logits; "
                                         f"keep the logits vocab-parallel ([B, S, V/n])")


@pytest.mark.points(3)
@pytest.mark.parametrize("n", [2, 3])
def test_tp_block_pattern_from_trace(n, tmp_path):
    """From the profiler trace of one block on a simulated link: exactly 2 all-reduces in
    forward and 2 in backward, each of B*S*H elements, and no other collective."""
    from workbook.ranks import choose_backend
    link = "dgx-h100" if choose_backend(None, n) == "gloo" else "none"    # no simulated link on NCCL
    res = _pool_run(f"trace:{tmp_path}", n, _run_traced, str(tmp_path), link=link)
    for rank, r in enumerate(res):
        _raise_if_failed(r, rank, n, "the traced TPBlock")
        bsh_bytes = r["elements"] * r["elsize"]
        for phase in ("forward", "backward"):
            got = r["trace"][phase]
            where = f"TPBlock {phase} on {_ranks(n)} (from the trace)"
            others = sorted(set(got) - {"all_reduce"})
            if others:
                listed = ", ".join(f"{got[o]['count']}x {o} ({got[o]['bytes']} bytes)" for o in others)
                raise AssertionError(f"rank {rank}: {where}: found {listed}; a TP block "
                                     f"communicates with all-reduces of activations only (2 of "
                                     f"B*S*H = {r['elements']} elements per phase), never weights")
            count = got.get("all_reduce", {}).get("count", 0)
            if count != 2:
                which = "g after attention and after the MLP" if phase == "forward" else \
                    "f before attention and before the MLP"
                raise AssertionError(f"rank {rank}: {where}: expected exactly 2 all_reduce, got "
                                     f"{count} ({which})")
            nbytes = got["all_reduce"]["bytes"]
            sizes = [s for name, s in r["recorder"][phase] if name == "all_reduce"]
            if (nbytes is not None and nbytes != 2 * bsh_bytes) or sizes != [bsh_bytes, bsh_bytes]:
                raise AssertionError(f"rank {rank}: {where}: all-reduces of {sizes} bytes "
                                     f"({nbytes} in all), expected 2 of B*S*H = {r['elements']} "
                                     f"elements = {bsh_bytes} bytes")


@pytest.mark.points(1)
def test_divisibility_error():
    """Shapes that do not split over tp give a one-line ValueError naming the field."""
    for n in world_sizes(3, 4):
        for rank, res in enumerate(_results(n)):
            if res["builds"] and "not_implemented" in res["builds"]:
                raise NotImplementedError(res["builds"]["not_implemented"])
            if res["builds"]:
                raise AssertionError(f"rank {rank}: TPModel with shapes that split over tp={n} "
                                     f"raised {res['builds']['type']}: {res['builds']['message']}")
            info = res["divisibility"]
            for what, err in info["errors"].items():
                if err and "not_implemented" in err:
                    raise NotImplementedError(err["not_implemented"])
                where = f"rank {rank}: {what}({info['config']}) on {_ranks(n)}"
                if err is None:
                    raise AssertionError(f"{where} was built, but the shapes do not divide by "
                                         f"tp={n}: raise a ValueError (use cfg.validate(tp))")
                if err["type"] != "ValueError" or "\n" in err["message"] or \
                        f"tp={n}" not in err["message"]:
                    raise AssertionError(f"{where} raised {err['type']}: {err['message']!r}; "
                                         f"expected a one-line ValueError that names tp={n}")
