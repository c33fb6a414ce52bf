"""Memory per GPU: weights, gradients, optimizer state and activations, stage by stage.

**Model state** (Megatron-LM's distributed optimizer, docs/source/distrib_optimizer.md; ZeRO,
Rajbhandari et al. 2020, arXiv 1910.02054): per weight, 2 bytes of bf16 parameter, 4 of fp32
gradient, 12 of optimizer (fp32 master copy, Adam's two moments). A GPU holds its pipeline
stage's weights cut by TP; ZeRO stage ``z`` shards over the ``n = DP x CP`` ranks that hold the
same weights (CP ranks do: they split the sequence, not the model)::

    z = 0: 2 + 4 + 12        z = 1: 2 + 4 + 12/n        z = 2: 2 + (4 + 12)/n     z = 3: 18/n

**Activations** (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", arXiv 2205.05198, counted again for a Llama block with FlashAttention, bf16,
sequence-parallel TP): per layer and micro-batch of ``b`` sequences of ``s/CP`` tokens, in units
of ``b (s/CP) h / TP`` bytes, attention keeps its norm's input 2, the projections' input 2, Q 2,
K and V ``4 k/a``, the output O 2 (FlashAttention keeps no ``s x s`` scores); the MLP keeps its
norm's input 2, its input 2, gate, up and their product ``6 f/h``::

    A_none = b (s/CP) h (12 + 4 k/a + 6 f/h) / TP
    A_selective = b (s/CP) h (10 + 4 k/a) / TP     (the MLP recomputed from its input)
    A_full = b (s/CP) h 2 / TP                     (each layer recomputed from its input,
                                                    plus one layer's A_none while it does)

**In flight** (the schedules of labs ``pp_overlap`` and ``pp_schedules``; Narayanan et al. 2021,
arXiv 2104.04473): under 1F1B stage ``i`` of ``p`` holds ``min(m, p - i)`` micro-batches;
interleaved with ``v`` chunks it warms up with ``2 (p - i - 1) + (v - 1) p`` chunk passes, so
holds ``min(v m, 2 (p - i - 1) + (v - 1) p + 1)`` chunks of ``L_i / v`` layers (stage 0 totals
``L (1 + (p-1)/(p v))`` layers' worth, Korthikanti's formula). The last stage also keeps one
micro-batch's fp32 logits, ``b (s/CP) V / TP x 4`` bytes. The busiest stage is the estimate.
"""
from __future__ import annotations

from dataclasses import dataclass

from workbook.capstone.plan_flops import head_params, layer_params
from workbook.capstone.plan_shapes import Cluster, Model, Split, layer_slots, micro_batches

GB = 1e9
STATE_BYTES = {"params": 2, "grads": 4, "optimizer": 12}


@dataclass(frozen=True)
class Memory:
    """One GPU's bytes by term, on its busiest pipeline stage, against the GPU's capacity."""
    terms: dict                  # params, grads, optimizer, activations: bytes
    stage: int
    capacity: float              # bytes

    @property
    def total(self) -> float:
        return sum(self.terms.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    @property
    def dominant(self) -> str:
        return max(self.terms, key=self.terms.get)

    def verdict(self) -> str:
        """``fits: 61.2 of 80 GB`` or ``does not fit: 95.3 GB on stage 0, 15.3 GB over 80 GB;
        the largest term: activations (60.1 GB)``."""
        total, cap = self.total / GB, self.capacity / GB
        if self.fits:
            return f"fits: {total:.1f} of {cap:g} GB (stage {self.stage})"
        over = total - cap
        return (f"does not fit: {total:.1f} GB on stage {self.stage}, "
                f"{over:.{1 if over >= 0.1 else 3}f} GB over {cap:g} GB; the largest term: "
                f"{self.dominant} ({self.terms[self.dominant] / GB:.1f} GB)")

    def to_json(self) -> dict:
        return {"gb": {k: round(v / GB, 3) for k, v in self.terms.items()},
                "total_gb": round(self.total / GB, 3), "capacity_gb": self.capacity / GB,
                "stage": self.stage, "fits": self.fits, "dominant": self.dominant}


def stage_layers(model: Model, split: Split) -> list[int]:
    """Transformer layers on each pipeline stage: ``(L + e) / p`` slots each, less the slot the
    embedding takes on the first stage and the loss on the last (when counted as layers)."""
    p = split.pp
    per = layer_slots(model, split) // p
    layers = [per] * p
    layers[0] -= int(split.embedding_as_layer)
    layers[-1] -= int(split.loss_as_layer)
    return layers


def activation_bytes_per_layer(model: Model, split: Split, recompute: str | None = None) -> float:
    """``A`` of one layer and one micro-batch on one GPU (module docstring), bf16."""
    recompute = recompute or split.recompute
    tokens = split.micro_batch * model.seq / split.cp
    g, fh = model.kv / model.heads, model.ffn / model.hidden
    units = {"none": 12 + 4 * g + 6 * fh, "selective": 10 + 4 * g, "full": 2}[recompute]
    return tokens * model.hidden * units / split.tp


def chunks_in_flight(stage: int, split: Split) -> int:
    """Micro-batch chunks stage ``stage`` holds at its peak (module docstring)."""
    p, v, m = split.pp, split.virtual, micro_batches(split)
    if v == 1:
        return min(m, p - stage)
    return min(v * m, 2 * (p - stage - 1) + (v - 1) * p + 1)


def state_bytes(params: float, split: Split) -> dict:
    """Parameters, gradients and optimizer state of ``params`` weights, ZeRO-sharded."""
    n, z = split.dp * split.cp, split.zero
    share = {"params": 1 / n if z >= 3 else 1, "grads": 1 / n if z >= 2 else 1,
             "optimizer": 1 / n if z >= 1 else 1}
    return {k: params * STATE_BYTES[k] * share[k] for k in STATE_BYTES}


def memory_per_gpu(model: Model, cluster: Cluster, split: Split) -> Memory:
    """The busiest stage's bytes per GPU (``split`` resolved: ``plan_shapes.resolve``)."""
    layers, p = stage_layers(model, split), split.pp
    a_layer = activation_bytes_per_layer(model, split)
    best = None
    for i, n_layers in enumerate(layers):
        params = n_layers * layer_params(model) / split.tp
        params += head_params(model) / split.tp * ((i == 0) + (i == p - 1))
        terms = state_bytes(params, split)
        acts = chunks_in_flight(i, split) * n_layers / split.virtual * a_layer
        if split.recompute == "full":                     # one layer rebuilt at a time
            acts += activation_bytes_per_layer(model, split, "none")
        if i == p - 1:                                    # fp32 logits of one micro-batch
            acts += split.micro_batch * model.seq / split.cp * model.vocab / split.tp * 4
        terms["activations"] = acts
        mem = Memory(terms, i, cluster.gpu_memory_gb * GB)
        if best is None or mem.total > best.total:
            best = mem
    return best
