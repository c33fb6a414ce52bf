"""FLOPs of a Llama-style model: lab ``overlap_math``'s counts, with grouped-query attention.

Parameters of one layer (biases and norms left out, lesson 7, "Compute: FLOPs of one layer"):
the query and output projections ``h x h``, the key and value projections ``h x (k d)`` (``k``
KV heads of ``d = h / a``), and SwiGLU's gate, up and down projections ``h x f``::

    P_layer = 2 h^2 + 2 h k d + 3 h f

A linear layer costs 2 FLOPs per weight per token forward, twice that backward, so training
costs ``6 N`` FLOPs per token (Kaplan et al. 2020, arXiv 2001.08361; the Ultra-Scale Playbook)
with ``N = L P_layer + h V`` (the output head is a GEMM; the embedding is a lookup, no FLOPs).
Attention adds the two products without weights, ``Q K^T`` and ``softmax(.) V``: ``2 s^2 h`` FLOPs
each per sequence forward, halved by the causal mask (FlashAttention's causal kernels skip the
masked blocks, Dao 2023, arXiv 2307.08691), so per token and layer ``2 s h`` forward and
``6 s h`` in training. The model FLOPs of one training step of ``T`` tokens::

    F_step = T (6 N + 6 L s h)

MFU (Chowdhery et al. 2022, PaLM, arXiv 2204.02311, appendix B) is ``F_step / (step time x
GPUs x peak)``; recomputed FLOPs are executed but not counted (that would be HFU).
"""
from __future__ import annotations

from workbook.capstone.plan_shapes import Model


def layer_params(model: Model) -> int:
    """``P_layer = 2 h^2 + 2 h k d + 3 h f`` (module docstring)."""
    h = model.hidden
    return 2 * h * h + 2 * h * model.kv * model.head_dim + 3 * h * model.ffn


def mlp_params(model: Model) -> int:
    """SwiGLU's three matrices, ``3 h f``: what a selective recompute of the MLP runs again."""
    return 3 * model.hidden * model.ffn


def head_params(model: Model) -> int:
    """The output head (and, the same size, the input embedding): ``h V``."""
    return model.hidden * model.vocab


def total_params(model: Model) -> int:
    """Every weight: the layers, the embedding and the output head (untied)."""
    return model.layers * layer_params(model) + 2 * head_params(model)


def linear_flops(tokens: float, params: float) -> float:
    """Forward FLOPs of GEMMs holding ``params`` weights over ``tokens`` tokens: ``2 T P``."""
    return 2.0 * tokens * params


def attention_flops(sequences: float, seq: int, model: Model) -> float:
    """Forward FLOPs of ``Q K^T`` and ``softmax(.) V`` for ``sequences`` whole causal
    sequences: ``2 x 2 s^2 (a d) / 2 = 2 s^2 h`` each."""
    return 2.0 * sequences * seq * seq * model.heads * model.head_dim


def model_flops_per_token(model: Model) -> float:
    """``6 N + 6 L s h``: the training FLOPs per token MFU counts (module docstring)."""
    n = model.layers * layer_params(model) + head_params(model)
    return 6.0 * n + 6.0 * model.layers * model.seq * model.heads * model.head_dim
