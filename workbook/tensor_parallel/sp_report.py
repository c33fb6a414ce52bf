"""Figures of the sp lab: the same traffic as tensor parallelism, less activation memory.

One ``SPBlock`` of the lab (GPT, fp64, ``B=2``) runs forward, backward and the gradient sync
of its replicated parameters on each rank, inside ``record_function`` ranges ``"forward"``,
``"backward"`` and ``"grad_sync"``:

* **collectives per phase** and the **bus bytes** each rank sends (nccl-tests convention: an
  all-reduce of S bytes sends 2(n-1)/n S, an all-gather or reduce-scatter of the full S-byte
  buffer (n-1)/n S), beside what vanilla TP's 2 all-reduces of ``[B, S, H]`` send: the same;
* **activation memory**: bytes autograd saves for backward in one block
  (``workbook.model.memory``), this SP block measured against a TP block predicted from the
  single-device one: SP keeps the parallel regions (attention, MLP) and divides the rest (norms,
  dropout, residual) by n, so ``predicted = TP parallel + TP rest / n``.
"""
from __future__ import annotations

from workbook.measure.output import PHASE_TIMES_HEADER, phase_times, where_measured
from workbook.measure.profiled_step import run_phases

WORLD_SIZE = 2
LINK = "dgx-h100"


def run(trace_dir=None, impl=None) -> dict:
    from workbook import link
    from workbook.grading.labs import load_lab
    from workbook.model.memory import saved_bytes_by_region, tensor_parallel_bytes
    from workbook.tensor_parallel.block_case import block_case
    from workbook.tensor_parallel.mappings import sequence_range, tp_rank, tp_world_size
    lab, n = load_lab("sp", impl), tp_world_size()
    cfg, x, dy = block_case(sequence_parallel=True)
    shard = slice(*sequence_range(cfg.seq_len))
    xs, dys = x[:, shard].contiguous().requires_grad_(), dy[:, shard].contiguous()
    block = lab.SPBlock(cfg, 0, x.device)
    block(xs, step=1).backward(dys)                        # warm-up (the first backward is slow)
    block.zero_grad(set_to_none=True)
    phases = run_phases(trace_dir, "sp", {
        "forward": lambda _: block(xs, step=1),
        "backward": lambda y: y.backward(dys),
        "grad_sync": lambda _: lab.sync_sequence_parallel_grads(block)})
    xs2 = xs.detach().clone().requires_grad_()
    sp_mem = saved_bytes_by_region(lambda: block(xs2, step=1), block, (lab.SPAttention, lab.SPMLP),
                                   outside="sequence")
    tp_mem = tensor_parallel_bytes(cfg, n, batch=x.shape[0], step=1)
    sim = link.current_link()
    return {"rank": tp_rank(), "world_size": n, "elements_BSH": x.numel(), "elsize": 8,
            "block": phases, "link": sim.label if sim else None,
            "memory": {"tp": tp_mem, "sp": sp_mem,
                       "predicted_sp": tp_mem["parallel"] + tp_mem["sequence"] / n}}


def describe(results: list[dict]) -> str:
    from workbook.link import bus_factor
    from workbook.trace import canonical_collective
    first, n = results[0], len(results)
    bsh = first["elements_BSH"] * first["elsize"]
    where = where_measured(first["link"])
    lines = [f"sp figures: one SP block on {n} ranks (float64, B*S*H = {first['elements_BSH']} "
             f"elements), rank 0; {where}",
             f"{'phase':<10}{'collectives':<34}{'bus bytes':>10}{'TP bus bytes':>13}"
             + PHASE_TIMES_HEADER]
    for phase, p in first["block"].items():
        calls = {}
        for k, c in (p.get("trace_calls") or p["calls"]).items():     # one name per collective
            name = canonical_collective(k)
            d = calls.setdefault(name, {"count": 0, "bytes": 0})
            d["count"] += c["count"]
            # the flight recorder sizes a reduce-scatter by its output (one shard); the link,
            # the trace and nccl-tests by the full input buffer
            scale = n if name == "reduce_scatter" and "trace_calls" not in p else 1
            d["bytes"] += (c["bytes"] or 0) * scale
        text = ", ".join(f"{c['count']}x {k}" for k, c in calls.items()) or "none"
        bus = sum((c["bytes"] or 0) * bus_factor(k, n) for k, c in calls.items())
        tp = f"{2 * bsh * bus_factor('all_reduce', n):.0f}" if phase != "grad_sync" else "-"
        lines.append(f"{phase:<10}{text:<34}{bus:>10.0f}{tp:>13}{phase_times(p)}")
    lines.append("bus bytes: what each rank sends, nccl-tests convention (all-reduce of S bytes: "
                 "2(n-1)/n S; all-gather / reduce-scatter of the full S-byte buffer: (n-1)/n S)")
    m = first["memory"]
    tp_total = m["tp"]["parallel"] + m["tp"]["sequence"]
    sp_total = m["sp"]["parallel"] + m["sp"]["sequence"]
    lines.append(f"activation memory of one block, rank 0 (bytes saved for backward): TP (predicted) "
                 f"{tp_total:,.0f} (attention + MLP {m['tp']['parallel']:,.0f}, norms/dropout/residual "
                 f"{m['tp']['sequence']:,.0f}); SP measured {sp_total:,}, predicted "
                 f"{m['predicted_sp']:,.0f} = {m['tp']['parallel']:,.0f} + {m['tp']['sequence']:,.0f}/{n}"
                 f" ({sp_total / tp_total:.2f}x of TP, saved {tp_total - sp_total:,.0f})")
    return "\n".join(lines)
