"""Lab ``pp_schedules``'s split backward (``workbook.pipeline_parallel.split_backward``): B then W
gives the gradients of the unsplit backward (fp64, GPT and Llama), with several micro-batches in
flight and their W's in any order; W redoes none of B's work (counted matmuls) and needs no
autograd graph; misuse fails in one line. One process, no ranks.
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from workbook.model import ModelConfig, make_batch
from workbook.pipeline_parallel import (PipelineStage, SplitLinear, WeightGradStore,
                                        split_linears)

TOL = 1e-12
M, ROWS = 3, 2
STYLES = ("gpt", "llama")
MATMULS = {"mm", "bmm", "addmm", "matmul", "baddbmm"}


def _config(style: str) -> ModelConfig:
    return ModelConfig(style=style, dtype="float64", hidden=16, heads=2, ffn_hidden=24,
                       n_layers=3, seq_len=6, vocab_size=40, seed=5)


class CountMatmuls(TorchDispatchMode):
    """How many matrix products run inside it, by aten op name."""

    def __init__(self):
        super().__init__()
        self.counts: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in MATMULS:
            self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _inputs(cfg: ModelConfig, stage: int):
    """Micro-batches for stage ``stage`` of 3: tokens for stage 0, else activations; the output
    gradients a middle stage would receive; the targets for the last."""
    tokens, targets = make_batch(cfg, ROWS * M, seed=2)
    gen = torch.Generator().manual_seed(stage)
    acts = torch.randn(ROWS * M, cfg.seq_len, cfg.hidden, generator=gen, dtype=torch.float64)
    grads = torch.randn(ROWS * M, cfg.seq_len, cfg.hidden, generator=gen, dtype=torch.float64)
    xs = tokens.chunk(M) if stage == 0 else acts.chunk(M)
    return xs, grads.chunk(M), targets.chunk(M)


def _backward(stage: PipelineStage, x, dy, targets) -> torch.Tensor:
    """Micro-batch forward (with ``x`` tracking its gradient when it is an activation), then the
    backward; returns the output (the loss on the last stage)."""
    out = stage(x)
    if stage.is_last:
        out = stage.loss(out, targets, M)
        out.backward()
    else:
        out.backward(dy)
    return out


def _unsplit(cfg, s: int):
    """The plain stage's gradients and input gradients over the M micro-batches."""
    stage = PipelineStage(cfg, s, 3)
    xs, dys, ts = _inputs(cfg, s)
    dxs = []
    for x, dy, t in zip(xs, dys, ts):
        x = x if s == 0 else x.clone().requires_grad_()
        _backward(stage, x, dy, t)
        dxs.append(None if s == 0 else x.grad)
    return stage.named_grads(), dxs


def _split(cfg, s: int, w_order):
    """The same with split linears: every B first (each micro-batch's forward tagged), then
    the W's in ``w_order``."""
    stage, store = PipelineStage(cfg, s, 3), WeightGradStore()
    n = split_linears(stage, store)
    xs, dys, ts = _inputs(cfg, s)
    dxs = []
    for i, (x, dy, t) in enumerate(zip(xs, dys, ts)):
        x = x if s == 0 else x.clone().requires_grad_()
        with store.micro_batch(i):
            out = stage(x)
        out = stage.loss(out, t, M) if stage.is_last else out
        out.backward() if stage.is_last else out.backward(dy)
        dxs.append(None if s == 0 else x.grad)
    assert store.pending() == list(range(M))
    for i in w_order:
        assert store.weight_grads(i) == n
    assert store.pending() == []
    return stage.named_grads(), dxs, n


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("s", [0, 1, 2])
def test_b_then_w_gives_the_unsplit_gradients(style, s):
    """Stage s of 3 (embedding, middle, norm and head): B for 3 micro-batches, then their W's
    in another order: every parameter gradient and every input gradient as unsplit."""
    cfg = _config(style)
    want, want_dx = _unsplit(cfg, s)
    got, got_dx, n = _split(cfg, s, w_order=[2, 0, 1])
    linears = sum(k.endswith(("wq.weight", "fc1.weight", "w_gate.weight", "head.weight"))
                  for k in want)
    assert n >= linears > 0
    assert set(got) == set(want)
    for k in want:
        assert got[k] is not None, f"{k}: no gradient after B and W"
        err = (got[k] - want[k]).abs().max().item()
        assert err < TOL, f"{style}, stage {s}: gradient of {k} differs by {err:.1e}"
    for i, (a, b) in enumerate(zip(got_dx, want_dx)):
        if s:
            assert (a - b).abs().max().item() < TOL, f"input gradient of micro-batch {i}"


@pytest.mark.parametrize("style", STYLES)
def test_b_gives_input_and_norm_gradients_w_the_linear_weights(style):
    """After B alone: the input gradient and the norms' gains are there (autograd, during B),
    no linear weight has a gradient yet; W fills exactly the linears."""
    cfg = _config(style)
    stage, store = PipelineStage(cfg, 1, 3), WeightGradStore()
    split_linears(stage, store)
    x = torch.randn(ROWS, cfg.seq_len, cfg.hidden, dtype=torch.float64, requires_grad=True)
    with store.micro_batch(0):
        out = stage(x)
    out.backward(torch.ones_like(out))
    assert x.grad is not None
    linear = {n for n, m in stage.named_modules() if isinstance(m, SplitLinear)}
    for name, prm in stage.named_parameters():
        owner = name.rsplit(".", 1)[0]
        assert (prm.grad is None) == (owner in linear), f"{name} after B: {prm.grad is None}"
    store.weight_grads(0)
    assert all(prm.grad is not None for prm in stage.parameters())


@pytest.mark.parametrize("style", STYLES)
def test_w_redoes_none_of_b_and_needs_no_graph(style):
    """The unsplit backward's matrix products are B's plus W's, and W's are one ``mm`` per
    linear, nothing else (no second backward). B frees the autograd graph (no retain_graph),
    and W still runs: it reads only its stash."""
    cfg = _config(style)
    x = torch.randn(ROWS, cfg.seq_len, cfg.hidden, dtype=torch.float64)
    dy = torch.randn_like(x)
    plain = PipelineStage(cfg, 1, 3)
    out = plain(x.clone().requires_grad_())
    with CountMatmuls() as unsplit:
        out.backward(dy)

    stage, store = PipelineStage(cfg, 1, 3), WeightGradStore()
    n = split_linears(stage, store)
    with store.micro_batch(0):
        out = stage(x.clone().requires_grad_())
    with CountMatmuls() as b:
        out.backward(dy)
    with pytest.raises(RuntimeError):                    # the graph is gone after B
        out.backward(dy)
    with CountMatmuls() as w:
        assert store.weight_grads(0) == n
    assert w.counts == {"mm": n}, w.counts
    assert b.total + w.total == unsplit.total, (b.counts, w.counts, unsplit.counts)
    assert all(prm.grad.grad_fn is None for prm in stage.parameters())


@pytest.mark.parametrize("style", STYLES)
def test_untagged_split_linears_train_as_before(style):
    """Outside ``micro_batch`` a split linear's backward is the full one: a whole-model step
    with split linears equals the plain one."""
    cfg = _config(style)
    tokens, targets = make_batch(cfg, ROWS, seed=4)
    plain, split = PipelineStage(cfg, 0, 1), PipelineStage(cfg, 0, 1)
    store = WeightGradStore()
    split_linears(split, store)
    for stage in (plain, split):
        stage.loss(stage(tokens), targets, 1).backward()
    want, got = plain.named_grads(), split.named_grads()
    assert store.pending() == []
    assert max((want[k] - got[k]).abs().max().item() for k in want) < TOL


def test_misuse_fails_in_one_line():
    cfg = _config("gpt")
    stage, store = PipelineStage(cfg, 1, 3), WeightGradStore()
    split_linears(stage, store)
    x = torch.randn(ROWS, cfg.seq_len, cfg.hidden, dtype=torch.float64, requires_grad=True)
    with store.micro_batch(7):
        out = stage(x)
    errors = []
    for call in (lambda: store.weight_grads(7),                      # W before its B
                 lambda: (out.backward(torch.ones_like(out)), store.weight_grads(7),
                          store.weight_grads(7)),                    # W twice
                 lambda: split_linears(torch.nn.LayerNorm(4), store)):
        with pytest.raises((RuntimeError, ValueError)) as err:
            call()
        errors.append(str(err.value))
    assert all("\n" not in e for e in errors), errors
    assert "W(7) has nothing to compute" in errors[0] and "W(7)" in errors[1]
    assert "no Linear or LMHead" in errors[2]
    with store.micro_batch(0), pytest.raises(RuntimeError, match="one chunk forward at a time"):
        with store.micro_batch(1):
            pass
