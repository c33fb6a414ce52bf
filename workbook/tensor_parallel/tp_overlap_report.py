"""Figures of the tp_overlap lab: how much of SP's communication hides inside the GEMMs.

On 2 ranks over the simulated dgx-h100 link, one ``OverlapBlock`` of the lab (GPT, hidden
``HIDDEN``, ffn 4x, ``BATCH`` x ``SEQ`` tokens, fp32) runs a training step (forward, backward)
under each variant of ``VARIANTS``:

* ``sp``: plain sequence parallelism, every all-gather and reduce-scatter waited on at once;
* ``bulk``: the column-parallel backward sends its input's all-gather during the dgrad GEMM and
  dgrad's reduce-scatter during the wgrad GEMM;
* ``pipelined``: ring exchanges inside the GEMMs (forward, and the row-parallel dgrad);
* ``pipelined+bulk``: both.

Per variant: **link ms** (the time the link was busy in the step: a ring step's send and
receive travel at once, in opposite directions, and count once), **hidden %** of the
forward and the backward pass's link time (from the profiled step's trace, rank skew excused:
``Metrics.overlap_pct_ex_skew``) and the **exposed ms** nothing hid (skew excused): the time a
perfect overlap would still win back. Step times are the benchmark's: ``workbook bench
tp_overlap`` compares the same variants with Domino and the no-communication optimum, several
measured steps each.
"""
from __future__ import annotations

from workbook.measure.output import where_measured

WORLD_SIZE = 2
LINK = "dgx-h100"
HIDDEN, HEADS, BATCH, SEQ = 2048, 16, 1, 512
VARIANTS = ("sp", "bulk", "pipelined", "pipelined+bulk")


def run(trace_dir=None, impl=None) -> dict:
    import tempfile
    from contextlib import nullcontext

    import torch
    import torch.distributed as dist
    from torch.profiler import record_function

    from workbook import link, trace
    from workbook.measure.calibration import recalibrate
    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig
    from workbook.runtime import ranks
    from workbook.trace.capture import rank_trace
    lab = load_lab("tp_overlap", impl)
    rank, n, dev = dist.get_rank(), dist.get_world_size(), ranks.device()
    recalibrate()
    cfg = ModelConfig(hidden=HIDDEN, heads=HEADS, ffn_hidden=4 * HIDDEN, n_layers=1, seq_len=SEQ,
                      vocab_size=256, dtype="float32")
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, SEQ // n, HIDDEN, generator=g).to(dev).requires_grad_()
    dy = torch.randn(BATCH, SEQ // n, HIDDEN, generator=g).to(dev)
    blocks = {v: lab.OverlapBlock(cfg, 0, dev, lab.VARIANTS[v]) for v in VARIANTS}

    def step(variant, traced=False):
        with record_function(f"{variant} forward") if traced else nullcontext():
            y = blocks[variant](x, step=1)
        with record_function(f"{variant} backward") if traced else nullcontext():
            y.backward(dy)
        blocks[variant].zero_grad(set_to_none=True)

    for v in VARIANTS:                               # warm-up
        step(v)
    out = {"rank": rank, "world_size": n, "link": link.current_link().label
           if link.current_link() else None, "variants": {}}
    run_dir = trace_dir or tempfile.mkdtemp(prefix="tp_overlap-report-")
    with rank_trace(run_dir, lab="tp_overlap"):
        for v in VARIANTS:
            dist.barrier()
            before = len(link.op_log())
            step(v, traced=True)
            ops = [r for r in link.op_log()[before:] if r.op != "barrier"]
            out["variants"][v] = {"ops": sorted({r.op for r in ops})}
    t = trace.load_trace(f"{run_dir}/rank{rank}.trace.json")
    for v in VARIANTS:
        row = out["variants"][v]
        for phase in ("forward", "backward"):
            o = trace.overlap(t, within=f"{v} {phase}")
            row[f"{phase}_pct"] = o.overlap_pct_ex_skew
            row["link_ms"] = row.get("link_ms", 0.0) + o.comm_us / 1e3
            row["exposed_ms"] = row.get("exposed_ms", 0.0) + (o.exposed_comm_us - o.skew_us) / 1e3
    return out


def describe(results: list[dict]) -> str:
    first = results[0]
    lines = [f"tp_overlap figures: one OverlapBlock (GPT, hidden {HIDDEN}, {BATCH}x{SEQ} tokens, "
             f"fp32) on {len(results)} ranks; {where_measured(first['link'])}",
             f"{'variant':<16}{'link ms':>9}{'exposed':>9}{'fwd hid%':>10}{'bwd hid%':>10}  ops"]
    for v in VARIANTS:
        rows = [r["variants"][v] for r in results]
        pct = [min(r[f"{p}_pct"] or 0.0 for r in rows) for p in ("forward", "backward")]
        lines.append(f"{v:<16}{max(r['link_ms'] for r in rows):>9.0f}"
                     f"{max(r['exposed_ms'] for r in rows):>9.0f}{pct[0]:>10.0f}{pct[1]:>10.0f}  "
                     f"{', '.join(rows[0]['ops'])}")
    lines.append("link ms: the link busy (a ring step's send and receive count once); exposed: "
                 "what nothing hid; hidden %: of each pass's link time, rank skew excused; the "
                 "slower rank. Step times: workbook bench tp_overlap")
    return "\n".join(lines)
