"""Autograder for lab 5, ``sp``: sequence-parallel tensor parallelism against the reference.

As for lab 4, one batched run per world size (1, 2, 3, 4) builds every part of the lab under
test on several configs and returns each rank's pieces: outputs and input gradients are
sequence shards (``x[:, s0:s1]``) or column slices, parameter gradients are compared after
``sync_sequence_parallel_grads``. The same run measures the activation memory of one block
(``torch.autograd.graph.saved_tensors_hooks``) next to lab 4's TP block from the same folder,
and runs lab 4's TP model for the "SP equals TP" check. A traced run on a simulated link reads
the block's collectives per phase.

Byte convention for "the same bytes as vanilla TP": nccl-tests' bus bytes, i.e. what each rank
sends: an all-reduce of an S-byte buffer moves 2(n-1)/n * S, an all-gather or reduce-scatter of
the full S-byte buffer (n-1)/n * S (``workbook.link.bus_factor``). The trace's link spans size
an all-gather by its gathered output and a reduce-scatter by its full input, both B*S*H
elements per call here.

Tolerances: fp64 rtol 1e-9 / atol 1e-12; fp32 rtol 1e-4 / atol 1e-6.
"""
from __future__ import annotations

import os
import traceback

import pytest
import torch

from workbook.grading.engine import on_ranks, world_sizes

TIMEOUT_S = 120.0
B = 2
STEP = 3
MEMORY_RTOL = 0.02                       # measured SP activation bytes vs predicted


def _configs(n: int) -> list:
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
    g = torch.Generator().manual_seed(stable_seed("grading-sp", *seed))
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def _ints(shape, *seed) -> torch.Tensor:
    from workbook.model import stable_seed
    g = torch.Generator().manual_seed(stable_seed("grading-sp-ints", *seed))
    return torch.randint(-20, 21, shape, generator=g).double()


def _seq(t: torch.Tensor, rank: int, n: int) -> torch.Tensor:
    return t.chunk(n, dim=1)[rank].contiguous()


def _last(t: torch.Tensor, rank: int, n: int) -> torch.Tensor:
    return t.chunk(n, dim=-1)[rank].contiguous()


def _cut(t, layout, rank, n):
    return {"seq": _seq, "last": _last}[layout](t, rank, n) if layout else t


def _linears(cfg):
    """(label, reference name, in, out, kind, input layout, output layout)"""
    H, F = cfg.hidden, cfg.ffn_hidden
    up = "blocks.1.mlp.fc1" if cfg.style == "gpt" else "blocks.1.mlp.w_up"
    down = "blocks.1.mlp.fc2" if cfg.style == "gpt" else "blocks.1.mlp.w_down"
    return [("SPColumnParallelLinear", up, H, F, "column", "seq", "last"),
            ("SPRowParallelLinear", down, F, H, "row", "last", "seq"),
            ("SPRowParallelLinear", "blocks.0.attn.wo", H, H, "row", "last", "seq")]


# --------------------------------------------------------------------------- rank side
def _error(exc: BaseException) -> dict:
    if isinstance(exc, NotImplementedError):
        return {"not_implemented": str(exc)}
    return {"error": f"{type(exc).__name__}: {exc}",
            "traceback": "".join(traceback.format_exception(exc))[-2500:]}


def _run_ops(lab, rank, n, dev) -> list[dict]:
    """The two sequence collectives as autograd ops, on integer-valued fp64 (exact)."""
    full, shard = (B, 4 * n, 6), (B, 4, 6)
    out = []
    x = _ints(shard, "x", rank).to(dev).requires_grad_()
    y = lab.gather_from_sequence_parallel_region(x)
    y.backward(_ints(full, "g", rank).to(dev))
    out.append({"op": "gather_from_sequence_parallel_region", "out": y.detach(), "grad": x.grad})
    x = _ints(full, "x", rank).to(dev).requires_grad_()
    y = lab.reduce_scatter_to_sequence_parallel_region(x)
    y.backward(_ints(shard, "g", rank).to(dev))
    out.append({"op": "reduce_scatter_to_sequence_parallel_region", "out": y.detach(),
                "grad": x.grad})
    return out


def _grads(module) -> dict:
    from workbook.model import grads_by_name
    return grads_by_name(module)


def _saved_bytes(run, module, parallel_types) -> dict:
    """Bytes autograd saves during ``run()``, by region: the grader's own measurement
    (``workbook.model.memory``), independent of the lab's helper."""
    from workbook.model.memory import saved_bytes_by_region
    return saved_bytes_by_region(run, module, parallel_types, outside="sequence")


def _tp_lab():
    from workbook.grading.labs import load_lab
    return load_lab("tp")


def _run_part(lab, part, tag, cfg, rank, n, dev) -> list[dict]:
    from workbook.flight import RECORDER
    from workbook.model import make_batch
    S, H, dt = cfg.seq_len, cfg.hidden, cfg.torch_dtype
    if part == "linear":
        cases = []
        for label, name, fin, fout, kind, lin, lout in _linears(cfg):
            x = _randn((B, S, fin), dt, tag, name, "x").to(dev)
            dy = _randn((B, S, fout), dt, tag, name, "dy").to(dev)
            cls = lab.SPColumnParallelLinear if kind == "column" else lab.SPRowParallelLinear
            layer = cls(cfg, name, fin, fout, device=dev)
            xin = _cut(x, lin, rank, n).requires_grad_()
            y = layer(xin)
            y.backward(_cut(dy, lout, rank, n))
            lab.sync_sequence_parallel_grads(layer)
            cases.append({"label": label, "name": name, "out": y.detach(), "grad_in": xin.grad,
                          "grads": _grads(layer), "in": lin, "outl": lout})
        return cases
    if part in ("mlp", "attn", "block"):
        cls = {"mlp": lab.SPMLP, "attn": lab.SPAttention, "block": lab.SPBlock}[part]
        module = cls(cfg, 1, dev)
        x = _seq(_randn((B, S, H), dt, tag, part, "x"), rank, n).to(dev).requires_grad_()
        dy = _seq(_randn((B, S, H), dt, tag, part, "dy"), rank, n).to(dev)
        kwargs = {"step": STEP} if part == "block" else {}
        y = module(x, **kwargs)
        y.backward(dy)
        lab.sync_sequence_parallel_grads(module)
        return [{"label": cls.__name__, "out": y.detach(), "grad_in": x.grad,
                 "grads": _grads(module), "in": "seq", "outl": "seq"}]
    if part == "model":
        model = lab.SPModel(cfg, dev)
        tokens, targets = make_batch(cfg, B, seed=5, device=dev)
        RECORDER.reset()
        loss = model(tokens, targets, step=STEP)
        loss.backward()
        lab.sync_sequence_parallel_grads(model)
        return [{"label": "SPModel", "out": loss.detach(), "grads": _grads(model)}]
    if part == "versus_tp":                        # lab 4's model on the same batch
        tp = _tp_lab()
        model = tp.TPModel(cfg, dev)
        tokens, targets = make_batch(cfg, B, seed=5, device=dev)
        loss = model(tokens, targets, step=STEP)
        loss.backward()
        return [{"label": "TPModel (lab 4)", "out": loss.detach(), "grads": _grads(model)}]
    if part == "memory":
        tp = _tp_lab()
        x = _randn((B, S, H), dt, tag, "memory", "x").to(dev)
        sp_block, tp_block = lab.SPBlock(cfg, 0, dev), tp.TPBlock(cfg, 0, dev)
        xs = _seq(x, rank, n).requires_grad_()
        sp_mem = _saved_bytes(lambda: sp_block(xs, step=STEP), sp_block, (lab.SPAttention, lab.SPMLP))
        xt = x.clone().requires_grad_()
        tp_mem = _saved_bytes(lambda: tp_block(xt, step=STEP), tp_block, (tp.TPAttention, tp.TPMLP))
        return [{"sp": sp_mem, "tp": tp_mem}]
    raise ValueError(part)


PARTS = ("linear", "mlp", "attn", "block", "model", "versus_tp", "memory")


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
    import torch.distributed as dist
    from workbook.grading.labs import load_lab
    from workbook.launch import device
    lab = load_lab("sp")
    rank, n, dev = dist.get_rank(), dist.get_world_size(), device()
    res: dict = {}
    try:
        res["ops"] = _run_ops(lab, rank, n, dev)
    except Exception as exc:                   # noqa: BLE001
        res["ops"] = _error(exc)
    for tag, cfg in _configs(n):
        for part in PARTS:
            if part == "memory" and "fp32" in tag:
                continue
            try:
                res[(part, tag)] = _run_part(lab, part, tag, cfg, rank, n, dev)
            except Exception as exc:           # noqa: BLE001
                res[(part, tag)] = _error(exc)
    if n > 1:
        from workbook.model import ModelConfig
        good = ModelConfig.odd_shapes() if n == 3 else ModelConfig()
        bad = good.replace(seq_len=10)
        out = {"config": f"seq_len={bad.seq_len}"}
        for key, cfg in (("good", good), ("bad", bad)):
            try:
                lab.SPModel(cfg, dev)
                out[key] = None
            except NotImplementedError as exc:
                out[key] = {"not_implemented": str(exc)}
            except Exception as exc:           # noqa: BLE001
                out[key] = {"type": type(exc).__name__, "message": str(exc)}
        res["divisibility"] = out
    return _cpu(res)


def _run_traced(trace_dir: str) -> dict:
    """On every rank: one SPBlock forward, backward and gradient sync inside a trace."""
    from pathlib import Path

    import torch.distributed as dist
    from workbook import trace
    from workbook.flight import RECORDER
    from workbook.grading.labs import load_lab
    from workbook.launch import device
    from workbook.model import ModelConfig
    from workbook.trace.capture import rank_trace
    lab = load_lab("sp")
    rank, n, dev = dist.get_rank(), dist.get_world_size(), device()
    cfg = ModelConfig(n_layers=2, dropout=0.1) if n != 3 else ModelConfig.odd_shapes(n_layers=2)
    try:
        block = lab.SPBlock(cfg, 0, dev)
    except NotImplementedError as exc:
        return {"not_implemented": str(exc)}
    S, H = cfg.seq_len, cfg.hidden
    x = _seq(_randn((B, S, H), cfg.torch_dtype, "trace", "x"), rank, n).to(dev).requires_grad_()
    dy = _seq(_randn((B, S, H), cfg.torch_dtype, "trace", "dy"), rank, n).to(dev)
    dist.barrier()
    calls = {}
    try:
        with rank_trace(trace_dir, lab="sp"):
            for phase in ("forward", "backward", "grad_sync"):
                RECORDER.reset()
                with torch.profiler.record_function(phase):
                    if phase == "forward":
                        y = block(x, step=1)
                    elif phase == "backward":
                        y.backward(dy)
                    else:
                        lab.sync_sequence_parallel_grads(block)
                calls[phase] = [(c.name, c.size_bytes) for c in RECORDER.calls]
    except NotImplementedError as exc:
        return {"not_implemented": str(exc)}
    t = trace.load_trace(Path(trace_dir) / f"rank{rank}.trace.json")
    return {"elements": B * S * H, "elsize": x.element_size(),
            "trace": {p: trace.collectives(t, within=p) for p in ("forward", "backward")},
            "recorder": calls}


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
    raise AssertionError(
        f"rank {rank}: {what} differs from the reference at flat index {i}: expected "
        f"{e[i].item():.6g}, got {g[i].item():.6g} ({len(bad)} of {e.numel()} elements differ, "
        f"max |diff| {float((g - e).abs().max()):.3g}; tolerance rtol={rtol:g}, atol={atol:g})")


def _reference(part, tag, cfg):
    from workbook.model import Attention, Block, Linear, MLP, ReferenceModel, grads_by_name, \
        make_batch, run_reference
    key = (part, tag)
    if key in _REFS:
        return _REFS[key]
    S, H, dt = cfg.seq_len, cfg.hidden, cfg.torch_dtype
    if part == "linear":
        ref = {}
        for label, name, fin, fout, *_ in _linears(cfg):
            ref[name] = run_reference(Linear(cfg, name, fin, fout), _randn((B, S, fin), dt, tag, name, "x"),
                                      _randn((B, S, fout), dt, tag, name, "dy"))
    elif part in ("mlp", "attn", "block"):
        module = {"mlp": lambda: MLP(cfg, "blocks.1.mlp"), "attn": lambda: Attention(cfg, "blocks.1.attn"),
                  "block": lambda: Block(cfg, 1)}[part]()
        ref = run_reference(module, _randn((B, S, H), dt, tag, part, "x"),
                            _randn((B, S, H), dt, tag, part, "dy"),
                            **({"step": STEP} if part == "block" else {}))
    else:
        model = ReferenceModel(cfg)
        tokens, targets = make_batch(cfg, B, seed=5)
        loss = model(tokens, targets, step=STEP)
        loss.backward()
        ref = (loss.detach(), grads_by_name(model))
    _REFS[key] = ref
    return ref


def _check_grads(got, expected, *, rank, n, where, tol, against="the reference"):
    from workbook.model import shard_spec, slice_for_rank
    missing = sorted(set(expected) - set(got))
    if missing:
        raise AssertionError(f"rank {rank}: {where}: no parameter named {missing[0]} (parameter "
                             f"names must match the reference's)")
    for name, full in expected.items():
        spec = shard_spec(name)
        piece = full if against != "the reference" else slice_for_rank(full, spec, rank, n)
        how = "replicated" if spec.kind == "replicated" else f"rank {rank}'s {spec.kind} slice"
        if spec.kind == "replicated" and n > 1 and not name.startswith("head"):
            how += ", synchronised after backward"
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
                    r = ref[case["name"]] if part == "linear" else ref
                    where = f"{case['label']} {case.get('name', '')} ({tag}, tp={n})".replace("  ", " ")
                    _compare(case["out"], _cut(r.out, case["outl"], rank, n), rank=rank,
                             what=f"{where}: output ({case['outl']} shard)", **tol)
                    _compare(case["grad_in"], _cut(r.grad_input, case["in"], rank, n), rank=rank,
                             what=f"{where}: gradient of the input ({case['in']} shard)", **tol)
                    _check_grads(case["grads"], r.grads, rank=rank, n=n, where=where, tol=tol)


@pytest.mark.points(3)
def test_sequence_ops():
    """All-gather / reduce-scatter along the sequence and their conjugate backwards, exactly."""
    for n in world_sizes(1, 2, 3, 4):
        for rank, res in enumerate(_results(n)):
            _raise_if_failed(res["ops"], rank, n, "the sequence-parallel ops")
            full, shard = (B, 4 * n, 6), (B, 4, 6)
            expected = {
                "gather_from_sequence_parallel_region": (
                    torch.cat([_ints(shard, "x", r) for r in range(n)], dim=1),
                    _seq(sum(_ints(full, "g", r) for r in range(n)), rank, n)),
                "reduce_scatter_to_sequence_parallel_region": (
                    _seq(sum(_ints(full, "x", r) for r in range(n)), rank, n),
                    torch.cat([_ints(shard, "g", r) for r in range(n)], dim=1)),
            }
            for case in res["ops"]:
                out, grad = expected[case["op"]]
                where = f"{case['op']} on {_ranks(n)}"
                _compare(case["out"], out, rank=rank, what=f"{where}: forward output", rtol=0, atol=0)
                _compare(case["grad"], grad, rank=rank, what=f"{where}: gradient of the input",
                         rtol=0, atol=0)


@pytest.mark.points(3)
def test_sp_linears():
    """Column layer: sequence shard in, column slice out; row layer: reduce-scattered output
    with the bias once; bias gradients synchronised."""
    _check_part("linear")


@pytest.mark.points(3)
def test_sp_mlp():
    _check_part("mlp")


@pytest.mark.points(3)
def test_sp_attention():
    _check_part("attn")


@pytest.mark.points(3)
def test_sp_block():
    """Norms and dropout on shards (each shard its slice of the reference mask); the norm
    gradients synchronised across the tensor-parallel ranks."""
    _check_part("block")


@pytest.mark.points(4)
def test_sp_model():
    _check_part("model")


@pytest.mark.points(1)
def test_sp_matches_tp_lab():
    """The SP model's loss and gradients equal lab 4's TP model's (same folder)."""
    for n in world_sizes(2, 3, 4):
        for tag, cfg in _configs(n):
            tol = _tol(cfg)
            for rank, res in enumerate(_results(n)):
                _raise_if_failed(res[("model", tag)], rank, n, f"SPModel ({tag})")
                _raise_if_failed(res[("versus_tp", tag)], rank, n, f"lab 4's TPModel ({tag})")
                tp, sp = res[("versus_tp", tag)][0], res[("model", tag)][0]
                where = f"SPModel vs lab 4's TPModel ({tag}, tp={n})"
                _compare(sp["out"], tp["out"], rank=rank, what=f"{where}: loss", **tol)
                _check_grads(sp["grads"], tp["grads"], rank=rank, n=n, where=where, tol=tol,
                             against="tp")


@pytest.mark.points(3)
def test_activation_memory():
    """Bytes saved for backward by one block: the parallel regions (attention, MLP) as in TP,
    the rest (norms, dropout, residual) divided by n. Predicted SP = TP_parallel + TP_rest / n."""
    for n in world_sizes(2, 3, 4):
        for tag, cfg in _configs(n):
            if "fp32" in tag:
                continue
            for rank, res in enumerate(_results(n)):
                entry = res[("memory", tag)]
                _raise_if_failed(entry, rank, n, f"the activation-memory run ({tag})")
                tp, sp = entry[0]["tp"], entry[0]["sp"]
                tp_total, sp_total = sum(tp.values()), sum(sp.values())
                predicted = tp["parallel"] + tp["sequence"] / n
                msg = (f"rank {rank}: one block ({tag}, tp={n}) saves {sp_total} bytes for backward "
                       f"with SP (parallel regions {sp['parallel']}, norms/dropout/residual "
                       f"{sp['sequence']}); TP saves {tp_total} ({tp['parallel']} + {tp['sequence']}); "
                       f"predicted SP = {tp['parallel']} + {tp['sequence']}/{n} = {predicted:.0f}")
                if sp_total >= tp_total:
                    raise AssertionError(msg + ": SP should save less than TP")
                if abs(sp_total - predicted) > MEMORY_RTOL * predicted:
                    hint = (" (a slice like mask[:, s0:s1] is a view that keeps the whole tensor "
                            "alive: copy it; a non-contiguous gathered input is copied by each "
                            "matmul that flattens it)") if sp_total > predicted else ""
                    raise AssertionError(msg + f": measured differs by more than "
                                               f"{MEMORY_RTOL:.0%}{hint}")


@pytest.mark.points(3)
@pytest.mark.parametrize("n", [2, 3])
def test_sp_block_pattern_from_trace(n, tmp_path):
    """From the trace of one SP block on a simulated link: forward and backward each make
    exactly 2 all-gathers and 2 reduce-scatters of B*S*H elements and no all-reduce; their bus
    bytes equal vanilla TP's 2 all-reduces of B*S*H."""
    from workbook.link import bus_factor
    from workbook.ranks import choose_backend
    link = "dgx-h100" if choose_backend(None, n) == "gloo" else "none"    # no simulated link on NCCL
    res = _pool_run(f"trace:{tmp_path}", n, _run_traced, str(tmp_path), link=link)
    for rank, r in enumerate(res):
        _raise_if_failed(r, rank, n, "the traced SPBlock")
        bsh = r["elements"] * r["elsize"]
        for phase in ("forward", "backward"):
            got = r["trace"][phase]
            where = f"SPBlock {phase} on {_ranks(n)} (from the trace)"
            if got.get("all_reduce", {}).get("count"):
                raise AssertionError(f"rank {rank}: {where}: {got['all_reduce']['count']} "
                                     f"all_reduce; sequence parallelism replaces each with a "
                                     f"reduce-scatter or an all-gather along the sequence")
            others = sorted(set(got) - {"all_gather", "reduce_scatter"})
            if others:
                raise AssertionError(f"rank {rank}: {where}: unexpected {', '.join(others)}")
            recorded = {"all_gather": 0, "reduce_scatter": 0}      # the flight recorder's view
            for name, size in r["recorder"][phase]:
                if name.startswith("all_gather"):
                    recorded["all_gather"] += size                # sized by the gathered output
                elif name.startswith("reduce_scatter"):
                    recorded["reduce_scatter"] += size * n        # sized by its output: one shard
            for name in ("all_gather", "reduce_scatter"):
                count = got.get(name, {}).get("count", 0)
                if count != 2:
                    raise AssertionError(f"rank {rank}: {where}: expected exactly 2 {name}, got "
                                         f"{count}")
                if got[name]["bytes"] is None:                     # (a GPU trace may not say)
                    got[name]["bytes"] = recorded[name]
                if got[name]["bytes"] != 2 * bsh:
                    raise AssertionError(
                        f"rank {rank}: {where}: the {name}s moved buffers of {got[name]['bytes']} "
                        f"bytes in all, expected 2 of B*S*H = {r['elements']} elements "
                        f"({2 * bsh} bytes)")
            bus = sum(c["bytes"] * bus_factor(k, n) for k, c in got.items())
            tp_bus = 2 * bsh * bus_factor("all_reduce", n)
            if abs(bus - tp_bus) > 1e-6 * tp_bus:
                raise AssertionError(f"rank {rank}: {where}: {bus:.0f} bus bytes, vanilla TP "
                                     f"moves {tp_bus:.0f}")
        sync = [c for c in r["recorder"]["grad_sync"]]
        if n > 1 and not sync:
            raise AssertionError(f"rank {rank}: sync_sequence_parallel_grads on {_ranks(n)} made no "
                                 f"collective: the norm gradients are partial sums")


@pytest.mark.points(1)
def test_sp_divisibility_error():
    """A sequence length that does not split over tp is a one-line ValueError naming it."""
    for n in world_sizes(3, 4):
        for rank, res in enumerate(_results(n)):
            info = res["divisibility"]
            if info["good"] and "not_implemented" in info["good"]:
                raise NotImplementedError(info["good"]["not_implemented"])
            if info["good"]:
                raise AssertionError(f"rank {rank}: SPModel with shapes that split over tp={n} "
                                     f"raised {info['good']['type']}: {info['good']['message']}")
            err, where = info["bad"], f"rank {rank}: SPModel({info['config']}) on {_ranks(n)}"
            if err is None:
                raise AssertionError(f"{where} was built, but {info['config']} does not divide by "
                                     f"tp={n}: raise a ValueError (cfg.validate(tp, sequence_parallel=True))")
            if err["type"] != "ValueError" or "\n" in err["message"] or "seq_len" not in err["message"]:
                raise AssertionError(f"{where} raised {err['type']}: {err['message']!r}; expected a "
                                     f"one-line ValueError that names seq_len")
