"""The given pieces of data parallelism and the distributed optimizer, for lab ``dp_overlap``.

Data parallelism (DP) gives every rank the whole model and its own rows of the batch; after
the backward pass the ranks average their gradients, so each takes the same optimizer step that
one device would take on the whole batch (Li et al. 2020, PyTorch DDP, arXiv 2006.15704). ZeRO
(Rajbhandari et al. 2020, arXiv 1910.02054) shards what every rank would otherwise hold in
full: stage 1 the optimizer state, stage 2 the gradients too, stage 3 the parameters too.

What the lab builds on, written once here:

* ``dp_rank`` / ``dp_world_size`` / ``local_rows``: where this rank stands and its rows of
  the batch (the data-parallel group is the whole world);
* ``layer_units(model)``: the model's layers in order of use (embedding, blocks, final norm,
  head), the unit of ZeRO's per-layer communication (NeMo chunks DP traffic per layer);
* ``FlatParameters``: a group of parameters living in *one* flat buffer, and their gradients in
  another, both padded to a multiple of the world size: each parameter's ``.data`` and
  ``.grad`` are views into them, so one collective moves the whole group, in place, and ZeRO
  can free a buffer (``free_params`` / ``free_grads``) and bring it back without touching
  autograd (PyTorch FSDP does the same with its flat parameter);
* ``Trainer``: one training step around the hooks the lab writes (``finish_gradient_sync``,
  ``optimizer_step``), each phase in a ``record_function`` range of the trace;
* ``memory_by_kind(trainer)``: the bytes a rank holds, measured from the storages its model,
  gradients and optimizer really keep, and ``predicted_memory`` (the ZeRO paper's table).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function

from workbook.model import ModelConfig, ReferenceModel

ADAM = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8}       # every variant and the reference


# --------------------------------------------------------------------------- where this rank stands
def dp_rank() -> int:
    """This rank's index r in the data-parallel group (0 outside a launched rank)."""
    return dist.get_rank() if dist.is_initialized() else 0


def dp_world_size() -> int:
    """The number n of data-parallel ranks (1 outside a launched rank)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def local_rows(*tensors: torch.Tensor) -> tuple:
    """This rank's rows of each ``[B, ...]`` batch tensor: rows ``r*B/n .. (r+1)*B/n``."""
    n, r = dp_world_size(), dp_rank()
    rows = tensors[0].shape[0]
    if rows % n:
        raise ValueError(f"a batch of {rows} rows does not split over {n} data-parallel ranks: "
                         f"use a batch size that is a multiple of {n}")
    b = rows // n
    return tuple(t[r * b:(r + 1) * b] for t in tensors)          # [B, S] -> [B/n, S]


def layer_units(model: ReferenceModel) -> list[nn.Module]:
    """The model's layers in the order the forward pass uses them (backward: the reverse)."""
    return [model.embed, *model.blocks, model.norm_f, model.head]


# --------------------------------------------------------------------------- flat buffers
class FlatParameters:
    """``params`` in one flat buffer ``data [N]`` and their gradients in ``grad [N]``, N the
    total element count rounded up to a multiple of ``pad_to``; this rank's shard of either is
    ``[shard]`` (``N/n`` elements). Every parameter's ``.data`` and ``.grad`` become views into
    them, so a collective on ``data`` or ``grad`` updates the parameters in place."""

    def __init__(self, params: list[nn.Parameter], pad_to: int = 1):
        self.params = list(params)
        total = sum(p.numel() for p in self.params)
        self.numel = -(-total // pad_to) * pad_to
        first = self.params[0]
        self.data = torch.zeros(self.numel, dtype=first.dtype, device=first.device)
        self.grad = torch.zeros_like(self.data)
        self._full_bytes = self.data.untyped_storage().nbytes()
        offset = 0
        with torch.no_grad():
            for p in self.params:
                self.data[offset:offset + p.numel()].copy_(p.reshape(-1))
                p.data = self.data[offset:offset + p.numel()].view_as(p)
                p.grad = self.grad[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
        n, r = dp_world_size(), dp_rank()
        self.shard = slice(r * self.numel // n, (r + 1) * self.numel // n)

    # ZeRO frees a buffer it does not need now and brings it back before its next use: the
    # storage shrinks to 0 bytes, while the parameters' views stay attached to it
    def free_params(self) -> None:
        self.data.untyped_storage().resize_(0)

    def alloc_params(self) -> None:
        """Make room for the full parameters again (their values: what is written next)."""
        if self.data.untyped_storage().nbytes() == 0:
            self.data.untyped_storage().resize_(self._full_bytes)

    def free_grads(self) -> None:
        self.grad.untyped_storage().resize_(0)

    def zero_grads(self) -> None:
        """Make room for the full gradients again, zeroed: the next backward adds into them."""
        if self.grad.untyped_storage().nbytes() == 0:
            self.grad.untyped_storage().resize_(self._full_bytes)
        self.grad.zero_()

    def params_present(self) -> bool:
        return self.data.untyped_storage().nbytes() > 0


# --------------------------------------------------------------------------- the training step
class Trainer:
    """One data-parallel rank: the whole reference model, this rank's rows of each batch, Adam.

    ``train_step`` runs forward and backward on this rank's rows, then calls the two methods a
    variant of the lab fills in: ``finish_gradient_sync`` (after backward: every gradient the
    optimizer reads must be the average over ranks) and ``optimizer_step``. The phases are the
    trace's ``forward``, ``backward`` and ``optimizer`` ranges."""

    def __init__(self, cfg: ModelConfig, device=None):
        self.cfg, self.n, self.rank = cfg, dp_world_size(), dp_rank()
        self.model = ReferenceModel(cfg, device)
        self.units = layer_units(self.model)
        self.optimizer: torch.optim.Optimizer | None = None

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)

    def finish_gradient_sync(self) -> None:
        raise NotImplementedError

    def optimizer_step(self) -> None:
        self.optimizer.step()

    def train_step(self, tokens: torch.Tensor, targets: torch.Tensor, step: int = 0) -> torch.Tensor:
        """One step on the global batch ``[B, S]``: this rank's rows, the averaged gradient, the
        update. Returns this rank's loss (the mean over its rows)."""
        tokens, targets = local_rows(tokens, targets)            # [B, S] -> [B/n, S]
        self.zero_grad()
        with record_function("forward"):
            loss = self.model(tokens, targets, step)
        with record_function("backward"):
            loss.backward()
            self.finish_gradient_sync()
        with record_function("optimizer"):
            self.optimizer_step()
        return loss.detach()


def train_reference(cfg: ModelConfig, batches: list, device=None) -> ReferenceModel:
    """Single-device training on the whole batch, Adam as in the lab: the ground truth. The
    gradients of the last step stay in ``.grad``."""
    model = ReferenceModel(cfg, device)
    opt = torch.optim.Adam(model.parameters(), **ADAM)
    for step, (tokens, targets) in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        model(tokens.to(device), targets.to(device), step).backward()
        opt.step()
    return model


# --------------------------------------------------------------------------- memory
KINDS = ("parameters", "gradients", "optimizer")
STAGE = {"naive": 0, "bucketed": 0, "zero1": 1, "zero2": 2, "zero3": 3}   # each lab variant's
                                                                          # ZeRO stage (0: DP)


def memory_by_kind(trainer: Trainer) -> dict:
    """Bytes this rank holds, by kind, measured from the storages themselves (each counted once,
    a freed buffer as 0): the model's parameters and the optimizer's (a ZeRO shard); their
    ``.grad``; the optimizer's per-element state (Adam's two moments)."""
    seen, out = set(), dict.fromkeys(KINDS, 0)

    def add(kind, t):
        if t is None:
            return
        s = t.untyped_storage()
        if s.nbytes() and s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            out[kind] += s.nbytes()

    opt_params = [p for g in trainer.optimizer.param_groups for p in g["params"]] \
        if trainer.optimizer else []
    params = list(trainer.model.parameters()) + opt_params
    for p in params:
        add("parameters", p)
    for p in params:
        add("gradients", p.grad)
    for state in (trainer.optimizer.state.values() if trainer.optimizer else ()):
        for t in state.values():
            if torch.is_tensor(t) and t.numel() > 1:
                add("optimizer", t)
    return out


def predicted_memory(unit_numels: list[int], n: int, stage: int, element_bytes: int) -> dict:
    """The bytes one of ``n`` ranks holds between steps, by kind, with ZeRO stage 0 (plain DP),
    1, 2 or 3 and Adam (two moments per element); each unit padded to a multiple of n. With
    Psi = sum of the padded units (elements)::

        stage   parameters   gradients        optimizer
        0       Psi          Psi              2 Psi
        1       Psi          Psi + Psi/n      2 Psi/n     (the reduced shard beside the full gradient)
        2       Psi          Psi/n            2 Psi/n
        3       Psi/n        Psi/n            2 Psi/n
    """
    exact = sum(unit_numels)
    psi = sum(-(-u // n) * n for u in unit_numels) if stage else exact
    shard = psi // n
    params = shard if stage == 3 else psi
    grads = {0: exact, 1: psi + shard, 2: shard, 3: shard}[stage]
    optim = 2 * (exact if stage == 0 else shard)
    return {"parameters": params * element_bytes, "gradients": grads * element_bytes,
            "optimizer": optim * element_bytes}
