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
  each rank its own sum, has nothing left to hide behind;
* **the prediction**: the lab's ``predict_forward_exposed_ms`` at this shape and calibrated link,
  the model's value (``forward_exposed_model_ms``) and the forward pass's exposed exchange of the
  zig-zag step read from the trace, side by side (``-`` where the prediction is not written yet).
"""
from __future__ import annotations

from workbook.grading.predictions import comparison_lines
from workbook.measure.output import traces_line, where_measured

WORLD_SIZE = 2
LINK = "dgx-h100"
BATCH, HEADS, SEQ, HEAD_DIM = 1, 4, 4096, 64
SPLITS = ("contiguous", "zigzag")
PREDICTED = "forward exposed K/V exchange (zig-zag)"     # the lab's prediction task, a row


def zigzag_blocks_per_step(n: int) -> list[int]:
    """Chunk-sized blocks a rank computes at ring step t on the zig-zag split of n ranks (every
    rank the same): its own two chunks at step 0 (two diagonal blocks and one full), then one
    full block of each of its chunks over the one earlier chunk it receives."""
    return [3] + [2] * (n - 1) if n > 0 else []


def forward_exposed_model_ms(lk, n: int, seq_len: int, batch: int, heads: int, head_dim: int,
                             element_size: int, *, tensors: int = 2, latency: bool = True,
                             step_blocks=None, hops=None, hop_factor: float = 1.0,
                             compute: bool = True) -> float:
    """The model's exposed K/V exchange of ring attention's forward pass, in ms, on the zig-zag
    split (the figure of the lab's ``predict_forward_exposed_ms``): hop t (t = 0..n-2) travels
    behind step t's attention and shows for what outlasts it::

        t_hop   = alpha + 2 * B * h * (S/n) * d * e / bandwidth      (K and V in one buffer)
        t_block = 4 * B * h * L^2 * d / local_flops                   (QK^T and PV, L = S / 2n)
        exposed = sum_t max(0, t_hop - blocks(t) * t_block),  blocks = 3, 2, 2, ...

    (a diagonal block counts whole: the given ``block_forward`` computes it, then masks it). The
    keyword arguments make the classic wrong derivations, which the grader names: ``tensors=1``
    (K only), ``latency=False``, ``step_blocks`` (e.g. one full (S/n)^2 block = 4 a step),
    ``hops=n`` (a hop at the last step too), ``hop_factor=2`` (send and receive added up on a
    full-duplex link), ``compute=False`` (nothing subtracted)."""
    chunk = seq_len // (2 * n)
    hop_s = ((lk.latency_s if latency else 0.0)
             + tensors * batch * heads * (seq_len // n) * head_dim * element_size
             / lk.bandwidth_Bps) * hop_factor
    block_s = 4 * batch * heads * chunk * chunk * head_dim / lk.local_flops if compute else 0.0
    hops = n - 1 if hops is None else hops
    blocks = list(step_blocks) if step_blocks is not None else zigzag_blocks_per_step(n)
    blocks += [blocks[-1] if blocks else 0] * max(0, hops - len(blocks))
    return sum(max(0.0, hop_s - blocks[t] * block_s) for t in range(hops)) * 1e3


def forward_exposed_mistakes(lk, n: int, seq_len: int, batch: int, heads: int, head_dim: int,
                             element_size: int) -> dict[str, float]:
    """``{what a wrong derivation did: the value it gives}`` for ``judge_prediction``."""
    args = (lk, n, seq_len, batch, heads, head_dim)
    other = 2 if element_size != 2 else 4
    named: dict[str, float] = {}
    for what, value in _mistakes(args, element_size, other).items():
        same = [k for k, v in named.items() if abs(v - value) <= 1e-9 * max(1.0, abs(value))]
        if same:                                   # two derivations, one value: name both
            named[f"{same[0]}; or {what}"] = named.pop(same[0])
        else:
            named[what] = value
    return named


def _mistakes(args, element_size: int, other: int) -> dict[str, float]:
    return {
        "take it that every hop hides behind its step (0 ms): compare each hop's time with the "
        "attention of the step it travels behind":
            0.0,
        "count only K in a hop: K and V travel together, one [2, B, h, S/n, d] buffer":
            forward_exposed_model_ms(*args, element_size, tensors=1),
        "count a step's attention as one full (S/n) x (S/n) block: the zig-zag split computes "
        "chunk-sized blocks (L = S/2n), three at step 0 and two at every later step, so a step "
        "away from the diagonal does half a full block's work":
            forward_exposed_model_ms(*args, element_size, step_blocks=[4] * args[1]),
        "count the diagonal blocks as half a block: the given block forward computes a "
        "diagonal block whole and then masks it":
            forward_exposed_model_ms(*args, element_size, step_blocks=[2] * args[1]),
        f"take {other} bytes per element: the bytes of a hop are elements x the dtype's size "
        f"({element_size} here)":
            forward_exposed_model_ms(*args, other),
        "count elements as bytes (1 byte per element): a hop's bytes are elements x the "
        "dtype's size":
            forward_exposed_model_ms(*args, 1),
        "leave out the latency alpha: every hop pays it once":
            forward_exposed_model_ms(*args, element_size, latency=False),
        "count a hop at the last step too: the last step holds the last block and sends "
        "nothing (n - 1 hops)":
            forward_exposed_model_ms(*args, element_size, hops=args[1]),
        "add the send's and the receive's times: the link is full duplex, a hop's send and "
        "receive travel at once":
            forward_exposed_model_ms(*args, element_size, hop_factor=2.0),
        "add up the hops' whole transfer times: a hop shows only for what outlasts the "
        "attention of the step it travels behind":
            forward_exposed_model_ms(*args, element_size, compute=False),
    }


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
    import time
    from contextlib import nullcontext

    import torch
    import torch.distributed as dist
    from torch.profiler import record_function

    from workbook import link, trace
    from workbook.context_parallel import contiguous_layout
    from workbook.measure.calibration import recalibrate
    from workbook.measure.profiled_step import trace_folder
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
    out = {"rank": rank, "link": lk.label if lk else None, "trace_dir": trace_dir and str(trace_dir),
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

    with trace_folder(trace_dir, "cp_ring") as root:          # None: a temporary one
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
                row[f"{phase}_exposed_ms"] = (o.exposed_comm_us - o.skew_us) / 1e3
                row["exposed_ms"] = row.get("exposed_ms", 0.0) + row[f"{phase}_exposed_ms"]
    out["prediction"] = _prediction(lab, lk, n, q.dtype, q.element_size())
    return out


def _prediction(lab, lk, n: int, dtype, element_size: int) -> dict:
    """The lab's ``predict_forward_exposed_ms`` at this run's shape and calibrated link (None
    when it is not written yet, or fails), beside the model's value."""
    if lk is None:
        return {"predicted": None, "model": None}
    shape = (n, SEQ, BATCH, HEADS, HEAD_DIM)
    try:
        predicted = float(lab.predict_forward_exposed_ms(lk, *shape, dtype))
    except Exception:                          # noqa: BLE001 - a stub or a broken prediction: "-"
        predicted = None
    return {"predicted": predicted, "model": forward_exposed_model_ms(lk, *shape, element_size)}


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
                 "backward's last dK/dV hop has nothing to hide behind); hidden %: the lower rank's")
    if first.get("trace_dir"):
        lines.append(traces_line(first["trace_dir"], SPLITS, "split"))
    pred = first.get("prediction") or {}
    measured = max(r["splits"]["zigzag"].get("forward_exposed_ms", 0.0) for r in results)
    lines.append("your prediction (predict_forward_exposed_ms), the model and the trace "
                 f"(measured: the slower rank, skew excused; {where_measured(first['link'])}):")
    lines += comparison_lines([(PREDICTED, pred.get("predicted"), pred.get("model"),
                                max(measured, 0.0))])
    lines.append("  the model counts FLOPs at the calibrated matmul rate; the CPU's attention also "
                 "spends time on\n  exponentials, the mask and memory, so its steps last longer "
                 "and hide more than the model says")
    return "\n".join(lines)
