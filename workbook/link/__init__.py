"""The simulated interconnect (a layer): the cost model, the op log, and the gloo process group.

A CPU run communicates at a real machine's cost, in slow motion (``cost_model``); every op a rank
issues is placed on the link's timeline (``op_records``) by the process group that runs it on gloo
(``gloo_backend``); ``presets`` and ``topology`` describe the machines, ``program_order`` notes
which GEMMs a rank had run when it issued and waited on each op. This package re-exports what
the rest of the workbook uses, so that ``from workbook import link`` reads ``link.set_link(...)``;
each name is imported on first use, so ``workbook.link.presets`` stays free of torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    **dict.fromkeys(("ENV_LOCAL_FLOPS", "NETWORK", "NVLINK", "PRESETS", "Fabric", "Link", "Preset",
                     "Topology", "bus_factor", "lanes", "make_link", "measure_local_flops",
                     "preset_names"), "cost_model"),
    **dict.fromkeys(("BACKEND_NAME", "CUDA_BACKEND_NAME", "LinkedProcessGroup", "LinkWork",
                     "is_link_backend", "register"), "gloo_backend"),
    **dict.fromkeys(("STATE", "OpRecord", "current_link", "measure_real_ops", "op_log",
                     "set_link"), "op_records"),
}


def __getattr__(name: str):          # PEP 562: ``link.set_link``, ``from workbook.link import X``
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
