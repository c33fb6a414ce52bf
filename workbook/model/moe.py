"""A mixture-of-experts (MoE) layer on one device: the reference that expert parallelism must equal.

The layer replaces a block's MLP. Each of the ``T`` tokens ``x_t`` (``[T, H]``) is sent to ``k``
of ``E`` expert MLPs by a router (Shazeer et al. 2017, arXiv 1701.06538; GShard, Lepikhin et al.
2020, arXiv 2006.16668; Switch Transformer, Fedus et al. 2021, arXiv 2101.03961)::

    p_t      = softmax(x_t Wr^T)                      router probabilities, [E]   (Wr [E, H])
    e_t1..tk = the k largest entries of p_t           the chosen experts, largest first
    w_tj     = p_t[e_tj] / sum_i p_t[e_ti]            weights renormalised over the chosen k
    y_t      = sum_j keep_tj * w_tj * Expert_{e_tj}(x_t)  (+ Shared(x_t))

Each expert (and the optional shared expert, which every token goes through, as in DeepSeekMoE,
arXiv 2401.06066) is the model's own :class:`workbook.model.reference.MLP`: GELU for the gpt
style, SwiGLU for llama. The router has no bias.

Capacity (which tokens are dropped)
-----------------------------------
With a capacity factor ``c`` each expert takes at most ``C`` tokens of a *group* of ``T_g``
tokens (GShard's groups: the tokens are cut into ``G`` equal contiguous groups, each with its own
budget; under expert parallelism a group is one rank's tokens)::

    C = ceil(c * k * T_g / E)

Inside a group, the assignments ``(t, j)`` claim an expert's ``C`` places in the order *choice
first, then token*: every token's first choice before any token's second choice (GShard,
section 2.2), and within one choice, tokens in order. The assignments past the ``C``-th are
dropped: ``keep_tj = 0``, the token simply gets less (no renormalisation after dropping; the
residual connection carries it). The rule reads only the expert ids, never a float, so a rank
that holds group ``g`` drops exactly the tokens this reference drops (:func:`capacity_keep`).

Load-balancing loss
-------------------
Switch Transformer's auxiliary loss (Fedus et al. 2021, eq. 4), with top-k counting as
Megatron-LM's ``switch_load_balancing_loss_func`` does::

    f_e = (number of assignments (t, j) with e_tj = e) / (T k)     fraction routed to e, before drops
    P_e = (1 / T) sum_t p_t[e]                                     mean router probability of e
    aux = E * sum_e f_e * P_e                                      1 when perfectly balanced

``f`` is a count (no gradient); the gradient reaches the router through ``P``. Scale it by a
coefficient (Switch: 0.01) when adding it to the loss. With ``k = 1`` the renormalised weight is
always 1, so the output gives the router no gradient and it learns from this loss alone (Switch
itself scales by the raw probability instead; Mixtral renormalises over its top 2, as here).

Parameters (names as :mod:`workbook.model.init` draws them, for layer ``i``)::

    blocks.{i}.moe.router.weight              [E, H]
    blocks.{i}.moe.experts.{e}.mlp.*          an MLP (fc1, fc2 | w_gate, w_up, w_down), F_e wide
    blocks.{i}.moe.shared.mlp.*               the shared expert (optional)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, List, Optional

import torch
from torch import nn

from .config import ModelConfig
from .init import full_weight
from .reference import MLP


@dataclass(frozen=True)
class MoEConfig:
    """The MoE options: ``num_experts`` E, ``top_k`` k, ``capacity_factor`` (None: no drops),
    ``shared_expert`` (one MLP every token goes through), ``expert_hidden`` (each expert's inner
    width F_e; None: the model's ``ffn_hidden``)."""
    num_experts: int = 4
    top_k: int = 2
    capacity_factor: Optional[float] = None
    shared_expert: bool = False
    expert_hidden: Optional[int] = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, ep: int = 1) -> "MoEConfig":
        """Check the options, and that the experts split over ``ep`` ranks; one-line errors."""
        E, k, c = self.num_experts, self.top_k, self.capacity_factor
        if not isinstance(E, int) or isinstance(E, bool) or E < 1:
            raise ValueError(f"MoEConfig.num_experts={E!r} must be a positive integer")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1 or k > E:
            raise ValueError(f"MoEConfig.top_k={k!r} must be between 1 and num_experts={E}: "
                             f"a token cannot choose more experts than there are")
        if c is not None and (isinstance(c, bool) or not (isinstance(c, (int, float)) and c > 0
                                                          and math.isfinite(c))):
            raise ValueError(f"MoEConfig.capacity_factor={c!r} must be a number > 0 "
                             f"(or None for no capacity limit)")
        if self.expert_hidden is not None and (not isinstance(self.expert_hidden, int)
                                               or self.expert_hidden < 1):
            raise ValueError(f"MoEConfig.expert_hidden={self.expert_hidden!r} must be a positive "
                             f"integer (or None for ModelConfig.ffn_hidden)")
        if not isinstance(ep, int) or ep < 1:
            raise ValueError(f"ep={ep!r} must be a positive integer")
        if E % ep:
            raise ValueError(f"MoEConfig.num_experts={E} is not divisible by the expert-parallel "
                             f"size ep={ep}: choose num_experts as a multiple of {ep}")
        return self


@dataclass
class Routing:
    """The router's decision for ``T`` tokens: ``probs [T, E]`` (softmax), ``experts [T, k]``
    (long, the chosen experts, largest probability first) and ``weights [T, k]`` (renormalised)."""
    probs: torch.Tensor
    experts: torch.Tensor
    weights: torch.Tensor


def route(x: torch.Tensor, router_weight: torch.Tensor, top_k: int) -> Routing:
    """Top-k softmax routing of ``x [T, H]`` with ``router_weight [E, H]`` (module docstring)."""
    probs = torch.softmax(x @ router_weight.T, dim=-1)            # [T, H] -> [T, E]
    top, experts = torch.topk(probs, top_k, dim=-1)               # [T, k], [T, k]
    return Routing(probs, experts, top / top.sum(dim=-1, keepdim=True))


def expert_capacity(group_tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """``C = ceil(c * k * T_g / E)``: the most assignments one expert takes from one group."""
    return math.ceil(capacity_factor * top_k * group_tokens / num_experts)


def capacity_keep(experts: torch.Tensor, num_experts: int, capacity_factor: Optional[float],
                  groups: int = 1) -> torch.Tensor:
    """Which assignments survive the capacity: bool ``[T, k]`` (module docstring, "Capacity").

    ``experts [T, k]``; the ``T`` tokens form ``groups`` equal contiguous groups. Within a group,
    an expert's places go to assignments in the order (choice j, token t)."""
    T, k = experts.shape
    if capacity_factor is None:
        return torch.ones(T, k, dtype=torch.bool, device=experts.device)
    if T % groups:
        raise ValueError(f"{T} tokens do not split into {groups} equal capacity groups")
    C = expert_capacity(T // groups, num_experts, k, capacity_factor)
    by_group = experts.reshape(groups, T // groups, k).transpose(1, 2)          # [G, k, T_g]
    onehot = nn.functional.one_hot(by_group.reshape(groups, -1), num_experts)   # [G, k*T_g, E]
    place = (onehot.cumsum(dim=1) * onehot).sum(dim=-1) - 1                     # [G, k*T_g]: 0, 1, ..
    keep = (place < C).reshape(groups, k, T // groups).transpose(1, 2)          # [G, T_g, k]
    return keep.reshape(T, k)


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Switch Transformer's auxiliary loss ``E * sum_e f_e P_e`` (module docstring)."""
    T, E = probs.shape
    counts = torch.bincount(experts.reshape(-1), minlength=E).to(probs.dtype)   # [E]
    return E * torch.sum(counts / (T * experts.shape[1]) * probs.mean(dim=0))


def sort_by_expert(experts: torch.Tensor, keep: torch.Tensor, num_experts: int):
    """The kept assignments grouped by expert: ``(token [N], slot [N], counts [E])``.

    ``token[i]`` is the token of the i-th assignment in expert order (expert 0's first, then
    expert 1's, ...; within an expert, in token order), ``slot[i]`` its flat index ``t * k + j``
    into ``weights.reshape(-1)``, and ``counts[e]`` how many expert e takes."""
    k = experts.shape[1]
    slots = torch.nonzero(keep.reshape(-1), as_tuple=True)[0]                   # kept, token order
    order = torch.sort(experts.reshape(-1)[slots], stable=True).indices
    slot = slots[order]                                                         # [N]
    counts = torch.bincount(experts.reshape(-1)[slot], minlength=num_experts)   # [E]
    return slot // k, slot, counts


def run_experts(experts: List[nn.Module], x_sorted: torch.Tensor, counts: Iterable[int]) -> torch.Tensor:
    """Expert i of ``experts`` on its run of ``counts[i]`` rows of ``x_sorted [N, H]``, in order.

    Every expert runs, on zero rows too, so each gets a gradient (zero when it got no token)."""
    pieces = torch.split(x_sorted, [int(c) for c in counts])
    return torch.cat([expert(piece) for expert, piece in zip(experts, pieces)])  # [N, H]


class _Holder(nn.Module):
    """``experts.{e}`` / ``shared``: holds one ``mlp``, so names end like a block's MLP's."""

    def __init__(self, cfg: ModelConfig, name: str):
        super().__init__()
        self.mlp = MLP(cfg, f"{name}.mlp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)


class MoE(nn.Module):
    """The MoE layer ``blocks.{layer}.moe`` (module docstring); ``forward(x, groups=1)``.

    ``x`` is ``[..., H]`` (tokens flattened in order); ``groups`` the number of capacity groups.
    After each forward, ``self.aux_loss`` is that batch's load-balancing loss (in the graph).
    ``expert_ids`` builds only those experts (an expert-parallel rank's own); such a module
    holds the same parameters under the same names, but only the full layer runs ``forward``.
    """

    def __init__(self, cfg: ModelConfig, moe: MoEConfig, layer: int = 0,
                 expert_ids: Optional[Iterable[int]] = None):
        super().__init__()
        moe.validate()
        self.cfg, self.moe, self.layer = cfg, moe, layer
        self.name = name = f"blocks.{layer}.moe"
        expert_cfg = cfg.replace(ffn_hidden=moe.expert_hidden or cfg.ffn_hidden)
        E = moe.num_experts
        self.expert_ids = list(range(E)) if expert_ids is None else sorted(int(e) for e in expert_ids)
        if any(not 0 <= e < E for e in self.expert_ids):
            raise ValueError(f"expert_ids={self.expert_ids} must lie in 0..{E - 1}")
        self.router = nn.Module()
        self.router.weight = nn.Parameter(full_weight(cfg, f"{name}.router.weight", (E, cfg.hidden)))
        self.experts = nn.ModuleDict({str(e): _Holder(expert_cfg, f"{name}.experts.{e}")
                                      for e in self.expert_ids})
        self.shared = _Holder(cfg, f"{name}.shared") if moe.shared_expert else None
        self.aux_loss: Optional[torch.Tensor] = None

    def expert_list(self) -> List[nn.Module]:
        """The experts this module holds, in expert order."""
        return [self.experts[str(e)] for e in self.expert_ids]

    def forward(self, x: torch.Tensor, groups: int = 1) -> torch.Tensor:
        E = self.moe.num_experts
        if len(self.expert_ids) != E:
            raise RuntimeError(f"this MoE holds experts {self.expert_ids} of {E}: only the full "
                               f"layer runs on one device")
        shape = x.shape
        x = x.reshape(-1, shape[-1])                                          # [T, H]
        r = route(x, self.router.weight, self.moe.top_k)
        keep = capacity_keep(r.experts, E, self.moe.capacity_factor, groups)  # [T, k]
        self.aux_loss = load_balancing_loss(r.probs, r.experts)
        token, slot, counts = sort_by_expert(r.experts, keep, E)              # [N], [N], [E]
        out = run_experts(self.expert_list(), x[token], counts)               # [N, H]
        out = out * r.weights.reshape(-1)[slot].unsqueeze(-1)                 # weight by the router
        y = torch.zeros_like(x).index_add(0, token, out)                      # un-permute: [T, H]
        if self.shared is not None:
            y = y + self.shared(x)
        return y.reshape(shape)
