"""Tests of the single-device reference model (workbook.model)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from workbook.model import (
    Block,
    ModelConfig,
    ReferenceModel,
    block_forward_reference,
    dropout_mask,
    full_weight,
    grads_by_name,
    local_weight,
    make_batch,
    parameter_shapes,
    params_by_name,
    shard_spec,
    shard_table,
    slice_for_rank,
    unslice,
)
from workbook.model import ops

STYLES = ["gpt", "llama"]


def tiny(style: str, **kw) -> ModelConfig:
    base = dict(vocab_size=12, hidden=8, heads=2, ffn_hidden=12, n_layers=1, seq_len=4,
                style=style, dtype="float64")
    base.update(kw)
    return ModelConfig(**base)


# ------------------------------------------------------------------ determinism
@pytest.mark.parametrize("style", STYLES)
def test_same_seed_same_weights_and_loss(style):
    cfg = ModelConfig(style=style, dropout=0.1 if style == "gpt" else 0.0)
    a, b = ReferenceModel(cfg), ReferenceModel(cfg)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and torch.equal(pa, pb)
    tokens, targets = make_batch(cfg, 4, seed=3)
    assert torch.equal(a(tokens, targets), b(tokens, targets))


@pytest.mark.parametrize("style", STYLES)
def test_different_seed_different_weights_and_loss(style):
    cfg = ModelConfig(style=style)
    a, b = ReferenceModel(cfg), ReferenceModel(cfg.replace(seed=1))
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert not torch.equal(pa, pb), name
    tokens, targets = make_batch(cfg, 4, seed=3)
    assert a(tokens, targets).item() != b(tokens, targets).item()


@pytest.mark.parametrize("style", STYLES)
def test_weights_are_a_function_of_the_name(style):
    cfg = ModelConfig(style=style, n_layers=3)
    model = ReferenceModel(cfg)
    shapes = parameter_shapes(cfg)
    assert [n for n, _ in model.named_parameters()] == list(shapes)
    for name, p in model.named_parameters():
        assert tuple(p.shape) == shapes[name]
        assert torch.equal(p.detach(), full_weight(cfg, name, p.shape)), name
    # Layers differ from each other; fp32 weights are the fp64 weights rounded.
    assert not torch.equal(full_weight(cfg, "blocks.0.attn.wq.weight", (64, 64)),
                           full_weight(cfg, "blocks.1.attn.wq.weight", (64, 64)))
    w64 = full_weight(cfg.replace(dtype="float64"), "head.weight", (256, 64))
    assert torch.equal(w64.float(), full_weight(cfg, "head.weight", (256, 64)))


def _block0(mlp: tuple[str, ...], params: tuple[str, ...]) -> list[str]:
    """Block 0's parameter names, in order: norm1, wq wk wv wo, norm2, then the ``mlp`` matrices;
    each module's ``params`` in turn (weight, then bias where there is one)."""
    modules = ("norm1", "attn.wq", "attn.wk", "attn.wv", "attn.wo", "norm2",
               *(f"mlp.{m}" for m in mlp))
    return [f"blocks.0.{m}.{p}" for m in modules for p in params]


def test_parameter_names():
    gpt = parameter_shapes(ModelConfig(style="gpt", n_layers=1))
    assert list(gpt) == ["embed.tok.weight", "embed.pos.weight",
                         *_block0(("fc1", "fc2"), ("weight", "bias")),
                         "norm_f.weight", "norm_f.bias", "head.weight"]
    llama = parameter_shapes(ModelConfig(style="llama", n_layers=1))
    assert list(llama) == ["embed.tok.weight",
                           *_block0(("w_gate", "w_up", "w_down"), ("weight",)),
                           "norm_f.weight", "head.weight"]


# --------------------------------------------------------------------- sharding
def test_shard_specs():
    expected = {
        "embed.tok.weight": ("vocab", 0), "embed.pos.weight": ("replicated", None),
        "head.weight": ("vocab", 0),
        "blocks.3.attn.wq.weight": ("column", 0), "blocks.3.attn.wk.bias": ("column", 0),
        "blocks.3.attn.wo.weight": ("row", 1), "blocks.3.attn.wo.bias": ("replicated", None),
        "blocks.0.mlp.fc1.weight": ("column", 0), "blocks.0.mlp.fc1.bias": ("column", 0),
        "blocks.0.mlp.fc2.weight": ("row", 1), "blocks.0.mlp.fc2.bias": ("replicated", None),
        "blocks.0.mlp.w_gate.weight": ("column", 0), "blocks.0.mlp.w_up.weight": ("column", 0),
        "blocks.0.mlp.w_down.weight": ("row", 1),
        "blocks.0.norm1.weight": ("replicated", None), "norm_f.bias": ("replicated", None),
    }
    for name, spec in expected.items():
        assert shard_spec(name) == spec, name
    kind, dim = shard_spec("head.weight")  # unpacks like a (kind, dim) tuple
    assert (kind, dim) == ("vocab", 0)
    with pytest.raises(KeyError, match="no shard spec"):
        shard_spec("blocks.0.attn.qkv.weight")


@pytest.mark.parametrize("cfg", [ModelConfig(style="gpt"), ModelConfig(style="llama"),
                                 ModelConfig.odd_shapes(style="gpt"),
                                 ModelConfig.odd_shapes(style="llama")],
                         ids=["gpt", "llama", "gpt-odd", "llama-odd"])
def test_slicing_round_trip(cfg):
    model = ReferenceModel(cfg)
    full = params_by_name(model)
    tested = 0
    for ws in (1, 2, 3, 4):
        try:
            table = shard_table(cfg, ws)
        except ValueError:
            continue
        tested += 1
        for name, (shape, spec, local_shape) in table.items():
            pieces = [slice_for_rank(full[name], spec, r, ws) for r in range(ws)]
            assert all(tuple(p.shape) == local_shape for p in pieces), name
            assert torch.equal(unslice(pieces, spec), full[name]), (name, ws)
            if spec.kind != "replicated":
                assert torch.equal(local_weight(cfg, name, ws - 1, ws), pieces[-1])
    assert tested >= 2


def test_slice_errors():
    w = torch.zeros(6, 4)
    with pytest.raises(ValueError, match="size 6 into 4"):
        slice_for_rank(w, ("column", 0), 0, 4)
    with pytest.raises(ValueError, match="rank 2"):
        slice_for_rank(w, ("row", 1), 2, 2)
    with pytest.raises(ValueError, match="unknown shard kind"):
        slice_for_rank(w, ("diagonal", 0), 0, 2)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("tp", [2, 3])
def test_specs_give_megatron_tensor_parallel_math(style, tp):
    """Summing row-parallel partial outputs over 'ranks' gives the reference."""
    cfg = ModelConfig.odd_shapes(style=style, dtype="float64", n_layers=1).validate(tp=tp)
    x = torch.randn(2, cfg.seq_len, cfg.hidden, dtype=torch.float64)
    b = "blocks.0"

    def w(name, r):
        return local_weight(cfg, f"{b}.{name}", r, tp)

    def bias(name, r):
        return w(name, r) if style == "gpt" else None

    mlp_ref = block_forward_reference(cfg, x, part="mlp").out
    attn_ref = block_forward_reference(cfg, x, part="attn").out
    mlp_sum = attn_sum = 0.0
    for r in range(tp):
        if style == "gpt":
            h = ops.gelu(ops.linear(x, w("mlp.fc1.weight", r), bias("mlp.fc1.bias", r)))
            mlp_sum = mlp_sum + ops.linear(h, w("mlp.fc2.weight", r))
        else:
            h = ops.silu(ops.linear(x, w("mlp.w_gate.weight", r))) * ops.linear(x, w("mlp.w_up.weight", r))
            mlp_sum = mlp_sum + ops.linear(h, w("mlp.w_down.weight", r))
        qkv = [ops.linear(x, w(f"attn.{n}.weight", r), bias(f"attn.{n}.bias", r)) for n in ("wq", "wk", "wv")]
        rope = None
        if style == "llama":
            rope = ops.rope_cos_sin(torch.arange(cfg.seq_len), cfg.head_dim, cfg.rope_base, x.dtype)
        ctx = ops.causal_attention(*qkv, cfg.heads // tp, rope)
        attn_sum = attn_sum + ops.linear(ctx, w("attn.wo.weight", r))
    if style == "gpt":  # row-parallel biases are added once, after the reduction
        mlp_sum = mlp_sum + full_weight(cfg, f"{b}.mlp.fc2.bias", (cfg.hidden,))
        attn_sum = attn_sum + full_weight(cfg, f"{b}.attn.wo.bias", (cfg.hidden,))
    torch.testing.assert_close(mlp_sum, mlp_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(attn_sum, attn_ref, rtol=1e-12, atol=1e-12)

    # Vocab-parallel head: concatenating each rank's logits gives the full logits.
    h = torch.randn(2, 3, cfg.hidden, dtype=torch.float64)
    full_logits = ops.linear(h, full_weight(cfg, "head.weight", (cfg.vocab_size, cfg.hidden)))
    parts = [ops.linear(h, local_weight(cfg, "head.weight", r, tp)) for r in range(tp)]
    torch.testing.assert_close(torch.cat(parts, dim=-1), full_logits, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------- training
@pytest.mark.parametrize("style", STYLES)
def test_loss_decreases_with_sgd(style):
    cfg = ModelConfig(style=style, dropout=0.1 if style == "gpt" else 0.0, seed=7)
    model = ReferenceModel(cfg)
    tokens, targets = make_batch(cfg, 4, seed=0)
    losses = []
    for step in range(8):  # plain SGD (torch.optim would import torch._dynamo: ~2 s)
        model.zero_grad(set_to_none=True)
        loss = model(tokens, targets, step=step)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.5 * p.grad
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        final = model(tokens, targets).item()
    assert abs(losses[0] - math.log(cfg.vocab_size)) < 0.2
    assert final < losses[0] - 0.05, losses


@pytest.mark.parametrize("cfg", [ModelConfig.odd_shapes(style="gpt", dropout=0.1),
                                 ModelConfig.odd_shapes(style="llama")], ids=STYLES)
def test_odd_shapes_forward_backward(cfg):
    model = ReferenceModel(cfg)
    tokens, targets = make_batch(cfg, 3, seed=1, seq_len=cfg.seq_len - 1)
    loss = model(tokens, targets)
    loss.backward()
    grads = grads_by_name(model)
    assert list(grads) == list(parameter_shapes(cfg))
    assert all(torch.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize("style", STYLES)
def test_fp32_matches_fp64(style):
    cfg = ModelConfig(style=style)
    tokens, targets = make_batch(cfg, 2, seed=0)
    l32 = ReferenceModel(cfg)(tokens, targets)
    l64 = ReferenceModel(cfg.replace(dtype="float64"))(tokens, targets)
    assert l32.dtype == torch.float32 and l64.dtype == torch.float64
    assert abs(l32.item() - l64.item()) < 1e-5


# ----------------------------------------------------------------- correctness
@pytest.mark.parametrize("style", STYLES)
def test_gradcheck_block(style):
    cfg = tiny(style, hidden=4, heads=2, ffn_hidden=6, seq_len=3,
               dropout=0.2 if style == "gpt" else 0.0)
    block = Block(cfg, layer=0)
    names = [n for n, _ in block.named_parameters()]
    x = torch.randn(1, cfg.seq_len, cfg.hidden, dtype=torch.float64, requires_grad=True)
    params = [p.detach().clone().requires_grad_(True) for p in block.parameters()]

    def f(x, *ps):
        return functional_call(block, dict(zip(names, ps)), (x,), {"step": 3})

    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-5)


def test_ops_match_torch():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    w, b = torch.randn(12, dtype=torch.float64), torch.randn(12, dtype=torch.float64)
    torch.testing.assert_close(ops.layer_norm(x, w, b, 1e-5), F.layer_norm(x, (12,), w, b, 1e-5))
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-5), F.rms_norm(x, (12,), w, 1e-5))
    torch.testing.assert_close(ops.gelu(x), F.gelu(x))
    torch.testing.assert_close(ops.silu(x), F.silu(x))
    q, k, v = (torch.randn(2, 5, 12, dtype=torch.float64) for _ in range(3))
    split = lambda t: t.view(2, 5, 3, 4).transpose(1, 2)  # noqa: E731
    want = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
    torch.testing.assert_close(ops.causal_attention(q, k, v, 3), want.transpose(1, 2).reshape(2, 5, 12))
    logits, targets = torch.randn(2, 5, 7, dtype=torch.float64), torch.randint(0, 7, (2, 5))
    torch.testing.assert_close(ops.cross_entropy(logits, targets),
                               F.cross_entropy(logits.reshape(-1, 7), targets.reshape(-1)))


def test_rope_depends_on_relative_position():
    d = 8
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    cos, sin = ops.rope_cos_sin(torch.arange(10), d, 10000.0, torch.float64)

    def score(m, n):
        return (ops.apply_rope(q, cos[m], sin[m]) * ops.apply_rope(k, cos[n], sin[n])).sum()

    torch.testing.assert_close(score(5, 2), score(8, 5))
    torch.testing.assert_close(ops.apply_rope(q, cos[7], sin[7]).norm(), q.norm())
    assert not torch.allclose(score(5, 2), score(5, 4))


@pytest.mark.parametrize("style", STYLES)
def test_causal(style):
    cfg = ModelConfig(style=style, dtype="float64")
    model = ReferenceModel(cfg)
    tokens, _ = make_batch(cfg, 2, seed=0)
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % cfg.vocab_size
    a, b = model.logits(tokens), model.logits(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10], rtol=0, atol=0)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


# ---------------------------------------------------------------------- dropout
def test_dropout_mask_reproducible_and_sliceable():
    cfg = ModelConfig(dropout=0.25, dtype="float64")
    shape = (4, 12, 64)
    m = dropout_mask(cfg, "blocks.0.attn.dropout", shape, step=5)
    assert torch.equal(m, dropout_mask(cfg, "blocks.0.attn.dropout", shape, step=5))
    assert not torch.equal(m, dropout_mask(cfg, "blocks.0.attn.dropout", shape, step=6))
    assert not torch.equal(m, dropout_mask(cfg, "blocks.0.mlp.dropout", shape, step=5))
    assert set(m.unique().tolist()) == {0.0, 1.0 / 0.75}
    assert abs((m == 0).double().mean().item() - 0.25) < 0.03
    # A sequence-parallel rank slices the full mask along the sequence dim.
    pieces = [slice_for_rank(m, ("sequence", 1), r, 3) for r in range(3)]
    assert torch.equal(torch.cat(pieces, dim=1), m)
    assert torch.equal(dropout_mask(ModelConfig(), "x", (2, 3)), torch.ones(2, 3))
    assert dropout_mask(ModelConfig(dropout=0.1), "x", (2, 3)).dtype == torch.float32


def test_dropout_in_block_uses_the_site_masks():
    cfg = ModelConfig(dropout=0.3, dtype="float64")
    x = torch.randn(2, cfg.seq_len, cfg.hidden, dtype=torch.float64)
    block = Block(cfg, layer=1)
    y = block(x, step=2)
    attn = block.attn(block.norm1(x))
    mid = x + attn * dropout_mask(cfg, "blocks.1.attn.dropout", x.shape, 2)
    want = mid + block.mlp(block.norm2(mid)) * dropout_mask(cfg, "blocks.1.mlp.dropout", x.shape, 2)
    torch.testing.assert_close(y, want, rtol=0, atol=0)
    assert not torch.equal(y, block(x, step=3))
    block.eval()
    assert torch.equal(block(x, step=2), block(x, step=3))


# ---------------------------------------------------------------------- helpers
@pytest.mark.parametrize("style", STYLES)
def test_block_reference_matches_model_and_names_grads(style):
    cfg = ModelConfig(style=style, dtype="float64", n_layers=2)
    model = ReferenceModel(cfg)
    x = torch.randn(2, cfg.seq_len, cfg.hidden, dtype=torch.float64)
    g = torch.randn_like(x)
    res = block_forward_reference(cfg, x, layer=1, grad_out=g)
    torch.testing.assert_close(res.out, model.blocks[1](x), rtol=0, atol=0)
    assert res.grad_input.shape == x.shape
    assert set(res.grads) == {n for n in parameter_shapes(cfg) if n.startswith("blocks.1.")}
    for part, module in (("attn", model.blocks[1].attn), ("mlp", model.blocks[1].mlp)):
        r = block_forward_reference(cfg, x, layer=1, part=part, grad_out=g)
        assert r.grads and all(n.startswith(f"blocks.1.{part}.") for n in r.grads)
        torch.testing.assert_close(r.out, module(x), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="no gradient"):
        grads_by_name(model)


# ---------------------------------------------------------------- config / data
@pytest.mark.parametrize("kwargs, tp, field", [
    (dict(heads=6), 2, "heads"),                        # 64 % 6 != 0
    (dict(heads=8), 3, "heads"),
    (dict(hidden=96, heads=6, ffn_hidden=300), 4, "heads"),
    (dict(ffn_hidden=250), 4, "ffn_hidden"),
    (dict(vocab_size=257), 2, "vocab_size"),
    (dict(style="bert"), 1, "style"),
    (dict(dtype="float16"), 1, "dtype"),
    (dict(style="llama", hidden=12, heads=4), 1, "hidden"),   # odd head width
    (dict(style="llama", dropout=0.1), 1, "dropout"),
    (dict(n_layers=0), 1, "n_layers"),
])
def test_config_validation(kwargs, tp, field):
    with pytest.raises(ValueError) as err:
        ModelConfig(**kwargs).validate(tp=tp)
    msg = str(err.value)
    assert f"ModelConfig.{field}=" in msg and "\n" not in msg


def test_config_validation_passes_and_sequence_parallel():
    assert ModelConfig().validate(tp=4) is not None
    ModelConfig.odd_shapes().validate(tp=3, sequence_parallel=True)
    with pytest.raises(ValueError, match="seq_len"):
        ModelConfig(seq_len=10).validate(tp=4, sequence_parallel=True)
    assert ModelConfig(dtype=torch.float64).dtype == "float64"


@pytest.mark.parametrize("pattern", ["random", "arithmetic"])
def test_make_batch(pattern):
    cfg = ModelConfig.odd_shapes()
    tokens, targets = make_batch(cfg, 5, seed=2, pattern=pattern)
    again, _ = make_batch(cfg, 5, seed=2, pattern=pattern)
    other, _ = make_batch(cfg, 5, seed=3, pattern=pattern)
    assert tokens.dtype == targets.dtype == torch.int64
    assert tokens.shape == targets.shape == (5, cfg.seq_len)
    assert torch.equal(tokens, again) and not torch.equal(tokens, other)
    assert torch.equal(tokens[:, 1:], targets[:, :-1])
    assert 0 <= int(tokens.min()) and int(tokens.max()) < cfg.vocab_size


def test_kept_weights_equal_drawn_ones_and_are_handed_out_as_copies(monkeypatch):
    """WORKBOOK_WEIGHT_CACHE_MB lets a process keep the weights it drew: the same values as a
    fresh draw, a new tensor each time (a lab that changes one in place changes no other), and
    never more bytes kept than the budget."""
    from workbook.model import init
    cfg = ModelConfig(n_layers=2)
    name, shape = "blocks.0.mlp.fc1.weight", init.parameter_shapes(cfg)["blocks.0.mlp.fc1.weight"]
    monkeypatch.setattr(init, "_KEPT", type(init._KEPT)())
    monkeypatch.setenv("WORKBOOK_WEIGHT_CACHE_MB", "0")
    drawn = init.full_weight(cfg, name, shape)
    assert not init._KEPT                                           # default: keep nothing
    monkeypatch.setenv("WORKBOOK_WEIGHT_CACHE_MB", "64")
    first = init.full_weight(cfg, name, shape)
    first.add_(1.0)                                                 # a lab's in-place update
    second = init.full_weight(cfg, name, shape)
    assert torch.equal(second, drawn) and second.data_ptr() != first.data_ptr()
    assert len(init._KEPT) == 1
    budget = drawn.numel() * drawn.element_size() * 1.5 / 2**20      # room for one, not two
    monkeypatch.setenv("WORKBOOK_WEIGHT_CACHE_MB", str(budget))
    other = init.full_weight(cfg, "blocks.1.mlp.fc1.weight", shape)
    assert len(init._KEPT) == 1 and torch.equal(init.full_weight(cfg, name, shape), drawn)
    assert not torch.equal(other, drawn)
