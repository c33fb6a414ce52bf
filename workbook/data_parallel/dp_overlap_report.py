"""Figures of the dp_overlap lab: how much of data parallelism's traffic hides, and what each
variant keeps in memory.

On 2 ranks over the simulated dgx-h100 link, one small model (llama, hidden ``HIDDEN``,
``LAYERS`` blocks, ``ROWS`` x ``SEQ`` tokens a rank, fp32, Adam) takes one profiled training
step under each variant of the lab (``naive``, ``bucketed`` with the lab's bucket size,
``zero1``, ``zero2``, ``zero3``), after a warm-up step (one row a rank, no link). Per variant:

* **link ms**: the modelled link time of the step's collectives;
* **exposed ms**: the link time no compute ran beside (from the step's trace; rank skew shown as
  exposed, as in ``workbook bench dp_overlap``);
* **hidden %** of the link time of the ops issued in the forward and the backward pass;
* **memory** per rank between steps, by kind (``memory_by_kind``), beside the ZeRO table
  (``predicted_memory``).

In brackets, what the overlap arithmetic predicts for the same shapes and link
(``workbook.data_parallel.dp_overlap_bench.predict``: alpha-beta op times, the compute of the same step
without communication, the lab's schedule on one serial link). One step each: for medians, both
links and several bucket sizes, ``workbook bench dp_overlap``.
"""
from __future__ import annotations

from workbook.measure.output import where_measured

WORLD_SIZE = 2
LINK = "dgx-h100"
HIDDEN, LAYERS, ROWS, SEQ = 256, 4, 4, 256
VARIANTS = ("naive", "bucketed", "zero1", "zero2", "zero3")


def run(trace_dir=None, impl=None) -> dict:
    import tempfile
    from pathlib import Path

    import torch.distributed as dist

    from workbook import link
    from workbook.data_parallel.dp_overlap_bench import STAGE, predict, drain, make_trainer, step_figures
    from workbook.data_parallel import memory_by_kind, predicted_memory
    from workbook.measure.profiled_step import profiled_step
    from workbook.measure.calibration import recalibrate
    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig, make_batch
    from workbook.runtime import ranks
    lab = load_lab("dp_overlap", impl)
    rank, n, dev = dist.get_rank(), dist.get_world_size(), ranks.device()
    preset = link.current_link().preset if link.current_link() else None
    cfg = ModelConfig(hidden=HIDDEN, heads=4, ffn_hidden=4 * HIDDEN, n_layers=LAYERS, seq_len=SEQ,
                      vocab_size=256, style="llama", dtype="float32")
    batch, small = ([x.to(dev) for x in make_batch(cfg, rows, seed=0)] for rows in (ROWS * n, n))
    order = ("no_comm", *VARIANTS)                     # no_comm first: the prediction's compute
    trainers = {v: make_trainer(lab, v, cfg, dev) for v in order}
    link.set_link(None)                                # warm-up: allocate, nothing to wait for
    for tr in trainers.values():
        tr.train_step(*small, 0)
        drain(tr)
    if preset:
        recalibrate(preset)                            # the matmul rate now
    units = [sum(p.numel() for p in u.parameters()) for u in trainers["no_comm"].units]
    root = Path(trace_dir or tempfile.mkdtemp(prefix="dp_overlap-report-"))
    out = {"rank": rank, "link": link.current_link().label if link.current_link() else None,
           "trace_dir": str(root), "variants": {}}
    for v in order:
        tr = trainers[v]
        ms, ops, t = profiled_step(lambda: (tr.train_step(*batch, 1), drain(tr)), root / v, rank,
                                   "dp_overlap")
        row = out["variants"][v] = step_figures(t, ops, ms)
        if v != "no_comm":
            nc = out["variants"]["no_comm"]
            row["predicted"] = predict(v, tr, cfg, ROWS, nc["fwd_compute_ms"] / 1e3,
                                        nc["bwd_compute_ms"] / 1e3)[0] if preset else {}
            row["memory"] = memory_by_kind(tr)
            row["memorypredicted"] = predicted_memory(units, n, STAGE[v], 4)
    return out


def _fmt(x, spec="{:.0f}") -> str:
    return "-" if x is None else spec.format(x)


def describe(results: list[dict]) -> str:
    first = results[0]
    lines = [f"dp_overlap figures: llama, hidden {HIDDEN}, {LAYERS} blocks, {ROWS}x{SEQ} tokens a "
             f"rank, fp32, Adam, on {len(results)} ranks; {where_measured(first['link'])}",
             "one profiled step each; measured (predicted by the overlap arithmetic)",
             f"{'variant':<10}{'step ms':>8}{'link ms':>14}{'exposed ms':>14}{'fwd hid%':>12}"
             f"{'bwd hid%':>12}   memory MiB: params / grads / optimizer"]
    for v in VARIANTS:
        rows = [r["variants"][v] for r in results]
        slow, p = max(rows, key=lambda r: r["step_ms"]), rows[0]["predicted"]

        def pair(key, width, pick=max):
            got = [r[key] for r in rows if r[key] is not None]
            return f"{_fmt(pick(got) if got else None)} ({_fmt(p.get(key))})".rjust(width)
        mem = " / ".join(f"{rows[0]['memory'][k] / 2**20:.1f} ({rows[0]['memorypredicted'][k] / 2**20:.1f})"
                         for k in ("parameters", "gradients", "optimizer"))
        lines.append(f"{v:<10}{slow['step_ms']:>8.0f}{pair('link_ms', 14)}{pair('exposed_ms', 14)}"
                     f"{pair('fwd_hidden_pct', 12, min)}{pair('bwd_hidden_pct', 12, min)}   {mem}")
    nc = max(r["variants"]["no_comm"]["step_ms"] for r in results)
    lines += [f"no communication: {nc:.0f} ms a step (the optimum). link ms: the link busy; exposed: "
              "what nothing hid; hidden %: of each pass's link time, the slower rank",
              f"traces: {first['trace_dir']}/VARIANT; medians, both links, bucket sizes: "
              "workbook bench dp_overlap"]
    return "\n".join(lines)
