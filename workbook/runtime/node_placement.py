"""Where tensor and data parallelism go when ranks span nodes: measured on ranks.

Lesson 7's section on nodes. Four ranks form two simulated nodes of two (``launch.run(...,
nnodes=2)``) on a link with NVLink inside a node and one network card per rank between them
(``workbook.link.topology``). Two layouts of the same 2 x 2 job:

* ``tp_inside``: TP groups ``{0, 1}`` and ``{2, 3}`` (each inside a node), DP groups ``{0, 2}``
  and ``{1, 3}`` (across nodes) -- Megatron-LM's order, TP the innermost dimension;
* ``tp_across``: TP groups ``{0, 2}`` and ``{1, 3}``, DP groups ``{0, 1}`` and ``{2, 3}``.

One training step's traffic per rank: a tensor-parallel all-reduce of the activations
``[tokens, hidden]`` after each attention and MLP block, forward and backward
(``4 * layers`` all-reduces, Megatron-LM's f and g), then one data-parallel all-reduce of the
rank's gradients (``12 * hidden^2 / tp`` parameters per layer). TP's bytes grow with the tokens
of a step, DP's with the model only: with thousands of tokens per step, TP moves far more, and
it sits on the critical path (each all-reduce is waited on before the next layer), while DP's
can hide behind the backward pass (lesson 9). So TP belongs on the fast fabric.

``measure_layouts`` runs the step's collectives (no compute: this is about the fabric) and
returns, per layout and per kind, the time the ranks waited and the time the link modelled.
"""
from __future__ import annotations

LAYOUTS = {
    # name: (TP groups, DP groups) of 4 ranks on 2 nodes of 2
    "tp_inside": ([[0, 1], [2, 3]], [[0, 2], [1, 3]]),
    "tp_across": ([[0, 2], [1, 3]], [[0, 1], [2, 3]]),
}


def step_bytes(tokens: int, hidden: int, layers: int, tp: int = 2) -> dict:
    """Bytes (fp32) of one step's all-reduces per rank: ``tp`` (each one) and ``dp`` (once)."""
    return {"tp": tokens * hidden * 4, "tp_count": 4 * layers,
            "dp": layers * 12 * hidden * hidden // tp * 4, "dp_count": 1}


def _groups(dist, pairs):
    """Every rank creates every group, in the same order (``new_group`` is collective)."""
    return [(ranks, dist.new_group(ranks)) for ranks in pairs]


def measure_layouts(tokens: int = 2048, hidden: int = 128, layers: int = 2, repeats: int = 2):
    """On each of 4 ranks in 2 nodes: per layout, ``{"tp_ms", "tp_model_ms", "dp_ms",
    "dp_model_ms"}`` of one step (medians over ``repeats``), and the link's label."""
    import statistics
    import time

    import torch
    import torch.distributed as dist

    from workbook import link
    from workbook.runtime import launch
    rank, lk = launch.context().rank, link.current_link()
    sizes = step_bytes(tokens, hidden, layers)
    act = torch.zeros(sizes["tp"] // 4)                        # [tokens * hidden]
    grads = torch.zeros(sizes["dp"] // 4)                      # [layers * 12 h^2 / tp]
    out = {"label": lk.label if lk else "no link", "node": launch.context().node}
    for name, (tp_pairs, dp_pairs) in LAYOUTS.items():
        tp_ranks, tp = next((ranks, g) for ranks, g in _groups(dist, tp_pairs) if rank in ranks)
        dp_ranks, dp = next((ranks, g) for ranks, g in _groups(dist, dp_pairs) if rank in ranks)
        runs = {"tp_ms": [], "dp_ms": []}
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(sizes["tp_count"]):                 # f and g, forward and backward
                dist.all_reduce(act, group=tp)
            t1 = time.perf_counter()
            dist.all_reduce(grads, group=dp)                   # the gradients, once a step
            t2 = time.perf_counter()
            runs["tp_ms"].append((t1 - t0) * 1e3)
            runs["dp_ms"].append((t2 - t1) * 1e3)
        model = (lambda size, ranks: lk.op_time("all_reduce", size, ranks) * 1e3 if lk else 0.0)
        out[name] = {"tp_ms": statistics.median(runs["tp_ms"]),
                     "dp_ms": statistics.median(runs["dp_ms"]),
                     "tp_model_ms": sizes["tp_count"] * model(sizes["tp"], tp_ranks),
                     "dp_model_ms": model(sizes["dp"], dp_ranks),
                     "tp_group": tp_ranks, "dp_group": dp_ranks}
    return out


def table(results: list[dict]) -> str:
    """The slowest rank's times per layout: TP's all-reduces, DP's, and the step's sum."""
    lines = [f"{'layout':<11}{'TP group':>10}{'TP ms':>8}{'model':>8}{'DP group':>10}{'DP ms':>8}"
             f"{'model':>8}{'comm/step':>11}"]
    for name in LAYOUTS:
        rows = [r[name] for r in results]
        tp, dp = max(r["tp_ms"] for r in rows), max(r["dp_ms"] for r in rows)
        r0 = rows[0]
        lines.append(f"{name:<11}{str(r0['tp_group']):>10}{tp:>8.0f}{r0['tp_model_ms']:>8.0f}"
                     f"{str(r0['dp_group']):>10}{dp:>8.0f}{r0['dp_model_ms']:>8.0f}{tp + dp:>11.0f}")
    return "\n".join(lines)
