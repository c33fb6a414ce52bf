"""Family: expert parallelism (lab ``ep_overlap``): the given pieces of a mixture-of-experts
layer spread over ranks (``expert_parallel``: where each expert lives, the token bookkeeping
around the all-to-alls, and the single-device layer they must equal, re-exported from
``workbook.model.moe``), ``deferred_wgrad`` (the experts' backward in two: the input gradient now,
the weight gradients later) and ``two_batch`` (the two-micro-batch actions and the schedule
check, pure) with ``two_batch_executor`` (what runs a schedule on the ranks).

A family imports the layers below it, never another family. This ``__init__`` only re-exports
the given pieces, each imported on first use (so a family's bench or report imports no torch
until it needs it).
"""
from __future__ import annotations

import importlib

_GIVEN = dict.fromkeys((
    "DispatchPlan", "MoE", "MoEConfig", "Routing", "capacity_keep", "expert_major_order",
    "expert_owner", "load_balancing_loss", "local_experts", "local_moe", "rank_rows",
    "rank_splits", "route", "run_experts", "sort_by_expert"
), "expert_parallel") | dict.fromkeys((
    "ExpertGradStore", "mlp_deferred", "run_experts_deferred"
), "deferred_wgrad") | dict.fromkeys((
    "Action", "ScheduleError", "check_schedule", "exposed_transfers", "layer_actions"
), "two_batch") | {"TwoBatchExecutor": "two_batch_executor"}


def __getattr__(name: str):          # PEP 562: ``from workbook.expert_parallel import X``
    if name not in _GIVEN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_GIVEN[name]}"), name)
