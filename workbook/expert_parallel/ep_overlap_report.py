"""Lab ``ep_overlap``'s own figures in ``workbook run ep_overlap``, and the model its prediction is
judged against.

Once the checks ran, one traced step of each variant of the learner's layer on 2 ranks over the
simulated dgx-h100 link (``run``): per pass, the all-to-all link time (the counts' and the
tokens'), the part of it left exposed and the share hidden; then the prediction row: the
learner's ``predict_dispatch_exposed_ms`` beside the model (``dispatch_exposed_model``) and the
wait the run measured on the dispatch of ``ep_moe_shared_overlap``'s forward pass (``describe``).

The model (lesson 13, sections 3 and 8): the simulated link times an uneven all-to-all by its
busiest rank (``workbook.link.topology.busiest_rank_bytes``: the most bytes one rank sends to
the others or receives from them), ``t = alpha + busiest / bandwidth``; the shared expert,
started with the exchange, covers ``t_shared`` of it, so ``exposed = max(0, t - t_shared)``.
"""
from __future__ import annotations

WORLD_SIZE = 2
LINK = "dgx-h100"
#: the run: a GPT-style layer, E = 4 experts (2 per rank), top-1, no drops, a shared expert; per
#: rank 256 tokens of hidden 256, fp32; the shared expert 4 H wide (GPT's MLP), each expert 8 H:
#: on dgx-h100 the shared expert covers only part of the dispatch, which the prediction row shows
TOKENS, HIDDEN, ITEMSIZE = 256, 256, 4
EXPERTS, TOP_K, WIDTHS = 4, 1, (4, 8)                  # the shared expert's and each expert's / H
VARIANTS = {"ep_moe": "ep_moe", "shared_overlap": "ep_moe_shared_overlap",
            "two_batch": "TwoBatchMoE", "deferred_wgrad": "ep_moe_deferred_wgrad"}


# --------------------------------------------------------------------------- the model
def dispatch_exposed_model(link, sent_rows, hidden: int, itemsize: int,
                           t_shared_ms: float) -> tuple[float, dict]:
    """The model's exposed ms of a dispatch of ``sent_rows[s][d]`` rows (``hidden`` elements of
    ``itemsize`` bytes each) hidden behind ``t_shared_ms`` of shared-expert compute on ``link``
    (the link's own ``all_to_all_time``). Returns ``(model, mistakes)``: ``mistakes`` maps each
    known wrong derivation (as the learner's message words it) to the value it gives, for
    ``workbook.grading.predictions.judge_prediction``."""
    n, row = len(sent_rows), hidden * itemsize
    matrix = [[int(c) * row for c in r] for r in sent_rows]                 # bytes [src][dst]
    model = 1e3 * link.all_to_all_time(matrix, range(n)) - t_shared_ms
    model = max(0.0, model)
    alpha, bw = 1e3 * link.latency_s, link.bandwidth_Bps / 1e3           # ms, bytes per ms
    off = [[matrix[s][d] if s != d else 0 for d in range(n)] for s in range(n)]
    sent = [sum(r) for r in off]
    received = [sum(off[s][d] for s in range(n)) for d in range(n)]
    whole = [sum(r) for r in matrix]

    def exposed(busy_bytes: float, latency: float = alpha) -> float:
        return max(0.0, latency + busy_bytes / bw - t_shared_ms)
    busiest = max(sent + received)
    mistakes = {
        "divide the bytes of the whole exchange (every pair's) by one link's bandwidth: the "
        "ranks send and receive at once, so the busiest rank's bytes set the time":
            exposed(sum(sent)),
        "use the average rank's bytes: the exchange ends when its busiest rank is done":
            exposed(sum(received) / n),
        "count only what each rank receives: a rank that sends more than any rank receives "
        "sets the time too": exposed(max(received)),
        "count the rows a rank keeps for itself: they never travel": exposed(max(whole + [
            sum(matrix[s][d] for s in range(n)) for d in range(n)])),
        "add what the busiest rank sends and what it receives: the two directions travel at "
        "once": exposed(max(a + b for a, b in zip(sent, received))),
        "leave the link's latency (alpha) out of the exchange's time": exposed(busiest, 0.0),
        "count elements as bytes (the itemsize left out)": exposed(busiest / itemsize),
        "leave the shared expert out: nothing overlapped, the whole exchange exposed":
            alpha + busiest / bw,
        "let the exposure go below zero: a shared expert longer than the exchange hides all of "
        "it, and no more": alpha + busiest / bw - t_shared_ms,
        "give seconds, not milliseconds": model / 1e3,
    }
    return model, mistakes


# --------------------------------------------------------------------------- the run
def run(trace_dir=None, impl=None, options=None) -> dict:
    """On every rank: one traced step of each variant of the learner's layer (after a warm-up
    with no link), per pass the all-to-all link time, exposed ms and hidden share; and, for the
    prediction row, the dispatch of the shared-expert variant: its rows per pair, the compute
    the rank ran between its start and its wait (the shared expert), and how long the wait
    took. ``options``: ``{"tokens", "hidden"}`` to shrink the run."""
    import time

    import torch
    import torch.distributed as dist

    from workbook import link
    from workbook.expert_parallel import local_moe, rank_rows
    from workbook.expert_parallel.ep_overlap_bench import layer_fn
    from workbook.grading.labs import load_lab
    from workbook.grading.trace_checks import overlap_figures
    from workbook.measure.calibration import recalibrate
    from workbook.measure.profiled_step import profiled_step, trace_folder
    from workbook.model import ModelConfig, MoEConfig
    o = {"tokens": TOKENS, "hidden": HIDDEN, **(options or {})}
    T, H = o["tokens"], o["hidden"]
    lab, rank, n = load_lab("ep_overlap", impl), dist.get_rank(), dist.get_world_size()
    cfg = ModelConfig(style="gpt", dtype="float32", hidden=H, heads=2, ffn_hidden=WIDTHS[0] * H)
    moe = MoEConfig(EXPERTS, TOP_K, None, True, WIDTHS[1] * H)
    gen = torch.Generator().manual_seed(13)
    x, g = (torch.randn(n * T, H, generator=gen) for _ in range(2))
    rows = rank_rows(n * T, rank, n)
    layers = {v: local_moe(cfg, moe, rank, n) for v in VARIANTS}
    lk = link.current_link()
    link.set_link(None)                                   # warm-up: nothing to wait for
    for v, layer in layers.items():
        layer_fn(lab, v, layer)(x[rows].clone().requires_grad_()).backward(g[rows])
    if lk is not None:
        recalibrate(lk.preset)                            # the matmul rate now
    lk = link.current_link()
    out = {"rank": rank, "link": lk.label if lk else None, "link_model": lk, "hidden": H,
           "tokens": T, "variants": {}}
    with trace_folder(trace_dir, "ep_overlap") as root:
        for v, layer in layers.items():
            mark = []

            def step():
                xr = x[rows].clone().requires_grad_()
                with torch.profiler.record_function("forward"):
                    y = layer_fn(lab, v, layer)(xr)
                mark.append(time.perf_counter_ns())
                with torch.profiler.record_function("backward"):
                    y.backward(g[rows])
            ms, ops, t = profiled_step(step, root / v, rank, "ep_overlap")
            out["variants"][v] = {"step_ms": ms, **{p: overlap_figures(t, p)
                                                    for p in ("forward", "backward")}}
            if v == "shared_overlap":
                tokens = [r for r in ops if r.op == "all_to_all" and r.issued_ns < mark[0]
                          and r.split_bytes and r.size_bytes != EXPERTS * 8]
                d = tokens[0] if tokens else None        # the dispatch: the forward's first
                if d is not None and d.first_wait_ns:
                    out["dispatch"] = {
                        "rows": [[b // (H * ITEMSIZE) for b in r] for r in d.split_bytes],
                        "t_shared_ms": max(0, d.first_wait_ns - d.start_ns) / 1e6,
                        "exposed_ms": max(0, max(d.end_ns, d.arrival_ns) - d.first_wait_ns) / 1e6}
    return out


# --------------------------------------------------------------------------- the lines
def _fmt(x, spec="{:.0f}") -> str:
    return "-" if x is None else spec.format(x)


def prediction_lines(results: list[dict], predict=None) -> list[str]:
    """The prediction row: the learner's ``predict_dispatch_exposed_ms`` (``predict``; by
    default the lab's), the model and the measured wait, with this run's link, dispatch and
    compute between the dispatch's start and its wait (means over the ranks). A prediction that
    raises shows ``-``."""
    import statistics

    from workbook.grading.predictions import comparison_lines
    first = results[0]
    if first.get("link_model") is None or any("dispatch" not in r for r in results):
        return ["  prediction: no simulated link (or no dispatch) on this run, nothing to predict"]
    if predict is None:
        from workbook.grading.labs import load_lab

        def predict(*args):
            return load_lab("ep_overlap").predict_dispatch_exposed_ms(*args)
    t_shared = statistics.fmean(r["dispatch"]["t_shared_ms"] for r in results)
    args = (first["link_model"], first["dispatch"]["rows"], first["hidden"], ITEMSIZE, t_shared)
    model, _ = dispatch_exposed_model(*args)
    try:
        predicted = float(predict(*args))
    except Exception:                            # noqa: BLE001 - a stub or a bug shows as "-"
        predicted = None
    measured = statistics.fmean(r["dispatch"]["exposed_ms"] for r in results)
    return (["  prediction (predict_dispatch_exposed_ms) of ep_moe_shared_overlap's dispatch on "
             "this run's link:", f"  rows per pair {args[1]}, {t_shared:.0f} ms of compute "
             "between its start and its wait", "  (measured on the SIMULATED link)"]
            + comparison_lines([("dispatch exposed", predicted, model, measured)]))


def describe(results: list[dict]) -> str:
    """Per variant: the step, and per pass the all-to-all ms, exposed ms and hidden share
    (means over the ranks), then the prediction row."""
    import statistics
    first, n = results[0], len(results)
    lines = [f"  your layer, {n} ranks, {first['tokens']} tokens of hidden {first['hidden']} per "
             f"rank, E = {EXPERTS}, top-{TOP_K}, a shared expert {WIDTHS[0]} H wide;",
             f"  {first['link']}:",
             f"  {'variant':<24}{'step ms':>8}{'fwd a2a':>9}{'exposed':>9}{'hid%':>6}"
             f"{'bwd a2a':>9}{'exposed':>9}{'hid%':>6}"]

    def mean(v, p, key):
        vals = [r["variants"][v][p][key] for r in results]
        return None if None in vals else statistics.fmean(vals)
    for v, call in VARIANTS.items():
        step = statistics.fmean(r["variants"][v]["step_ms"] for r in results)
        cells = "".join(f"{_fmt(mean(v, p, 'comm_ms')):>9}{_fmt(mean(v, p, 'exposed_ms')):>9}"
                        f"{_fmt(mean(v, p, 'pct')):>6}" for p in ("forward", "backward"))
        lines.append(f"  {call:<24}{step:8.0f}{cells}")
    lines.append("  (a2a: the all-to-alls' link time, the counts' included; lesson 13, "
                 "section 8 explains these)")
    return "\n".join(lines + prediction_lines(results))
