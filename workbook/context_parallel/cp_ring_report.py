"""Figures of the cp_ring lab: how much of ring attention's K/V traffic hides, and what the
zig-zag split buys under the causal mask.

On 2 ranks over the simulated dgx-h100 link, the lab's ``ring_attention`` (fp32, ``BATCH`` x
``SEQ`` tokens, ``HEADS`` heads of width ``HEAD_DIM``) takes one profiled step (forward and
backward) on each split, after a warm-up step:

* **causal work** per rank: the unmasked score entries of its queries (``Layout.causal_work``),
  the most over the mean: the contiguous split gives the last rank the most, the zig-zag split
  (the lab's ``zigzag_layout``) the same to every rank;
* **per ring step**, the forward attention each rank computes at that step (the lab's
  ``block_pairs`` through the given ``block_forward``, timed alone) beside one K/V hop's modelled
  time: a hop hides when the step's attention outlasts it;
* **step ms** (the slower rank's forward + backward, the faster of the warm-up and the profiled
  step), **link ms** (modelled, both passes),
  **hidden %** of each pass's link time (from the trace, rank skew excused, the lower rank's) and
  the **exposed ms** nothing hid (skew excused). The backward pass's last dK/dV hop, which brings
  each rank its own sum, has nothing left to hide behind.
"""
from __future__ import annotations

from workbook.measure.output import where_measured

WORLD_SIZE = 2
LINK = "dgx-h100"
BATCH, HEADS, SEQ, HEAD_DIM = 1, 4, 4096, 64
SPLITS = ("contiguous", "zigzag")


def _step_attention_ms(lab, layout, q, k, v, rank: int) -> list[float]:
    """Per ring step t, the forward attention this rank computes (timed alone, no ring; the
    faster of two runs)."""
    import time

    from workbook.context_parallel import block_forward
    out = []
    for step in range(layout.n):
        src, best = (rank - step) % layout.n, float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            for q_rows, kv_rows, causal in lab.block_pairs(layout, rank, src):
                block_forward(q[:, :, q_rows], k[:, :, kv_rows], v[:, :, kv_rows], causal)
            best = min(best, (time.perf_counter() - t0) * 1e3)
        out.append(best)
    return out


def run(trace_dir=None, impl=None) -> dict:
    import tempfile
    import time
    from contextlib import nullcontext
    from pathlib import Path

    import torch
    import torch.distributed as dist
    from torch.profiler import record_function

    from workbook import link, trace
    from workbook.context_parallel import contiguous_layout
    from workbook.measure.calibration import recalibrate
    from workbook.grading.labs import load_lab
    from workbook.runtime import ranks
    from workbook.trace.capture import rank_trace
    lab = load_lab("cp_ring", impl)
    rank, n, dev = dist.get_rank(), dist.get_world_size(), ranks.device()
    layouts = {"contiguous": contiguous_layout(SEQ, n), "zigzag": lab.zigzag_layout(SEQ, n)}
    g = torch.Generator().manual_seed(rank)
    q, k, v, do = (torch.randn(BATCH, HEADS, SEQ // n, HEAD_DIM, generator=g).to(dev)
                   for _ in range(4))
    if link.current_link():
        recalibrate()                                 # the matmul rate now
    lk = link.current_link()
    hop_bytes = 2 * q.numel() * q.element_size()
    root = Path(trace_dir or tempfile.mkdtemp(prefix="cp_ring-report-"))
    out = {"rank": rank, "link": lk.label if lk else None, "trace_dir": str(root),
           "hop_bytes": hop_bytes, "hop_ms": lk.op_time("send", hop_bytes, n) * 1e3 if lk else 0.0,
           "splits": {}}

    def step(layout, traced: bool):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        dist.barrier()
        t0 = time.perf_counter()
        with record_function("forward") if traced else nullcontext():
            y = lab.ring_attention(qq, kk, vv, layout)
        with record_function("backward") if traced else nullcontext():
            y.backward(do)
        return (time.perf_counter() - t0) * 1e3

    for split, layout in layouts.items():
        warm_ms = step(layout, False)                 # warm-up
        row = out["splits"][split] = {
            "work": layout.causal_work(), "chunks": layout.chunks,
            "step_attention_ms": _step_attention_ms(lab, layout, q, k, v, rank)}
        before = len(link.op_log())
        with rank_trace(root / split, lab="cp_ring"):
            row["step_ms"] = min(warm_ms, step(layout, True))     # the less disturbed of the two
        row["link_ms"] = sum(r.link_ns for r in link.op_log()[before:] if r.op != "barrier") / 1e6
        t = trace.load_trace(root / split / f"rank{rank}.trace.json")
        for phase in ("forward", "backward"):
            o = trace.overlap(t, within=phase)
            row[f"{phase}_pct"] = o.overlap_pct_ex_skew
            row["exposed_ms"] = row.get("exposed_ms", 0.0) + (o.exposed_comm_us - o.skew_us) / 1e3
    return out


def describe(results: list[dict]) -> str:
    first, n = results[0], len(results)
    lines = [f"cp_ring figures: ring attention, {BATCH}x{SEQ} tokens, {HEADS} heads of {HEAD_DIM}, "
             f"fp32, on {n} ranks; {where_measured(first['link'])}",
             f"one K/V hop = 2*B*h*(S/n)*d*4 = {first['hop_bytes'] / 1e6:.1f} MB: "
             f"{first['hop_ms']:.0f} ms on the link",
             f"{'split':<12}{'causal work per rank (M)':<28}{'max/mean':>9}{'step ms':>9}"
             f"{'link ms':>9}{'exposed':>9}{'fwd hid%':>9}{'bwd hid%':>9}"]
    for split in SPLITS:
        rows = [r["splits"][split] for r in results]
        work = rows[0]["work"]
        pct = [min(r[f"{p}_pct"] or 0.0 for r in rows) for p in ("forward", "backward")]
        lines.append(f"{split:<12}{' / '.join(f'{w / 1e6:.2f}' for w in work):<28}"
                     f"{max(work) / (sum(work) / len(work)):>9.2f}"
                     f"{max(r['step_ms'] for r in rows):>9.0f}{max(r['link_ms'] for r in rows):>9.0f}"
                     f"{max(r['exposed_ms'] for r in rows):>9.0f}{pct[0]:>9.0f}{pct[1]:>9.0f}")
    lines.append("forward attention per ring step, each rank (timed alone) vs one hop "
                 f"({first['hop_ms']:.0f} ms): a hop hides behind a step that outlasts it")
    for split in SPLITS:
        steps = []
        for t in range(n):
            ms = " ".join(f"{r['splits'][split]['step_attention_ms'][t]:4.0f}" for r in results)
            steps.append(f"step {t}: {ms}")
        lines.append(f"  {split:<10} " + " | ".join(steps))
    lines.append("step ms: the slower rank's forward + backward; exposed: what nothing hid (the "
                 "backward's last dK/dV hop has nothing to hide behind); hidden %: the lower rank's"
                 f"; traces: {first['trace_dir']}/SPLIT")
    return "\n".join(lines)
