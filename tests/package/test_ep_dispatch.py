"""Lab ``ep_overlap``'s distributed MoE (the reference) equals the single-device layer.

On 2 and 4 warm ranks, in fp64: each rank holds its own rows of the batch and its own experts
(``local_moe``); the output, the input's gradient and each expert's gradient must equal the
single-device layer's (``workbook.model.moe.MoE`` with ``groups = ep``, one capacity group per
rank) to 1e-12, and the router's and the shared expert's gradients summed over the ranks. The
cases cover E = 4, 8, k = 1, 2, both MLP styles, capacity drops, a shared expert, and inputs
pulled away from the last rank's experts (and from expert 0, where k experts are left) so that
the last rank receives no token at all (forward and backward), and a rank that receives some
has an expert with none. On a simulated link the token all-to-alls carry ``routed tokens x H x
8`` bytes each way.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from workbook import link
from workbook.expert_parallel import local_moe, rank_rows
from workbook.link import Link
from workbook.model import ModelConfig, MoE, MoEConfig
from workbook.model.init import full_weight


def _load_reference():
    """The lab's reference from its file, ``solutions/ep_overlap.py``."""
    path = Path(__file__).resolve().parents[2] / "solutions" / "ep_overlap.py"
    loader = importlib.machinery.SourceFileLoader("ep_overlap_reference_lab", str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


SOL = _load_reference()
H, PER_RANK = 16, 6
FAST = Link("dgx-h100", bandwidth_Bps=1e12, latency_s=0.0, local_flops=5e10, scale=1.0)

# (style, E, k, capacity factor, shared expert, skewed: the last rank's experts get no token)
CASES = {
    2: [("gpt", 4, 1, None, False, False), ("llama", 4, 2, None, True, False),
        ("gpt", 8, 2, 0.75, False, False), ("llama", 8, 1, 1.0, True, False),
        ("gpt", 4, 2, None, True, True), ("llama", 8, 2, 0.5, False, True)],
    4: [("llama", 4, 1, None, False, False), ("gpt", 8, 2, 0.75, True, False),
        ("gpt", 4, 2, None, False, True), ("llama", 8, 1, 0.5, True, True)],
}


def setup(case, ep):
    """The config, the whole batch ``x [ep * PER_RANK, H]`` and the output's gradient."""
    style, E, k, cf, shared, skewed = case
    cfg = ModelConfig(style=style, dtype="float64", hidden=H, heads=2, ffn_hidden=12)
    moe = MoEConfig(num_experts=E, top_k=k, capacity_factor=cf, shared_expert=shared)
    gen = torch.Generator().manual_seed(E * 100 + k * 10 + ep)
    x = torch.randn(ep * PER_RANK, H, generator=gen, dtype=torch.float64)
    if skewed:                  # logits + 1 for every expert but the last rank's (noise: ~0.1)
        router = full_weight(cfg, "blocks.0.moe.router.weight", (E, H))
        target = torch.ones(E, dtype=torch.float64)
        target[E - E // ep:] = 0.0
        if target.sum() - 1 >= k:           # and expert 0 too, if k experts are still favoured
            target[0] = 0.0
        x = x + torch.linalg.lstsq(router, target.unsqueeze(-1)).solution.squeeze(-1)
    g = torch.randn(ep * PER_RANK, H, generator=gen, dtype=torch.float64)
    return cfg, moe, x, g


def distributed_cases(ep_cases):
    """Every case on this rank: its output, its input's gradient, its parameters' gradients, and
    the link's record of the token all-to-alls (bytes sent, bytes received)."""
    rank, ep = dist.get_rank(), dist.get_world_size()
    link.set_link(FAST)
    results = []
    try:
        for case in ep_cases:
            cfg, moe, x, g = setup(case, ep)
            rows = rank_rows(x.shape[0], rank, ep)
            layer = local_moe(cfg, moe, rank, ep)
            xr = x[rows].clone().requires_grad_()
            before = len(link.op_log())
            y = SOL.ep_moe(layer, xr)
            y.backward(g[rows])
            a2a = [(r.size_bytes, r.recv_bytes) for r in link.op_log()[before:]
                   if r.op == "all_to_all"]
            grads = {n: p.grad.clone() for n, p in layer.named_parameters()}
            results.append((y.detach(), xr.grad, grads, a2a))
    finally:
        link.set_link(None)
    return results


def reference(case, ep):
    cfg, moe, x, g = setup(case, ep)
    layer = MoE(cfg, moe)
    xr = x.clone().requires_grad_()
    y = layer(xr, groups=ep)
    y.backward(g)
    return layer, y.detach(), xr.grad


def close(got, want, what):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}"
    err = (got - want).abs().max().item() if got.numel() else 0.0
    assert err < 1e-12, f"{what}: max error {err:.3g}"


@pytest.mark.parametrize("ep", sorted(CASES))
def test_distributed_moe_equals_the_reference(ep):
    from workbook.runtime import launch
    per_rank = launch.run(distributed_cases, ep, CASES[ep], backend="gloo", pool=True)
    idle_experts = 0
    for c, case in enumerate(CASES[ep]):
        layer, y, gx = reference(case, ep)
        want = {n: p.grad for n, p in layer.named_parameters()}
        summed = {}
        received_tokens = []
        for rank in range(ep):
            got_y, got_gx, grads, a2a = per_rank[rank][c]
            rows = rank_rows(y.shape[0], rank, ep)
            where = f"case {case}, rank {rank}"
            close(got_y, y[rows], f"{where}: output")
            close(got_gx, gx[rows], f"{where}: input gradient")
            for name, grad in grads.items():
                if name.startswith("experts."):
                    close(grad, want[name], f"{where}: {name}")
                else:
                    summed[name] = summed.get(name, 0) + grad
            # forward: counts, dispatch, combine; backward: the two token exchanges reversed
            assert len(a2a) == 5, f"{where}: {len(a2a)} all-to-alls, want 5"
            (counts_b, _), (disp_sent, disp_recv), (comb_sent, comb_recv) = a2a[:3]
            assert counts_b == case[1] * 8, f"{where}: the counts are E int64"
            assert (comb_sent, comb_recv) == (disp_recv, disp_sent)
            assert a2a[3] == (disp_sent, disp_recv) and a2a[4] == (disp_recv, disp_sent)
            assert disp_sent % (H * 8) == 0
            received_tokens.append(disp_recv // (H * 8))
        for name, grad in summed.items():
            close(grad, want[name], f"case {case}: {name} summed over the ranks")
        assert set(summed) | {n for n in want if n.startswith("experts.")} == set(want)
        per_expert = _kept_per_expert(layer, case, ep)
        assert received_tokens == [int(c) for c in per_expert.view(ep, -1).sum(dim=1)], \
            f"case {case}: ranks received {received_tokens} rows, want {per_expert.tolist()}"
        if case[5]:
            assert received_tokens[-1] == 0, f"case {case}: the last rank received tokens"
        idle_experts += sum(1 for r in range(ep) if received_tokens[r]
                            and (per_expert.view(ep, -1)[r] == 0).any())
    assert idle_experts, "no case has an expert without a token on a rank that gets some"


def _kept_per_expert(layer, case, ep) -> torch.Tensor:
    """How many assignments the reference keeps for each expert (each travels once to it)."""
    from workbook.model.moe import capacity_keep, route
    _, moe, x, _ = setup(case, ep)
    r = route(x, layer.router.weight.detach(), moe.top_k)
    keep = capacity_keep(r.experts, moe.num_experts, moe.capacity_factor, ep)
    return torch.bincount(r.experts[keep], minlength=moe.num_experts)
