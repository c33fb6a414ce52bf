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

First, the prediction (``prediction_lines``): for one ``ring_all_gather_matmul`` of a shard
``[BATCH, SEQ/n, HIDDEN]`` by each weight ``[out, HIDDEN]`` of ``RING_OUTS`` (one the link
outlasts, one whose GEMM hides it), the exposed communication the learner predicted with
``predict_ring_exposed_ms`` (``-`` while it is a stub), the model's value
(``modelled_ring_exposed_ms``: the same derivation, the lesson's ``(n-1) max(0, t_c - t_g)``)
and the exposed time measured in the trace of the learner's own ring (the slower rank, skew
excused), with plain SP's all-gather beside it. The model is exact arithmetic on the schedule;
the measurement has launch costs, copies, rank skew and a loaded CPU in it.

The rings and the variants are traced into one file per rank, each a step of its own
(``traced_step``: 0 the rings, then the variants in ``VARIANTS`` order), so that
``workbook trace summary DIR --step N`` and the trace report give each build its own figures.
"""
from __future__ import annotations

from workbook.measure.output import steps_line, where_measured

WORLD_SIZE = 2
LINK = "dgx-h100"
HIDDEN, HEADS, BATCH, SEQ = 2048, 16, 1, 512
VARIANTS = ("sp", "bulk", "pipelined", "pipelined+bulk")
# the prediction's rings: x [BATCH, SEQ/n, HIDDEN] times W [out, HIDDEN], fp32; on 2 ranks of
# dgx-h100 a shard's exchange outlasts the first one's GEMM and hides behind the second's
RING_OUTS = (1024, 8192)


# --------------------------------------------------------------------------- the prediction's model
def ring_step_times(link, n: int, batch: int, seq: int, hidden: int, out_features: int,
                    element_bytes: int = 4) -> tuple[float, float]:
    """``(t_c, t_g)`` in seconds for one step of ``ring_all_gather_matmul`` on ``link``: the
    exchange of one shard ``[batch, seq/n, hidden]`` (a send between two ranks: alpha + bytes *
    beta, as the simulated link charges it) and the GEMM of that shard by ``[out, hidden]`` (2
    FLOPs per multiply-add, at the link's calibrated ``local_flops``)."""
    rows = batch * (seq // n)
    t_c = link.op_time("send", rows * hidden * element_bytes, 2)
    t_g = 2 * rows * hidden * out_features / link.local_flops
    return t_c, t_g


def modelled_ring_exposed_ms(link, n: int, batch: int, seq: int, hidden: int, out_features: int,
                             element_bytes: int = 4) -> float:
    """The model of ``predict_ring_exposed_ms``: n - 1 steps pair an exchange with one shard's
    GEMM, each exposing ``max(0, t_c - t_g)`` (lesson 8, "Predict, then measure"), in ms."""
    if n <= 1:
        return 0.0
    t_c, t_g = ring_step_times(link, n, batch, seq, hidden, out_features, element_bytes)
    return 1e3 * (n - 1) * max(0.0, t_c - t_g)


def ring_prediction_mistakes(link, n: int, batch: int, seq: int, hidden: int, out_features: int,
                             element_bytes: int = 4) -> dict[str, float]:
    """The classic wrong derivations of ``predict_ring_exposed_ms``: ``{what it did: the value
    it gives}`` (``workbook.grading.predictions.judge_prediction`` names the one matched)."""
    rows = batch * (seq // n)
    shard = rows * hidden * element_bytes
    alpha, beta = link.latency_s, 1.0 / link.bandwidth_Bps
    t_c, t_g = alpha + shard * beta, 2 * rows * hidden * out_features / link.local_flops

    def ms(steps, c, g, clamp=True):
        return 1e3 * steps * (max(0.0, c - g) if clamp else c - g)
    return {
        "leave out the latency alpha that every exchange pays (t_c = alpha + bytes / bandwidth)":
            ms(n - 1, shard * beta, t_g),
        "count n exchanges, where a ring of n ranks makes n - 1 (at the last step there is "
        "nothing left to fetch)": ms(n, t_c, t_g),
        "send the whole gathered input at every step, where one exchange carries one shard "
        "[B, S/n, H]": ms(n - 1, alpha + n * shard * beta, t_g),
        "count one exchange's bytes with the all-gather's bus factor (n-1)/n, where a send "
        "moves its bytes once": ms(n - 1, alpha + (n - 1) / n * shard * beta, t_g),
        "put the whole GEMM behind each exchange, where a step multiplies one shard (1/n of the "
        "rows)": ms(n - 1, t_c, n * t_g),
        "count a GEMM as M*K*N FLOPs, where each multiply-add is 2 FLOPs": ms(n - 1, t_c, t_g / 2),
        "count elements, not bytes (each element is element_bytes bytes)":
            ms(n - 1, alpha + rows * hidden * beta, t_g),
        "predict plain SP's all-gather, exposed whole (latency + (n-1)/n of the gathered bytes "
        "over the bandwidth): the ring hides each exchange behind a GEMM":
            1e3 * (alpha + (n - 1) * shard * beta),
        "add up the n - 1 exchanges as if no GEMM ran beside them": 1e3 * (n - 1) * t_c,
        "count the exposed part of one step once, where it repeats at each of the n - 1 steps":
            ms(1, t_c, t_g),
        "subtract the GEMM even where it outlasts the exchange: a step lasts as long as the "
        "slower of the two, so what it exposes is never below zero": ms(n - 1, t_c, t_g, False),
        "give seconds where milliseconds are asked": ms(n - 1, t_c, t_g) / 1e3,
    }


RING_TERMS = ("one exchange = the link's latency + one shard's bytes / bandwidth; one step's GEMM "
              "= 2 x rows x in x out FLOPs / the compute rate, for one shard's rows; n - 1 steps "
              "with an exchange; each exposes max(0, exchange - GEMM); the result in ms")


def _attempt(fn, errors=(Exception,)):
    """``fn()``, or None where the learner's code raises one of ``errors`` (by default any:
    figures are extra, the checks have said what is wrong)."""
    try:
        return fn()
    except errors:
        return None


def run(trace_dir=None, impl=None) -> dict:
    from contextlib import nullcontext

    import torch
    import torch.distributed as dist
    from torch.profiler import record_function

    from workbook import link, trace
    from workbook.measure.calibration import recalibrate
    from workbook.measure.profiled_step import trace_folder
    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig
    from workbook.runtime import ranks
    from workbook.tensor_parallel.sequence_parallel import all_gather_sequence
    from workbook.trace.capture import rank_trace, traced_step
    lab = load_lab("tp_overlap", impl)
    rank, n, dev = dist.get_rank(), dist.get_world_size(), ranks.device()
    recalibrate()
    lk = link.current_link()
    cfg = ModelConfig(hidden=HIDDEN, heads=HEADS, ffn_hidden=4 * HIDDEN, n_layers=1, seq_len=SEQ,
                      vocab_size=256, dtype="float32")
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, SEQ // n, HIDDEN, generator=g).to(dev).requires_grad_()
    dy = torch.randn(BATCH, SEQ // n, HIDDEN, generator=g).to(dev)
    xs = torch.randn(BATCH, SEQ // n, HIDDEN, generator=g).to(dev)
    weights = {out: (torch.randn(out, HIDDEN, generator=g) / HIDDEN ** 0.5).to(dev)
               for out in RING_OUTS}
    shape = (n, BATCH, SEQ, HIDDEN)
    out = {"rank": rank, "world_size": n, "link": lk.label if lk else None, "variants": {},
           "rings": {o: {"predicted": _attempt(lambda: float(lab.predict_ring_exposed_ms(lk, *shape, o)))
                         if lk else None,
                         "model": modelled_ring_exposed_ms(lk, *shape, o) if lk else None,
                         "sp_model": 1e3 * lk.op_time("all_gather", BATCH * SEQ * HIDDEN * 4, n)
                         if lk and n > 1 else None}
                     for o in RING_OUTS}}

    def rings(traced=False):
        for o, w in weights.items():
            dist.barrier()
            with record_function(f"ring out={o}") if traced else nullcontext():
                lab.ring_all_gather_matmul(xs, w)
            dist.barrier()
            with record_function(f"sp out={o}") if traced else nullcontext():
                all_gather_sequence(xs) @ w.T
        return True

    blocks = {}

    def step(variant, traced=False):
        with record_function(f"{variant} forward") if traced else nullcontext():
            y = blocks[variant](x, step=1)
        with record_function(f"{variant} backward") if traced else nullcontext():
            y.backward(dy)
        blocks[variant].zero_grad(set_to_none=True)

    def build_blocks():
        blocks.update({v: lab.OverlapBlock(cfg, 0, dev, lab.VARIANTS[v]) for v in VARIANTS})
        for v in VARIANTS:                           # warm-up
            step(v)
        return True

    # every rank runs the same code, so a part not written yet is skipped on every rank alike
    ring_ok = _attempt(rings, NotImplementedError) is not None            # (and a warm-up)
    blocks_ok = _attempt(build_blocks, NotImplementedError) is not None
    if not (ring_ok or blocks_ok):
        raise NotImplementedError("not implemented yet: tp_overlap.ring_all_gather_matmul and "
                                  "tp_overlap.OverlapBlock (no figures to show)")
    steps = (["rings"] if ring_ok else []) + (list(VARIANTS) if blocks_ok else [])
    out["steps"], out["trace_dir"] = steps, trace_dir and str(trace_dir)
    with trace_folder(trace_dir, "tp_overlap") as run_dir:    # None: a temporary one
        with rank_trace(run_dir, lab="tp_overlap"):             # one step per build (traced_step)
            for k, part in enumerate(steps):
                dist.barrier()
                if part == "rings":
                    with traced_step(k):
                        rings(traced=True)
                    continue
                before = len(link.op_log())
                with traced_step(k):
                    step(part, traced=True)
                ops = [r for r in link.op_log()[before:] if r.op != "barrier"]
                out["variants"][part] = {"ops": sorted({r.op for r in ops})}
        t = trace.load_trace(run_dir / f"rank{rank}.trace.json")

        def exposed_ms(within):
            o = trace.overlap(t, within=within)
            return (o.exposed_comm_us - o.skew_us) / 1e3
        for o in RING_OUTS:
            ring = out["rings"][o]
            ring["measured"] = exposed_ms(f"ring out={o}") if ring_ok else None
            ring["sp_measured"] = exposed_ms(f"sp out={o}") if ring_ok else None
        for v in out["variants"]:
            row = out["variants"][v]
            for phase in ("forward", "backward"):
                o = trace.overlap(t, within=f"{v} {phase}")
                row[f"{phase}_pct"] = o.overlap_pct_ex_skew
                row["link_ms"] = row.get("link_ms", 0.0) + o.comm_us / 1e3
                row["exposed_ms"] = row.get("exposed_ms", 0.0) + (o.exposed_comm_us - o.skew_us) / 1e3
    return out


def _slowest(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def prediction_lines(results: list[dict]) -> list[str]:
    """Your prediction of the ring's exposed communication, the model's, and the measurement
    (the slower rank, skew excused), per ring; plain SP's all-gather beside each, for contrast."""
    from workbook.grading.predictions import comparison_lines
    n, rows = len(results), []
    for o in RING_OUTS:
        rings = [r["rings"][o] for r in results]
        rows.append((f"your ring, W [{o}, {HIDDEN}]", rings[0]["predicted"], rings[0]["model"],
                     _slowest(r["measured"] for r in rings)))
        rows.append(("  plain SP, for contrast", None, rings[0]["sp_model"],
                     _slowest(r["sp_measured"] for r in rings)))
    return [f"exposed communication of ring_all_gather_matmul, x [{BATCH}, {SEQ}/{n}, {HIDDEN}] "
            f"fp32 on {n} ranks (predict_ring_exposed_ms; '-': not written yet, not asked, or not run):",
            *comparison_lines(rows),
            "  the model: n - 1 steps, each exposing max(0, exchange - one shard's GEMM); "
            "measured: from this run's trace"]


def describe(results: list[dict]) -> str:
    first = results[0]
    lines = [f"tp_overlap figures on {len(results)} ranks; {where_measured(first['link'])}",
             *prediction_lines(results), ""]
    traced = [steps_line(first["trace_dir"], first["steps"])] if first.get("trace_dir") else []
    if not first["variants"]:
        return "\n".join(lines + ["(no OverlapBlock figures: the blocks do not run yet)", *traced])
    lines += [f"one OverlapBlock (GPT, hidden {HIDDEN}, {BATCH}x{SEQ} tokens, fp32):",
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
    return "\n".join(lines + traced)
