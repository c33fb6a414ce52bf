"""The capstone's traffic: what each group of the mesh moves in one step, on paper (the model
the learner's prediction is judged against) and from a trace (the link's spans carry the
global ranks of every operation), and how much of each group's link time compute hid.

Bus bytes (lesson 3; nccl-tests' convention): what one rank sends on the wire when a ring runs
the operation over ``n`` ranks::

    all-reduce of X bytes            2 (n - 1) / n * X
    all-gather into X bytes          (n - 1) / n * X        (X: the gathered output)
    reduce-scatter of X bytes        (n - 1) / n * X        (X: the whole input)
    send of X bytes                  X                      (a receive sends nothing)

``traffic_model(...)``: per group, the activations' and gradients' bus bytes a rank sends in
one step (the small all-reduces of the loss, the sequence-parallel norms and the clipping norm
aside: ``is_bulk``), with the values of the known wrong derivations; ``op_rows(records)``: a
rank's link records as plain rows; ``hidden_by_group(trace_path, mesh)``: per group, the link
time, the part of it hidden behind compute, rank skew excused.
"""
from __future__ import annotations

import json

SCALAR_BYTES = 8                 # a loss or a norm: one float64


def bus_bytes(op: str, size_bytes: int, n: int) -> float:
    """What one of ``n`` ranks sends for ``op`` of ``size_bytes`` (the module docstring)."""
    if op == "all_reduce":
        return 2 * (n - 1) / n * size_bytes
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n * size_bytes
    if op == "recv":
        return 0.0
    return float(size_bytes)


def is_bulk(kind: str, group: str, op: str, size_bytes: int) -> bool:
    """Whether an op is the activations' or gradients' traffic the model counts: TP's
    all-gathers, reduce-scatters and ring sends (not its all-reduces: the loss, the norms), PP's
    sends, DP's all-reduces bigger than a scalar."""
    if group == "TP":
        return op in ("all_gather", "reduce_scatter", "send")
    if group == "PP":
        return op == "send"
    return group == "DP" and op == "all_reduce" and size_bytes > SCALAR_BYTES


def traffic_model(kind: str, cfg, batch: int, inner: int, dp: int, micro_batches: int,
                  param_bytes: int, inner_rank: int = 0) -> tuple[dict, dict]:
    """``(model, mistakes)``: ``model`` the bus bytes the rank at ``inner_rank`` of its inner
    group sends per step in each group, ``{"TP" | "PP": ..., "DP": ...}``; ``mistakes`` per
    group ``{what the wrong derivation did: its value}``, for ``judge_prediction``."""
    item = cfg.torch_dtype.itemsize
    b, S, H, L = batch // dp, cfg.seq_len, cfg.hidden, cfg.n_layers
    dp_bytes = 2 * (dp - 1) / dp * param_bytes
    model = {"DP": dp_bytes}
    mistakes = {"DP": {
        "count the gradients' bytes once: a ring all-reduce sends each byte twice (a "
        "reduce-scatter, then an all-gather), 2 (dp - 1) / dp of them": (dp - 1) / dp * param_bytes,
        "count the payload (the gradients' bytes) instead of the bus bytes 2 (dp - 1) / dp of "
        "it": float(param_bytes),
        "count 2 x the payload: the ring sends 2 (dp - 1) / dp of it": 2.0 * param_bytes}}
    if kind == "tp":
        shard = b * (S // inner) * H * item
        model["TP"] = float((10 * L + 4) * (inner - 1) * shard)
        mistakes["TP"] = {
            "count the forward pass only: the backward runs the conjugate of each collective, "
            "and the column GEMM gathers its input again": float((4 * L + 2) * (inner - 1) * shard),
            "leave out the backward's second all-gather (the column GEMM's input, gathered again "
            "because only the shard was kept)": float((8 * L + 4) * (inner - 1) * shard),
            "send the whole [B/dp, S, H] each time: a ring sends n - 1 shards of S/n positions":
                float((10 * L + 4) * b * S * H * item),
            "leave out the embedding and the head (4 collectives at the ends of the model)":
                float(10 * L * (inner - 1) * shard),
            "use the global batch B: each replica runs B / dp rows":
                float((10 * L + 4) * (inner - 1) * shard * dp)}
    else:
        per_direction = b * S * H * item
        directions = (inner_rank < inner - 1) + (inner_rank > 0)
        model["PP"] = float(per_direction * directions)
        mistakes["PP"] = {
            "count one direction only: a middle stage sends activations forward and gradients "
            "back": float(per_direction),
            "count both directions on every stage: the first stage sends no gradient back, the "
            "last no activation forward": float(2 * per_direction),
            "send one micro-batch: each of the m micro-batches crosses the boundary":
                float(per_direction * directions / micro_batches),
            "use the global batch B: each replica runs B / dp rows":
                float(per_direction * directions * dp)}
    return model, mistakes


def rank_param_bytes(kind: str, cfg, inner: int, inner_rank: int) -> int:
    """The bytes of the parameters a rank at ``inner_rank`` holds: its TP shard of every
    parameter (``workbook.model.shard_table``), or its stage's units (the embedding on the first
    stage, ``n_layers / inner`` blocks, the final norm and the head on the last)."""
    import math as _math

    from workbook.model import parameter_shapes, shard_table
    item = cfg.torch_dtype.itemsize
    if kind == "tp":
        return item * sum(_math.prod(local) for _, _, local in shard_table(cfg, inner).values())
    k = cfg.n_layers // inner
    mine = {f"blocks.{i}." for i in range(inner_rank * k, (inner_rank + 1) * k)}
    if inner_rank == 0:
        mine.add("embed.")
    if inner_rank == inner - 1:
        mine |= {"norm_f.", "head."}
    return item * sum(_math.prod(shape) for name, shape in parameter_shapes(cfg).items()
                      if any(name.startswith(prefix) for prefix in mine))


def op_rows(records) -> list[dict]:
    """The link's records as rows ``{"op", "ranks", "bytes", "bus"}`` (barriers left out)."""
    return [{"op": r.op, "ranks": sorted(r.ranks), "bytes": r.size_bytes,
             "bus": bus_bytes(r.op, r.size_bytes, 2 if r.op in ("send", "recv") else
                              max(1, len(r.ranks)))}
            for r in records if r.op != "barrier"]


def hidden_by_group(trace_path: str, mesh) -> dict:
    """``{group: {"comm_ms", "exposed_ms", "skew_ms", "pct"}}`` of one rank's trace: for each
    group of ``mesh`` (``Mesh.group_of`` of the spans' ranks), the union of its link spans, the
    part not covered by the rank's compute, less the time a late peer excuses; ``pct`` the share
    hidden (``workbook.grading.timing.hidden_pct``)."""
    import numpy as np

    from workbook.grading.timing import hidden_pct
    from workbook.trace import intervals as iv
    from workbook.trace import load_trace
    from workbook.trace.analyse import all_compute
    trace = load_trace(trace_path)
    compute = all_compute(trace)
    events = json.load(open(trace_path))
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    late = [e for e in events if e.get("cat") == "link_late"]
    late_iv = iv.union(np.array([e["ts"] - trace.origin_us for e in late], float),
                       np.array([e["ts"] + e["dur"] - trace.origin_us for e in late], float))
    spans: dict = {}
    for e in events:
        if e.get("cat") != "link" or e.get("ph") != "X":
            continue
        group = mesh.group_of(e["args"].get("ranks") or [])
        spans.setdefault(group, []).append((e["ts"] - trace.origin_us,
                                            e["ts"] + e.get("dur", 0) - trace.origin_us))
    out = {}
    for group, pairs in spans.items():
        comm = iv.union(np.array([a for a, _ in pairs], float), np.array([b for _, b in pairs], float))
        exposed = iv.subtract(comm, compute)
        skew = iv.measure(iv.intersect(exposed, late_iv))
        comm_us, exposed_us = iv.measure(comm), iv.measure(exposed)
        out[group] = {"comm_ms": comm_us / 1e3, "exposed_ms": max(0.0, exposed_us - skew) / 1e3,
                      "skew_ms": skew / 1e3, "pct": hidden_pct(comm_us, exposed_us, skew)}
    return out
