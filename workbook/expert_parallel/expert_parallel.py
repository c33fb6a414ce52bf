"""Expert parallelism's given pieces: where each expert lives, and the token bookkeeping.

Under expert parallelism (GShard, Lepikhin et al. 2020, arXiv 2006.16668) the ``E`` experts of
an MoE layer (:mod:`workbook.model.moe`, re-exported here) are spread over ``ep`` ranks, ``E /
ep`` consecutive experts each::

    expert e lives on rank  e // (E / ep)        rank r holds experts  r E/ep .. (r+1) E/ep - 1

Every rank holds its own ``T_r`` tokens (``[T_r, H]``: its rows of the batch) and a copy of the
router (and of the shared expert, if any). A rank routes its tokens, then the tokens travel to
the ranks of their experts and back, two all-to-alls (lesson 13):

1. sort the kept assignments by expert (:func:`sort_by_expert`): rank r sends the first
   ``send[0]`` rows to rank 0, the next ``send[1]`` to rank 1, ... (:func:`rank_splits`);
2. exchange the counts per expert (an all-to-all of ``E`` integers), so that every rank knows
   how many rows it will receive from each source, for each of its experts: ``recv_counts [ep,
   E/ep]``, row s from source s;
3. the tokens' all-to-all: rank r receives, source after source, each source's rows for r's
   experts in expert order (*source-major*);
4. the local experts want their rows together (*expert-major*): :func:`expert_major_order`
   reorders them, and its inverse puts the experts' outputs back in source-major order for the
   return trip;
5. the combine: the reverse all-to-all, then each output is weighted by the router and added
   into its token's row (un-permuted).

Because a rank's tokens are one capacity group, a capacity factor drops, on each rank, exactly
the assignments the single-device layer drops with ``groups = ep`` (``workbook.model.moe``,
"Capacity"); the dropped ones never travel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from workbook.model.config import ModelConfig
from workbook.model.moe import (  # noqa: F401  (re-exported: the pieces the lab reuses)
    MoE,
    MoEConfig,
    Routing,
    capacity_keep,
    load_balancing_loss,
    route,
    run_experts,
    sort_by_expert,
)


def expert_owner(expert: int, num_experts: int, ep: int) -> int:
    """The rank that holds ``expert``: ``expert // (E / ep)``."""
    MoEConfig(num_experts, 1).validate(ep)
    return expert // (num_experts // ep)


def local_experts(rank: int, num_experts: int, ep: int) -> range:
    """The experts rank ``rank`` holds: ``rank E/ep .. (rank + 1) E/ep - 1``."""
    MoEConfig(num_experts, 1).validate(ep)
    per = num_experts // ep
    return range(rank * per, (rank + 1) * per)


def local_moe(cfg: ModelConfig, moe: MoEConfig, rank: int, ep: int, layer: int = 0) -> MoE:
    """Rank ``rank``'s part of the MoE layer: the router, its own experts (named as in the
    single-device layer, so gradients compare by name) and the shared expert, if any."""
    moe.validate(ep)
    return MoE(cfg, moe, layer, expert_ids=local_experts(rank, moe.num_experts, ep))


def rank_rows(n_rows: int, rank: int, ep: int) -> slice:
    """Rank ``rank``'s rows of a batch of ``n_rows`` tokens (equal contiguous pieces)."""
    if n_rows % ep:
        raise ValueError(f"{n_rows} tokens do not split into {ep} equal pieces: use a multiple "
                         f"of {ep} tokens")
    per = n_rows // ep
    return slice(rank * per, (rank + 1) * per)


def rank_splits(counts: torch.Tensor, ep: int) -> List[int]:
    """Rows per destination rank from rows per expert ``counts [E]``: ``ep`` ints (expert e's
    rows go to rank ``e // (E / ep)``)."""
    return [int(c) for c in counts.reshape(ep, -1).sum(dim=1)]


def expert_major_order(recv_counts: torch.Tensor) -> torch.Tensor:
    """The order that takes received rows from source-major to expert-major.

    ``recv_counts [ep, n_local]``: row s holds how many rows source s sent for each local expert;
    the received buffer lists source 0's rows (expert by expert), then source 1's, ... Returns
    ``order [M]`` (long) with ``received[order]`` listing local expert 0's rows (source by source),
    then expert 1's, ...; ``torch.argsort(order)`` is the way back."""
    ep, n_local = recv_counts.shape
    flat = [int(c) for c in recv_counts.reshape(-1)]            # source-major runs
    starts = torch.tensor([0] + flat[:-1]).cumsum(0).tolist()
    pieces = [torch.arange(starts[s * n_local + e], starts[s * n_local + e] + flat[s * n_local + e])
              for e in range(n_local) for s in range(ep)]       # expert-major
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)


@dataclass
class DispatchPlan:
    """What the combine needs from its dispatch (all on this rank).

    ``token [N]`` and ``slot [N]``: the source token and router slot (``t * k + j``) of each row
    this rank sent, in the order sent (:func:`sort_by_expert`); ``send_splits`` / ``recv_splits``:
    rows to / from each rank in the dispatch (``ep`` ints each); ``order [M]``: the received
    rows' expert-major order (:func:`expert_major_order`); ``local_counts [E/ep]``: rows per
    local expert, what :func:`run_experts` splits by."""
    token: torch.Tensor
    slot: torch.Tensor
    send_splits: List[int]
    recv_splits: List[int]
    order: torch.Tensor
    local_counts: List[int]
