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

Then the prediction task (``predict_exposed_ms``): your prediction of ``bucketed``'s exposed
communication, the model's value of the same figure (``exposed_tail``: the all-reduces of the
buckets that hold a first-layer gradient, on the link's alpha-beta model), and the exposed time
measured on the simulated link, side by side (``comparison_lines``; ``-`` where your prediction
is not implemented yet).

In brackets, what the overlap arithmetic predicts for the same shapes and link
(``workbook.data_parallel.dp_overlap_bench.predict``: alpha-beta op times, the compute of the same step
without communication, the lab's schedule on one serial link). One step each: for medians, both
links and several bucket sizes, ``workbook bench dp_overlap``.
"""
from __future__ import annotations

from workbook.measure.output import traces_line, where_measured

TAIL_WHAT = "BucketedDP's exposed communication per step"
TAIL_TERMS = ("one latency alpha per all-reduce; 2(n-1)/n x S bus bytes over the bandwidth for "
              "a bucket of S bytes; only the buckets that hold a first-layer (embedding) "
              "gradient; the result in ms")
WORLD_SIZE = 2
LINK = "dgx-h100"
HIDDEN, LAYERS, ROWS, SEQ = 256, 4, 4, 256
VARIANTS = ("naive", "bucketed", "zero1", "zero2", "zero3")


def run(trace_dir=None, impl=None) -> dict:
    import torch.distributed as dist

    from workbook import link
    from workbook.data_parallel.dp_overlap_bench import STAGE, predict, drain, make_trainer, step_figures
    from workbook.data_parallel import memory_by_kind, predicted_memory
    from workbook.measure.profiled_step import profiled_step, trace_folder
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
    out = {"rank": rank, "link": link.current_link().label if link.current_link() else None,
           "trace_dir": trace_dir and str(trace_dir), "variants": {}}
    with trace_folder(trace_dir, "dp_overlap") as root:     # None: a temporary one
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
            if v == "bucketed" and preset:            # the prediction task: yours, the model's
                sizes, first = tail_buckets([b.params for b in tr.buckets], tr.units[0].parameters())
                out["tail"] = {"predicted": _predicted_tail(lab, tr, n),
                               "model": exposed_tail(link.current_link(), sizes, first, n)[0],
                               "buckets": sum(f > 0 for f in first)}
    return out


# --------------------------------------------------------------------------- the prediction's model
def tail_buckets(buckets, first_layer) -> tuple[list[int], list[int]]:
    """Each bucket's bytes (a bucket: a list of parameters, in all-reduce order) and the bytes
    of first-layer parameters in it (not 0: it can only start when the backward pass ends)."""
    first = {id(p) for p in first_layer}

    def nbytes(params):
        return sum(p.numel() * p.element_size() for p in params)
    return ([nbytes(b) for b in buckets], [nbytes(p for p in b if id(p) in first) for b in buckets])


def exposed_tail(lk, bucket_bytes: list[int], first_bytes: list[int], n: int) -> tuple[float, dict]:
    """The model of ``predict_exposed_ms`` on link ``lk`` (a ``workbook.link.cost_model.Link``)
    with ``n`` ranks: the ms of the all-reduces of the buckets that hold first-layer bytes
    (``first_bytes``, per bucket, from ``tail_buckets``: they start only once the backward pass
    is over), each costed by the link's own alpha-beta model (``Link.op_time``); and the values
    of the classic wrong derivations of the same figure, ``{what the derivation did: ms}``, for
    ``judge_prediction``."""
    alpha, bw = lk.latency_s, lk.bandwidth_Bps
    tail = [b for b, f in zip(bucket_bytes, first_bytes) if f]

    def ms(sizes, factor=2 * (n - 1) / n, latency=alpha) -> float:
        return 1e3 * sum(latency + factor * s / bw for s in sizes)
    model = 1e3 * sum(lk.op_time("all_reduce", s, n) for s in tail)
    mistakes = {
        "used the payload bytes S where a ring all-reduce puts 2(n-1)/n x S bus bytes on the "
        "link per rank": ms(tail, 1.0),
        "forgot the (n-1)/n factor of the bus bytes (2 S instead of 2(n-1)/n x S)": ms(tail, 2.0),
        "used the (n-1)/n x S of an all-gather or a reduce-scatter: an all-reduce is both, "
        "2(n-1)/n x S": ms(tail, (n - 1) / n),
        "left out the latency alpha that every all-reduce pays": ms(tail, latency=0.0),
        "summed every bucket's all-reduce: the buckets completed before the backward pass ends "
        "hide behind it, only those holding a first-layer gradient cannot": ms(bucket_bytes),
        "counted only the last bucket: every bucket holding a first-layer (embedding) gradient "
        "starts only when the backward pass is over": ms(tail[-1:]),
        "counted only the first layer's own bytes: a bucket's all-reduce carries the whole "
        "bucket, the other layers' gradients in it too": ms([f for f in first_bytes if f]),
        "counted the last bucket twice": ms(tail + tail[-1:]),
        "gave seconds: the prediction is in milliseconds": model / 1e3,
    }
    return model, mistakes


def _predicted_tail(lab, tr, n: int):
    """The learner's ``predict_exposed_ms`` on trainer ``tr``'s own buckets, or None (not
    implemented yet, or it failed: the grader says why)."""
    from workbook import link
    try:
        got = lab.predict_exposed_ms(link.current_link(), [list(b.params) for b in tr.buckets],
                                     list(tr.units[0].parameters()), n)
        return float(got)
    except Exception:                                # noqa: BLE001 - a stub shows as "-"
        return None


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
    tail = first.get("tail")
    if tail:
        from workbook.grading.predictions import comparison_lines
        measured = max(r["variants"]["bucketed"]["exposed_ms"] for r in results)
        schedule = first["variants"]["bucketed"]["predicted"].get("exposed_ms")
        lines += [f"predict_exposed_ms: {TAIL_WHAT} ({tail['buckets']} bucket(s) hold a "
                  f"first-layer gradient); measured: the trace's exposed link time, simulated"]
        lines += comparison_lines([("bucketed exposed ms", tail["predicted"], tail["model"],
                                    measured),
                                   ("  (schedule model, with compute)", None, schedule,
                                    measured)])
        lines += ["  the tail is what no schedule can hide; the rest of the measured figure is "
                  "the queue of earlier buckets the backward pass did not cover (lesson 9, the "
                  "overlap condition), launch costs and skew"]
    nc = max(r["variants"]["no_comm"]["step_ms"] for r in results)
    lines += [f"no communication: {nc:.0f} ms a step (the optimum). link ms: the link busy; exposed: "
              "what nothing hid; hidden %: of each pass's link time, the slower rank",
              "medians, both links, bucket sizes: workbook bench dp_overlap"]
    if first.get("trace_dir"):
        lines.append(traces_line(first["trace_dir"], ("no_comm", *VARIANTS), "variant"))
    return "\n".join(lines)
