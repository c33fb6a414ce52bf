"""Figures of the sp lab: the same traffic as tensor parallelism, less activation memory.

One ``SPBlock`` of the lab (GPT, fp64, ``B=2``) runs forward, backward and the gradient sync
of its replicated parameters on each rank, inside ``record_function`` ranges ``"forward"``,
``"backward"`` and ``"grad_sync"``:

* **collectives per phase** and the **bus bytes** each rank sends (nccl-tests convention: an
  all-reduce of S bytes sends 2(n-1)/n S, an all-gather or reduce-scatter of the full S-byte
  buffer (n-1)/n S), beside what vanilla TP's 2 all-reduces of ``[B, S, H]`` send: the same;
* **activation memory**: bytes autograd saves for backward in one block (the lab's
  ``saved_activation_bytes``), lab 4's TP block against this SP block, measured and predicted:
  SP keeps the parallel regions (attention, MLP) and divides the rest (norms, dropout,
  residual) by n, so ``predicted = TP parallel + TP rest / n``.
"""
from __future__ import annotations

from workbook.reports import run_phases

WORLD_SIZE = 2
LINK = "dgx-h100"


def run(trace_dir=None, impl=None) -> dict:
    import torch

    from workbook import link
    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig
    lab, tp = load_lab("sp", impl), load_lab("tp", impl)
    rank, n, dev = lab.tp_rank(), lab.tp_world_size(), lab.rank_device()
    cfg = ModelConfig(dtype="float64", dropout=0.1)
    if cfg.heads % n or cfg.seq_len % n:
        cfg = ModelConfig.odd_shapes(dtype="float64", dropout=0.1)
    B, S, H = 2, cfg.seq_len, cfg.hidden
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, S, H, generator=g, dtype=torch.float64).to(dev)
    dy = torch.randn(B, S, H, generator=g, dtype=torch.float64).to(dev)
    block = lab.SPBlock(cfg, 0, dev)
    xs = lab.split_sequence(x).requires_grad_()
    block(xs, step=1).backward(lab.split_sequence(dy))     # warm-up (the first backward is slow)
    block.zero_grad(set_to_none=True)
    phases = run_phases(trace_dir, "sp", {
        "forward": lambda _: block(xs, step=1),
        "backward": lambda y: y.backward(lab.split_sequence(dy)),
        "grad_sync": lambda _: lab.sync_sequence_parallel_grads(block)})
    xs2 = lab.split_sequence(x).requires_grad_()
    _, sp_mem = lab.saved_activation_bytes(lambda: block(xs2, step=1), block,
                                           (lab.SPAttention, lab.SPMLP))
    tp_block, x2 = tp.TPBlock(cfg, 0, dev), x.clone().requires_grad_()
    _, tp_mem = lab.saved_activation_bytes(lambda: tp_block(x2, step=1), tp_block,
                                           (tp.TPAttention, tp.TPMLP))
    sim = link.current_link()
    return {"rank": rank, "world_size": n, "elements_BSH": B * S * H, "elsize": 8,
            "block": phases, "link": sim.label if sim else None,
            "memory": {"tp": tp_mem, "sp": sp_mem,
                       "predicted_sp": tp_mem["parallel"] + tp_mem["sequence"] / n}}


def describe(results: list[dict]) -> str:
    from workbook.link import bus_factor
    from workbook.trace import canonical_collective
    first, n = results[0], len(results)
    bsh = first["elements_BSH"] * first["elsize"]
    where = first["link"].replace("simulated", "SIMULATED", 1) if first["link"] else "gloo"
    lines = [f"sp figures: one SP block on {n} ranks (float64, B*S*H = {first['elements_BSH']} "
             f"elements), rank 0; {where}",
             f"{'phase':<10}{'collectives':<34}{'bus bytes':>10}{'TP bus bytes':>13}"
             f"{'wall ms':>9}{'comm ms':>9}{'compute ms':>11}"]
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
        comm = f"{p['comm_ms']:.2f}" if "comm_ms" in p else "-"
        comp = f"{p['compute_ms']:.2f}" if "compute_ms" in p else "-"
        lines.append(f"{phase:<10}{text:<34}{bus:>10.0f}{tp:>13}{p['ms']:>9.2f}{comm:>9}{comp:>11}")
    lines.append("bus bytes: what each rank sends, nccl-tests convention (all-reduce of S bytes: "
                 "2(n-1)/n S; all-gather / reduce-scatter of the full S-byte buffer: (n-1)/n S)")
    m = first["memory"]
    tp_total = m["tp"]["parallel"] + m["tp"]["sequence"]
    sp_total = m["sp"]["parallel"] + m["sp"]["sequence"]
    lines.append(f"activation memory of one block, rank 0 (bytes saved for backward): TP "
                 f"{tp_total:,} (attention + MLP {m['tp']['parallel']:,}, norms/dropout/residual "
                 f"{m['tp']['sequence']:,}); SP measured {sp_total:,}, predicted "
                 f"{m['predicted_sp']:,.0f} = {m['tp']['parallel']:,} + {m['tp']['sequence']:,}/{n}"
                 f" ({sp_total / tp_total:.2f}x of TP, saved {tp_total - sp_total:,})")
    return "\n".join(lines)
