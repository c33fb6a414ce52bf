"""The MoE reference layer (``workbook.model.moe``) against an independent formulation.

The independent one shares no code with the layer: it sorts the probabilities instead of calling
``topk``, applies the capacity rule with Python loops, writes each expert's MLP out by hand, and
runs *every* token through *every* expert, masking the results with a dense ``[T, E]`` gate::

    gate[t, e] = sum_j keep_tj * w_tj * [e_tj == e]        y = sum_e gate[:, e] * Expert_e(x)

Forward and backward must agree to 1e-12 in fp64.
"""
import math

import pytest
import torch
import torch.nn.functional as Fn

from workbook.expert_parallel import local_experts, local_moe
from workbook.model import ModelConfig, MoE, MoEConfig
from workbook.model.moe import capacity_keep

H, F_EXPERT, T = 12, 20, 24


def dense_keep(idx, E, cf, groups):
    """The capacity rule by loops: in each group, choice by choice, token by token."""
    T, k = idx.shape
    keep = torch.ones(T, k, dtype=torch.bool)
    if cf is None:
        return keep
    size = T // groups
    cap = math.ceil(cf * k * size / E)
    for g in range(groups):
        taken = [0] * E
        for j in range(k):
            for t in range(g * size, (g + 1) * size):
                e = int(idx[t, j])
                keep[t, j] = taken[e] < cap
                taken[e] += 1
    return keep


def mlp(p, prefix, x, style):
    if style == "gpt":
        h = Fn.gelu(x @ p[f"{prefix}.fc1.weight"].T + p[f"{prefix}.fc1.bias"])
        return h @ p[f"{prefix}.fc2.weight"].T + p[f"{prefix}.fc2.bias"]
    gate, up = x @ p[f"{prefix}.w_gate.weight"].T, x @ p[f"{prefix}.w_up.weight"].T
    return (Fn.silu(gate) * up) @ p[f"{prefix}.w_down.weight"].T


def dense_moe(p, x, cfg, moe, groups):
    E, k = moe.num_experts, moe.top_k
    probs = torch.softmax(x @ p["router.weight"].T, dim=-1)
    vals, idx = torch.sort(probs, dim=-1, descending=True)
    vals, idx = vals[:, :k], idx[:, :k]
    w = vals / vals.sum(dim=-1, keepdim=True)
    keep = dense_keep(idx, E, moe.capacity_factor, groups)
    gate = torch.zeros(x.shape[0], E, dtype=x.dtype)
    for j in range(k):
        gate = gate + (keep[:, j] * w[:, j]).unsqueeze(-1) * Fn.one_hot(idx[:, j], E).to(x.dtype)
    y = sum(gate[:, e:e + 1] * mlp(p, f"experts.{e}.mlp", x, cfg.style) for e in range(E))
    if moe.shared_expert:
        y = y + mlp(p, "shared.mlp", x, cfg.style)
    counts = torch.tensor([float((idx == e).sum()) for e in range(E)], dtype=x.dtype)
    aux = E * sum(counts[e] / (x.shape[0] * k) * probs[:, e].mean() for e in range(E))
    return y, keep, aux


CASES = [(style, k, cf, groups, shared)
         for style in ("gpt", "llama") for k in (1, 2)
         for cf, groups in ((None, 1), (0.5, 1), (0.75, 3)) for shared in (False, True)]


@pytest.mark.parametrize("style, k, cf, groups, shared", CASES)
def test_reference_equals_the_dense_loop(style, k, cf, groups, shared):
    cfg = ModelConfig(style=style, dtype="float64", hidden=H, heads=2, ffn_hidden=16)
    moe = MoEConfig(num_experts=4, top_k=k, capacity_factor=cf, shared_expert=shared,
                    expert_hidden=F_EXPERT)
    layer = MoE(cfg, moe, layer=1)
    gen = torch.Generator().manual_seed(k * 10 + groups)
    x = torch.randn(2, T // 2, H, generator=gen, dtype=torch.float64) * 3.0   # [B, S, H]
    g = torch.randn(2, T // 2, H, generator=gen, dtype=torch.float64)

    xr = x.clone().requires_grad_()
    y = layer(xr, groups=groups)
    y.backward(g)
    grads = {n: q.grad for n, q in layer.named_parameters()}

    p = {n: q.detach().clone().requires_grad_() for n, q in layer.named_parameters()}
    xd = x.reshape(-1, H).clone().requires_grad_()
    yd, keep, aux = dense_moe(p, xd, cfg, moe, groups)
    yd.backward(g.reshape(-1, H))

    if cf is not None:
        assert not keep.all(), "this case must drop some assignments"
    assert (y.detach().reshape(-1, H) - yd.detach()).abs().max() < 1e-12
    assert (xr.grad.reshape(-1, H) - xd.grad).abs().max() < 1e-12
    assert set(grads) == set(p)
    for name, q in p.items():
        assert (grads[name] - q.grad).abs().max() < 1e-12, name
    assert abs(layer.aux_loss.item() - aux.item()) < 1e-12


def test_parameters_are_named_and_drawn_like_the_model():
    cfg = ModelConfig(style="gpt", dtype="float64", hidden=H, heads=2, ffn_hidden=16, n_layers=2)
    moe = MoEConfig(num_experts=4, top_k=2, shared_expert=True)
    full = dict(MoE(cfg, moe, layer=1).named_parameters())
    assert "experts.3.mlp.fc2.weight" in full and full["router.weight"].shape == (4, H)
    assert full["experts.0.mlp.fc1.weight"].shape == (cfg.ffn_hidden, H)
    assert not torch.equal(full["experts.0.mlp.fc1.weight"], full["experts.1.mlp.fc1.weight"])
    # the residual outputs get GPT-2's 1 / sqrt(2 L) scale, as a block's fc2 does
    assert full["experts.2.mlp.fc2.weight"].std() < 0.7 * full["experts.2.mlp.fc1.weight"].std()
    again = dict(MoE(cfg, moe, layer=1).named_parameters())
    assert all(torch.equal(full[n], again[n]) for n in full)
    part = dict(local_moe(cfg, moe, rank=1, ep=2, layer=1).named_parameters())
    assert {n.split(".")[1] for n in part if n.startswith("experts.")} == {"2", "3"}
    assert all(torch.equal(part[n], full[n]) for n in part)
    assert list(local_experts(1, 8, 4)) == [2, 3]


def test_capacity_takes_first_choices_before_second_choices():
    idx = torch.tensor([[0, 1], [1, 0], [0, 1], [0, 1]])      # T = 4, k = 2, E = 2
    # C = ceil(0.5 * 2 * 4 / 2) = 2: expert 0 takes the first choices of tokens 0 and 2 (token 3's
    # first choice is third in line), expert 1 token 1's first choice, then token 0's second
    keep = capacity_keep(idx, 2, 0.5)
    assert keep.tolist() == [[True, True], [True, False], [True, False], [False, False]]
    # two groups of two tokens, C = ceil(0.5 * 2 * 2 / 2) = 1 in each: in the first group the
    # first choices fill both experts, so both second choices drop; in the second, token 2 takes
    # expert 0 and then expert 1, and token 3 gets neither
    assert capacity_keep(idx, 2, 0.5, groups=2).tolist() == [[True, False], [True, False],
                                                               [True, True], [False, False]]


@pytest.mark.parametrize("make, words", [
    (lambda: MoEConfig(num_experts=4, top_k=5), "top_k=5 must be between 1 and num_experts=4"),
    (lambda: MoEConfig(num_experts=6, top_k=2).validate(ep=4), "not divisible by the expert"),
    (lambda: local_experts(0, 6, 4), "num_experts=6 is not divisible"),
    (lambda: MoEConfig(capacity_factor=0), "capacity_factor=0 must be a number > 0"),
    (lambda: MoEConfig(capacity_factor=-1.5), "capacity_factor=-1.5 must be a number > 0"),
    (lambda: MoEConfig(top_k=0), "top_k=0 must be between 1"),
    (lambda: MoEConfig(top_k=True), "top_k=True must be between 1"),
    (lambda: MoEConfig(capacity_factor=float("nan")), "capacity_factor=nan must be a number > 0"),
    (lambda: MoEConfig(capacity_factor=True), "capacity_factor=True must be a number > 0"),
    (lambda: MoEConfig(num_experts=8, top_k=2).validate(ep=3), "choose num_experts as a multiple"),
    (lambda: local_moe(ModelConfig(hidden=16, heads=2), MoEConfig(num_experts=4), 0, 3),
     "num_experts=4 is not divisible by the expert-parallel size ep=3"),
])
def test_bad_input_gives_a_one_line_error(make, words):
    with pytest.raises(ValueError) as err:
        make()
    assert words in str(err.value) and "\n" not in str(err.value)
