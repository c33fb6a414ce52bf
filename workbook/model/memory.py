"""Activation memory: the bytes autograd saves for the backward pass, by region of the model.

``saved_bytes_by_region(run, module, parallel_types)`` runs ``run()`` (a forward pass) under
``torch.autograd.graph.saved_tensors_hooks`` and adds up every tensor autograd keeps: each
storage once (views share one), parameters left out (they are weights, not activations). A
tensor saved while a module of ``parallel_types`` runs counts as ``"parallel"``, any other as
``outside`` (``"sequence"`` in the SP lab, where the rest runs on sequence shards). Shared by the
sp grader and the tp/sp figures, so both measure the same thing.
"""
from __future__ import annotations


def saved_bytes_by_region(run, module, parallel_types: tuple, outside: str = "rest") -> dict:
    """``{"parallel": bytes, outside: bytes}`` saved for backward during ``run()``."""
    import torch
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen, region, hooks = {}, [outside], []
    for m in module.modules():
        if isinstance(m, parallel_types):
            hooks += [m.register_forward_pre_hook(lambda *_: region.append("parallel")),
                      m.register_forward_hook(lambda *_: region.pop() and None)]

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and storage.data_ptr() not in seen:
            seen[storage.data_ptr()] = (region[-1], storage.nbytes())
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            run()
    finally:
        for h in hooks:
            h.remove()
    out = {"parallel": 0, outside: 0}
    for kind, nbytes in seen.values():
        out[kind] += nbytes
    return out
