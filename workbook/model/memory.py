"""Activation memory: the bytes autograd saves for the backward pass, by region of the model.

``saved_bytes_by_region(run, module, parallel_types)`` runs ``run()`` (a forward pass) under
``torch.autograd.graph.saved_tensors_hooks`` and adds up every tensor autograd keeps: each
storage once (views share one), parameters left out (they are weights, not activations). A
tensor saved while a module of ``parallel_types`` runs counts as ``"parallel"``, any other as
``outside`` (``"sequence"`` in the SP lab, where the rest runs on sequence shards). Shared by the
sp grader and the tp/sp figures, so both measure the same thing.

``tensor_parallel_bytes(cfg, n)`` predicts what one rank of a Megatron TP block saves, from the
single-device reference block alone: the norms, dropouts and residuals are replicated (every rank
saves them whole), and so is each parallel region's *input* (the replicated activation that f
hands to the column layers) and any constant table (causal mask, RoPE: no gradient); everything a
parallel region computes from its input is cut by n (heads/n, ffn/n). The sp grader compares the
learner's SP block with it, so lab 5 is graded without lab 4's code.
"""
from __future__ import annotations


def saved_bytes_by_region(run, module, parallel_types: tuple, outside: str = "rest") -> dict:
    """``{"parallel": bytes, outside: bytes}`` saved for backward during ``run()``."""
    out = {"parallel": 0, outside: 0}
    for kind, nbytes, _ in saved_tensors(run, module, parallel_types, outside):
        out[kind] += nbytes
    return out


def tensor_parallel_bytes(cfg, n: int, batch: int = 2, step: int = 1) -> dict:
    """``{"parallel": bytes, "sequence": bytes}`` one rank of an n-way TP block saves for
    backward (see the module docstring), predicted from ``workbook.model.Block(cfg, 0)``."""
    import torch

    from workbook.model.reference import MLP, Attention, Block
    block = Block(cfg, 0)
    x = torch.randn(batch, cfg.seq_len, cfg.hidden, dtype=cfg.torch_dtype, requires_grad=True)
    out = {"parallel": 0.0, "sequence": 0.0}
    for kind, nbytes, whole in saved_tensors(lambda: block(x, step=step), block, (Attention, MLP),
                                             "sequence"):
        out[kind] += nbytes if kind == "sequence" or whole else nbytes / n
    return out


def saved_tensors(run, module, parallel_types: tuple, outside: str) -> list:
    """``(region, bytes, same_on_every_tp_rank)`` per storage autograd saves during ``run()``.
    The last is True for a parallel region's input and for constants (no gradient: masks, RoPE)."""
    import torch
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen, region, inputs, hooks = {}, [outside], set(), []

    def enter(_module, args):
        region.append("parallel")
        inputs.add(args[0].untyped_storage().data_ptr())

    for m in module.modules():
        if isinstance(m, parallel_types):
            hooks += [m.register_forward_pre_hook(enter),
                      m.register_forward_hook(lambda *_: region.pop() and None)]

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr not in seen:
            seen[ptr] = (region[-1], t.untyped_storage().nbytes(), ptr in inputs or not t.requires_grad)
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            run()
    finally:
        for h in hooks:
            h.remove()
    return list(seen.values())
