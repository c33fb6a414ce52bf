"""Figures of the tp lab: what one tensor-parallel block communicates and what it stores.

One ``TPBlock`` of the lab (GPT, fp64, ``B=2``, the default small shapes) runs a forward and a
backward pass on each rank, inside ``record_function("forward")`` / ``("backward")``:

* **collectives per phase**: what the rank called (flight recorder; from the trace when
  ``trace_dir`` is given, with the time the link carried them and the time the rank computed).
  Megatron's count is 2 all-reduces of ``B*S*H`` forward (g after attention and the MLP) and
  2 backward (f before each);
* **activation memory per rank**: the bytes autograd saves for backward in one block, against
  the single-device block. The parallel regions (attention, MLP) shrink by n; the norms,
  dropouts and residuals do not: every rank keeps them whole (lab 5 shards them).
"""
from __future__ import annotations

from workbook.model.memory import saved_bytes_by_region
from workbook.measure.output import PHASE_TIMES_HEADER, phase_times, where_measured
from workbook.measure.profiled_step import run_phases

WORLD_SIZE = 2
LINK = "dgx-h100"


def run(trace_dir=None, impl=None) -> dict:
    from workbook import link
    from workbook.grading.labs import load_lab
    from workbook.model import Block
    from workbook.model.reference import MLP, Attention
    from workbook.tensor_parallel.block_case import block_case
    from workbook.tensor_parallel.mappings import tp_rank, tp_world_size
    lab = load_lab("tp", impl)
    cfg, x, dy = block_case()
    x.requires_grad_()
    block = lab.TPBlock(cfg, 0, x.device)
    block(x, step=1).backward(dy)                          # warm-up (the first backward is slow)
    phases = run_phases(trace_dir, "tp", {"forward": lambda _: block(x, step=1),
                                          "backward": lambda y: y.backward(dy)})
    x2 = x.detach().clone().requires_grad_()
    ref = Block(cfg, 0).to(x.device)
    memory = {"tp": saved_bytes_by_region(lambda: block(x2, step=1), block,
                                          (lab.TPAttention, lab.TPMLP)),
              "reference": saved_bytes_by_region(lambda: ref(x2, step=1), ref, (Attention, MLP))}
    sim = link.current_link()
    return {"rank": tp_rank(), "world_size": tp_world_size(), "elements_BSH": x.numel(),
            "dtype": cfg.dtype, "block": phases, "memory": memory,
            "link": sim.label if sim else None}


def describe(results: list[dict]) -> str:
    first, n = results[0], len(results)
    where = where_measured(first["link"])
    lines = [f"tp figures: one TP block on {n} ranks ({first['dtype']}, B*S*H = "
             f"{first['elements_BSH']} elements), rank 0; {where}",
             f"{'phase':<10}{'collectives':<30}{'bytes':>10}" + PHASE_TIMES_HEADER]
    for phase, p in first["block"].items():
        calls = p.get("trace_calls") or p["calls"]
        text = ", ".join(f"{c['count']}x {k}" for k, c in calls.items()) or "none"
        nbytes = sum((c["bytes"] or 0) for c in calls.values())
        lines.append(f"{phase:<10}{text:<30}{nbytes:>10}{phase_times(p)}")
    if "trace_calls" not in first["block"]["forward"]:
        lines.append("(collectives from the flight recorder; --trace-dir adds comm and compute "
                     "time from the trace)")
    lines.append("activation memory per rank (bytes autograd saves for backward in one block):")
    for r in results:
        tp, ref = r["memory"]["tp"], r["memory"]["reference"]
        lines.append(f"  rank {r['rank']}: TP {tp['parallel'] + tp['rest']:,} (attention + MLP "
                     f"{tp['parallel']:,}, norms/dropout/residual {tp['rest']:,}); one device "
                     f"{ref['parallel'] + ref['rest']:,} ({ref['parallel']:,} + {ref['rest']:,})")
    return "\n".join(lines)
