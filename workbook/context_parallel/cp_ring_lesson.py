"""Lesson 11's helpers (lab ``cp_ring``): the checks of the learner's pieces, the figures of the
causal mask and the ring's work, the overlap model, and the ring attention steps it measures
on ranks, with the figures and tables it draws from them.

* The online softmax: ``partial`` (one block's state), ``merge_problem`` (is a merge exact?),
  ``rescale_table`` (a merge that forgets to rescale, row by row), ``streamed_check``.
* The mask: ``block_mask_problem``, ``block_pairs_problem``, ``zigzag_problem``; ``mask_grid``
  (the blocks each rank computes at each ring step) and ``work_figure`` (the work per rank and
  step, contiguous against zig-zag).
* The overlap condition at full speed: ``cp_ratio``, ``crossing``, ``ratio_figure`` and
  ``hop_explorer`` (widgets).
* On ranks: ``check`` (the learner's ring attention against one device), ``ring_step`` (a
  profiled forward and backward per split, with each block's span, each hop and the link's log),
  ``ring_sweep``; drawn by ``ring_timeline``, ``hidden_table``, ``prediction_table`` (the lab's
  prediction beside the model and the trace), ``sweep_rows`` (printed with ``SWEEP_COLUMNS``)
  and ``sweep_figure``.

The shared bars, verdicts and the link's log are ``workbook.measure.lesson_figures``.
"""
from __future__ import annotations

import numpy as np
import torch

from workbook.context_parallel import (CAUSAL, FULL, Layout, Partial, contiguous_layout,
                                       finish)
from workbook.measure import lesson_figures as lf
from workbook.trace import colors

RANK_COLORS = ["#56B4E9", "#009E73", "#CC79A7", "#E69F00"]     # rank 0..3 (not kinds of time)


def zigzag(S: int, n: int) -> Layout:
    """The zig-zag split (rank r holds chunks r and 2n-1-r), built here so that the measurement
    does not depend on the learner's ``zigzag_layout``."""
    return Layout(S, tuple((r, 2 * n - 1 - r) for r in range(n)), "zigzag")


# --------------------------------------------------------------------------- the online softmax
def partial(scores, v) -> Partial:
    """One block's online-softmax state from its scores ``[.., rows, keys]`` and values."""
    m = scores.amax(dim=-1)
    p = torch.exp(scores - m.unsqueeze(-1))
    return Partial(p @ v, m, p.sum(dim=-1))


def merge_problem(merge) -> str | None:
    """None if ``merge`` of two random blocks' states gives the softmax over both, else why not."""
    g = torch.Generator().manual_seed(1)
    sa, sb = (torch.randn(1, 2, 3, 4, generator=g, dtype=torch.float64) * 3 for _ in range(2))
    va, vb = (torch.randn(1, 2, 4, 5, generator=g, dtype=torch.float64) for _ in range(2))
    out, lse = finish([Partial(*merge(partial(sa, va), partial(sb, vb)))])
    s, v = torch.cat([sa, sb], -1), torch.cat([va, vb], -2)
    ok = torch.allclose(out, torch.softmax(s, -1) @ v) and torch.allclose(lse, s.logsumexp(-1))
    return None if ok else "it differs from the softmax over both blocks at once"


def rescale_table(merge, who: str, rows: int = 6, seed: int = 0) -> None:
    """Two blocks of five keys for ``rows`` query rows; the second block's scores stay below the
    first's maximum in the first half of the rows and rise above it in the second. Per row, the
    error of ``merge`` against the softmax over all ten keys, and that of a merge that never
    rescales the running state (block A)."""
    g = torch.Generator().manual_seed(seed)
    s_a = torch.randn(1, 1, rows, 5, generator=g, dtype=torch.float64) * 2
    top = s_a.amax(dim=-1, keepdim=True)
    below = top - 0.5 - torch.rand(1, 1, rows, 5, generator=g, dtype=torch.float64)
    above = top + 1.0 + 2 * torch.rand(1, 1, rows, 5, generator=g, dtype=torch.float64)
    s_b = torch.where(torch.arange(rows).view(1, 1, rows, 1) < rows // 2, below, above)
    v_a, v_b = (torch.randn(1, 1, 5, 4, generator=g, dtype=torch.float64) for _ in range(2))
    p_a, p_b = partial(s_a, v_a), partial(s_b, v_b)
    exact = torch.softmax(torch.cat([s_a, s_b], -1), -1) @ torch.cat([v_a, v_b], -2)
    merged, _ = finish([Partial(*merge(p_a, p_b))])
    m_new = torch.maximum(p_a.m, p_b.m)                  # the running state (a) never rescaled:
    f_b = torch.exp(p_b.m - m_new)
    careless, _ = finish([Partial(p_a.acc + p_b.acc * f_b.unsqueeze(-1), m_new,
                                  p_a.l + p_b.l * f_b)])
    print(f"{'row':>3}{'max of A':>10}{'max of B':>10}{'max moves':>11}{'exp(m_old-m_new)':>18}"
          f"{'|error|, ' + who + ' merge':>30}{'|error|, no rescale':>21}")
    for i in range(rows):
        ma, mb = p_a.m[0, 0, i].item(), p_b.m[0, 0, i].item()
        err = (merged - exact)[0, 0, i].abs().max().item()
        bad = (careless - exact)[0, 0, i].abs().max().item()
        print(f"{i:3d}{ma:10.2f}{mb:10.2f}{'yes' if mb > ma else 'no':>11}"
              f"{np.exp(ma - max(ma, mb)):18.3f}{err:30.1e}{bad:21.1e}")


def streamed_check(merge, keys: int = 96, block: int = 8, seed: int = 2) -> None:
    """One row of ``keys`` keys folded in ``block`` at a time with ``merge``, against the softmax
    over all of them at once: the running maximum after each block, and the errors."""
    g = torch.Generator().manual_seed(seed)
    s_row = torch.randn(1, 1, 1, keys, generator=g, dtype=torch.float64) * 3
    v_row = torch.randn(1, 1, keys, 4, generator=g, dtype=torch.float64)
    state, maxima = None, []
    for j in range(keys // block):
        rows = slice(block * j, block * (j + 1))
        new = partial(s_row[..., rows], v_row[..., rows, :])
        state = new if state is None else Partial(*merge(state, new))
        maxima.append(state.m.item())
    out, lse = finish([state])
    print(f"running max after each block: {' '.join(f'{m:.2f}' for m in maxima)}")
    print(f"streamed over {keys // block} blocks: |out - softmax| = "
          f"{(out - torch.softmax(s_row, -1) @ v_row).abs().max().item():.1e}, "
          f"|lse - logsumexp| = {(lse - s_row.logsumexp(-1)).abs().max().item():.1e}")


# --------------------------------------------------------------------------- the causal mask
def block_mask_problem(fn, reference) -> str | None:
    """None if ``fn`` agrees with the reference's ``block_mask`` on every pair of 5 chunks."""
    for qc in range(5):
        for kc in range(5):
            if fn(qc, kc) != reference.block_mask(qc, kc):
                return (f"block_mask({qc}, {kc}) = {fn(qc, kc)!r}, expected "
                        f"{reference.block_mask(qc, kc)!r}")
    return None


def block_pairs_problem(fn, reference) -> str | None:
    """None if ``fn`` lists the reference's blocks for every rank and source, on both splits."""
    def key(pairs):
        return sorted((q.start, q.stop, k.start, k.stop, bool(c)) for q, k, c in pairs)

    for lay in (contiguous_layout(12, 3), reference.zigzag_layout(16, 4)):
        for r in range(lay.n):
            for src in range(lay.n):
                if key(fn(lay, r, src)) != key(reference.block_pairs(lay, r, src)):
                    return f"block_pairs({lay.name} split, rank={r}, src={src}) lists other blocks"
    return None


def zigzag_problem(fn, reference) -> str | None:
    """None if ``fn`` gives the reference's zig-zag chunks."""
    for S, n in ((8, 2), (24, 4)):
        if fn(S, n).chunks != reference.zigzag_layout(S, n).chunks:
            return f"zigzag_layout({S}, {n}).chunks = {fn(S, n).chunks}"
    return None


def chunk_pairs(block_pairs, layout, rank: int, src: int) -> list[tuple]:
    """``(query chunk, key chunk, causal)`` of each block ``block_pairs`` lists."""
    L = layout.chunk_len
    return [(layout.chunks[rank][q.start // L], layout.chunks[src][k.start // L], causal)
            for q, k, causal in block_pairs(layout, rank, src)]


def mask_grid(layouts: dict, n: int, block_pairs, title: str):
    """Per layout a row of panels, one per ring step: the score matrix at chunk resolution, a cell
    coloured by the rank that computes it at that step (◣ diagonal, ■ full), grey if computed at
    another step, white if never."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    fig = make_subplots(rows=len(layouts), cols=n, horizontal_spacing=0.025, vertical_spacing=0.1,
                        subplot_titles=[f"{name}: step {t}" for name in layouts for t in range(n)])
    scale = [[0.0, colors.IDLE], [1 / (n + 1), colors.IDLE]]
    for r in range(n):
        scale += [[(r + 1) / (n + 1), RANK_COLORS[r]], [(r + 2) / (n + 1), RANK_COLORS[r]]]
    for row, lay in enumerate(layouts.values(), start=1):
        K = lay.n_chunks
        for t in range(n):
            z, text = [[None] * K for _ in range(K)], [[""] * K for _ in range(K)]
            for tt in range(n):
                for r in range(n):
                    for qc, kc, causal in chunk_pairs(block_pairs, lay, r, (r - tt) % n):
                        if tt == t:
                            z[qc][kc], text[qc][kc] = r, f"r{r} {'◣' if causal else '■'}"
                        elif z[qc][kc] is None:
                            z[qc][kc] = -1
            fig.add_trace(go.Heatmap(z=z, text=text, texttemplate="%{text}", colorscale=scale,
                                     zmin=-1.5, zmax=n - 0.5, showscale=False, xgap=2, ygap=2,
                                     hovertemplate="query chunk %{y}, key chunk %{x}: %{text}"
                                                   "<extra></extra>"), row=row, col=t + 1)
            fig.update_xaxes(tickvals=list(range(K)), showticklabels=False, row=row, col=t + 1,
                             title_text="key chunk" if row == len(layouts) else None)
            fig.update_yaxes(tickvals=list(range(K)), autorange="reversed", row=row, col=t + 1,
                             showticklabels=t == 0)
        fig.update_yaxes(title_text="query chunk", row=row, col=1)
    fig.update_layout(title=title, height=640, margin=dict(l=10, r=10, t=90, b=20),
                      plot_bgcolor="white")
    return fig


def step_work(layout, block_pairs) -> np.ndarray:
    """Score entries rank r needs at ring step t, in units of one (S/n) x (S/n) block."""
    L, n = layout.chunk_len, layout.n
    cells = {CAUSAL: L * (L + 1) / 2, FULL: L * L}
    return np.array([[sum(cells[CAUSAL if c else FULL] for *_, c in
                          block_pairs(layout, r, (r - t) % n)) / layout.local_len**2
                      for t in range(n)] for r in range(n)])


def work_figure(layouts: dict, block_pairs):
    """``causal_work()`` per rank for each layout, and the work per rank and ring step; prints how
    long the ring takes (its busiest rank at every step) and how busy an average rank is."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    n = next(iter(layouts.values())).n
    fig = make_subplots(rows=1, cols=1 + len(layouts), horizontal_spacing=0.08,
                        column_widths=[0.34] + [0.66 / len(layouts)] * len(layouts),
                        subplot_titles=["causal_work() per rank (M score entries)"]
                        + [f"{name}: work per rank and step" for name in layouts])
    for col, (name, lay) in enumerate(layouts.items(), start=2):
        work = lay.causal_work()
        fig.add_trace(go.Bar(x=[f"rank {r}" for r in range(n)], y=[w / 1e6 for w in work],
                             name=name, marker_color=colors.COMPUTE if col > 2 else colors.OTHER,
                             hovertemplate=name + ": %{y:.2f} M<extra></extra>"), 1, 1)
        per_step = step_work(lay, block_pairs)
        fig.add_trace(go.Heatmap(z=per_step, text=np.round(per_step, 2), texttemplate="%{text}",
                                 colorscale="Blues", zmin=0, zmax=1, showscale=False, xgap=2,
                                 ygap=2, hoverinfo="skip"), 1, col)
        busiest, mean = per_step.max(axis=0).sum(), per_step.sum(axis=1).mean()
        print(f"{name:11s} causal_work {work}: max/mean {max(work) / np.mean(work):.2f}; the ring "
              f"takes {busiest:.2f} block-times, {mean:.2f} of them busy on an average rank "
              f"({mean / busiest:.0%})")
        fig.update_xaxes(tickvals=list(range(n)), ticktext=[f"step {t}" for t in range(n)],
                         row=1, col=col)
        fig.update_yaxes(tickvals=list(range(n)), ticktext=[f"rank {r}" for r in range(n)],
                         autorange="reversed", row=1, col=col)
    fig.update_layout(height=330, margin=dict(l=10, r=10, t=60, b=30), barmode="group",
                      legend=dict(x=0.01, y=0.99))
    return fig


# --------------------------------------------------------------------------- at full speed
def cp_ratio(preset: str, c: float, share: float = 1.0, heads: int = 32, d: int = 128,
             batch: int = 1, e: int = 2) -> float:
    """t_hop / t_step at the real machine's speed: one K/V hop of ``c`` positions against one ring
    step's attention, ``share`` of a full block (1/2: a zig-zag step off the diagonal)."""
    lk = lf.full_speed(preset)
    hop = lk.op_time("send", 2 * batch * heads * c * d * e, 2)
    return hop / (share * 4 * batch * heads * c * c * d / lk.local_flops)


def crossing(preset: str, share: float) -> float:
    """The tokens per rank where t_hop = t_step (the ratio falls as c grows: bisect)."""
    lo, hi = 1.0, 1e8
    for _ in range(100):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if cp_ratio(preset, mid, share) > 1 else (lo, mid)
    return hi


def ratio_figure(presets=("dgx-h100", "dgx-h100-ib", "pcie-h100")):
    """``cp_ratio`` against the tokens per rank, per preset, for a full block and a zig-zag step;
    prints each preset's crossings and its ratios at 16k tokens per rank."""
    import plotly.graph_objects as go
    axis = np.logspace(7, 16, 73, base=2)                               # 128 .. 64k per rank
    fig = go.Figure()
    print(f"{'preset':13s}{'full block: c*':>16}{'zig-zag step: c*':>18}{'ratios at c = 16k':>20}")
    for preset, color in zip(presets, (colors.COMPUTE, colors.COMMUNICATION, colors.EXPOSED)):
        for share, dash in ((1.0, "solid"), (0.5, "dash")):
            fig.add_trace(go.Scatter(
                x=axis, y=[cp_ratio(preset, c, share) for c in axis], mode="lines",
                line=dict(color=color, dash=dash),
                name=f"{preset}, {'full block' if share == 1 else 'zig-zag step'}",
                hovertemplate="c = %{x:.0f}: ratio %{y:.2f}<extra></extra>"))
        print(f"{preset:13s}{crossing(preset, 1.0):16,.0f}{crossing(preset, 0.5):18,.0f}"
              f"{cp_ratio(preset, 16384, 1.0):12.2f} / {cp_ratio(preset, 16384, 0.5):.2f}")
    fig.add_hline(y=1, line_dash="dot", line_color=colors.OTHER)
    fig.update_xaxes(type="log", title_text="tokens per rank c = S/n")
    fig.update_yaxes(type="log", title_text="t_hop / t_step (below 1: the hop hides)")
    fig.update_layout(title="MODELLED at the real machines' speed: one K/V hop against one ring "
                      "step's attention (bf16, 32 heads of 128)", height=420,
                      margin=dict(l=10, r=10, t=60, b=40))
    return fig


def hop_verdict(preset="dgx-h100", seq_k=128, ranks=8, heads=32, head_dim=128) -> None:
    """Prints whether one hop hides behind one ring step (full block, zig-zag step)."""
    c = seq_k * 1024 / ranks                                     # tokens per rank
    full, zig = (cp_ratio(preset, c, share, heads, head_dim) for share in (1.0, 0.5))
    verdict = lambda r: "hides" if r < 1 else "exposed"          # noqa: E731
    print(f"{preset}, S = {seq_k}k over {ranks} ranks: {c:,.0f} tokens per rank, "
          f"{heads} heads of {head_dim} (bf16)\n"
          f"  full block:    t_hop / t_step = {full:.3f} -> the hop {verdict(full)}\n"
          f"  zig-zag step:  t_hop / t_step = {zig:.3f} -> the hop {verdict(zig)}\n"
          f"  crossing (32 heads of 128): {crossing(preset, 1.0):,.0f} / "
          f"{crossing(preset, 0.5):,.0f} tokens per rank")


def hop_explorer():
    """``hop_verdict`` with widgets: the machine, the sequence, the CP ranks and the heads."""
    import ipywidgets as W
    from workbook import link
    from workbook.measure.lesson_figures import live_figure
    controls = dict(
        preset=W.Dropdown(options=[p for p in link.PRESETS if p != "none"], value="dgx-h100"),
        seq_k=W.IntSlider(value=128, min=4, max=1024, step=4, description="S (k tokens)"),
        ranks=W.Dropdown(options=[2, 4, 8, 16, 32, 64], value=8, description="CP ranks"),
        heads=W.IntSlider(value=32, min=1, max=128, description="heads"),
        head_dim=W.Dropdown(options=[64, 128, 256], value=128, description="head dim"))
    return live_figure(hop_verdict, controls, [["preset", "seq_k"], ["ranks", "heads", "head_dim"]])


# --------------------------------------------------------------------------- on ranks
def check(impl) -> dict:
    """On every rank: the lab's ring attention, forward and backward, on both splits of a tiny
    fp64 case, against single-device causal attention: ``{split: "ok" | "WRONG: ..." | error}``."""
    import torch.distributed as dist

    from workbook.context_parallel import reference_attention
    from workbook.grading.labs import load_lab
    lab, r, n = load_lab("cp_ring", impl), dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(2, 3, 12, 5, generator=g, dtype=torch.float64) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = reference_attention(*leaves)
    ref.backward(do)
    want = [ref.detach()] + [t.grad for t in leaves]
    verdicts = {}
    for layout in (contiguous_layout(12, n), zigzag(12, n)):
        try:
            mine = [layout.shard(t, r, 2).requires_grad_() for t in (q, k, v)]
            out = lab.ring_attention(*mine, layout)
            out.backward(layout.shard(do, r, 2))
            got = [out.detach()] + [t.grad for t in mine]
            bad = [name for name, a, b in zip(("out", "dq", "dk", "dv"), got, want)
                   if a is None or not torch.allclose(a, layout.shard(b, r, 2), rtol=1e-9,
                                                      atol=1e-12)]
            verdicts[layout.name] = f"WRONG: {', '.join(bad)} differ from one device" if bad \
                else "ok"
        except Exception as exc:                 # noqa: BLE001 - unfinished work is expected
            verdicts[layout.name] = lf.verdict_of(exc)
    return verdicts


def ring_step(run_dir, impl, S: int, splits, B: int = 1, h: int = 4, d: int = 64) -> dict:
    """On every rank: recalibrate the link; per split, a warm-up step of forward and backward,
    then one under the profiler (``run_dir/SPLIT``, a ``forward`` and a ``backward`` range) while
    spies on the lab's ``block_forward``, ``block_backward`` and ``start_ring_exchange`` note each
    block (its pass, its query and key chunks, causal or not) and each hop (whose K/V, or a dK/dV
    sum). Per split, in ``lf.ms_now`` ms: the step's start, the forward pass's end, the end, the
    blocks, the hops, the link's sends and receives and each pass's hidden share in the trace."""
    from pathlib import Path

    import torch.distributed as dist

    from workbook import link, trace
    from workbook.grading.labs import load_lab
    from workbook.measure.calibration import recalibrate
    from workbook.measure.profiled_step import run_phases
    lab, rank, n = load_lab("cp_ring", impl), dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    whole = [torch.randn(B, h, S, d, generator=g) for _ in range(4)]    # q, k, v, dout: all of S
    result = {"local_flops": recalibrate(), "hop_bytes": 2 * B * h * (S // n) * d * 4,
              "splits": {}}
    names = ("block_forward", "block_backward", "start_ring_exchange")
    for split in splits:
        layout = contiguous_layout(S, n) if split == "contiguous" else zigzag(S, n)
        L = layout.chunk_len
        q, k, v, do = (layout.shard(t, rank, 2) for t in whole)
        firsts = [layout.shard(whole[1], src, 2)[:, :, 0] for src in range(n)]   # K's first row

        def chunk_of(x, table):
            return next((c for c in range(layout.n_chunks)
                         if torch.equal(x[:, :, 0], table[:, :, c * L])), "?")

        def step(traced):
            """A forward and a backward pass in ranges of their names (``run_phases``), the ranks
            starting together: (start, forward pass's end, end)."""
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            start = []
            took = run_phases(Path(run_dir) / split if traced else None, "lesson11", {
                "forward": lambda _: start.append(lf.ms_now()) or lab.ring_attention(qq, kk, vv,
                                                                                   layout),
                "backward": lambda y: y.backward(do)})
            return start[0], start[0] + took["forward"]["ms"], \
                start[0] + took["forward"]["ms"] + took["backward"]["ms"]

        step(False)                                                     # warm-up
        blocks, hops, real = [], [], {name: getattr(lab, name) for name in names}

        def note_block(name):
            def note(args, kwargs, t0, t1):
                blocks.append({"pass": "forward" if name == "block_forward" else "backward",
                               "start": t0, "end": t1, "q": chunk_of(args[0], whole[0]),
                               "k": chunk_of(args[1], whole[1]),
                               "causal": bool(kwargs.get("causal", args[-1]))})
            return note

        def spy_hop(send, *args, **kwargs):
            owner = next((s for s, first in enumerate(firsts)
                          if send.dim() == 5 and torch.equal(send[0][:, :, 0], first)), None)
            hops.append({"what": f"K/V of rank {owner}" if owner is not None else "dK/dV sum",
                         "posted": lf.ms_now()})
            return real["start_ring_exchange"](send, *args, **kwargs)

        before = len(link.op_log())
        try:
            for name in names[:2]:
                setattr(lab, name, lf.timed(real[name], note_block(name)))
            lab.start_ring_exchange = spy_hop
            t0, t1, t2 = step(True)
        finally:
            for name in names:
                setattr(lab, name, real[name])
        t = trace.load_trace(Path(run_dir) / split / f"rank{rank}.trace.json")
        result["splits"][split] = {
            "t0": t0, "forward_end": t1, "end": t2, "blocks": blocks, "hops": hops,
            "ops": lf.link_ops(before, kinds=("send", "recv")), "chunks": layout.chunks,
            "hidden": {ph: lf.overlap_summary(trace.overlap(t, within=ph))
                       for ph in ("forward", "backward")}}
    return result


def ring_sweep(run_dir, impl, sizes) -> dict:
    """On every rank: ``ring_step`` of the zig-zag split for each sequence length in ``sizes``."""
    from pathlib import Path
    return {S: ring_step(str(Path(run_dir) / str(S)), impl, S, ("zigzag",)) for S in sizes}


# --------------------------------------------------------------------------- drawn from ranks
def _shifted(ops, zero: float) -> list[dict]:
    return [{**o, **{k: o[k] - zero for k in ("issued", "start", "end")},
             "waited": None if o["waited"] is None else o["waited"] - zero} for o in ops]


def ring_timeline(results: list, split: str, title: str):
    """Both ranks' step of ``split``: on each compute row one bar per block (dark blue forward,
    light blue backward, ◣ a diagonal block); on the link rows each send and receive, queued
    (dotted), carried, and red from the moment the rank waited for it."""
    import plotly.graph_objects as go
    per_rank = [res["splits"][split] for res in results]
    zero = min(p["t0"] for p in per_rank)
    fig, order = go.Figure(), []
    for r, p in enumerate(per_rank):
        rows = (f"rank {r} · compute", f"rank {r} · link: send", f"rank {r} · link: receive")
        order += rows
        for b in p["blocks"]:
            name = f"q{b['q']}·k{b['k']}{' ◣' if b['causal'] else ''}"
            fig.add_trace(lf.span(b["start"] - zero, b["end"] - zero, rows[0],
                                  colors.COMPUTE if b["pass"] == "forward" else lf.BACKWARD,
                                  f"{b['pass']}: {name}, {b['end'] - b['start']:.0f} ms",
                                  name if b["end"] - b["start"] > 0.03 * (p["end"] - p["t0"])
                                  else ""))
        for op, y in (("send", rows[1]), ("recv", rows[2])):
            # the k-th send of rank r carries hops[k]; its k-th receive, the k-th of rank r - 1
            hops = (p if op == "send" else per_rank[(r - 1) % len(per_rank)])["hops"]
            what = [f"{op} #{k}: {hop['what']}" for k, hop in enumerate(hops)]
            lf.link_bars(fig, _shifted([o for o in p["ops"] if o["op"] == op], zero), y,
                         exposed_from=lambda o: o["waited"], names=what,
                         text=lambda o, k: ("dK/dV" if k < len(what) and "dK/dV" in what[k]
                                            else "K/V"))
    fig.add_vline(x=per_rank[0]["forward_end"] - zero, line_dash="dash", line_color=colors.OTHER,
                  annotation_text="rank 0: backward begins", annotation_position="top")
    lf.legend_keys(fig, order[0], {"forward block": colors.COMPUTE,
                                   "backward block": lf.BACKWARD,
                                   "on the link": colors.COMMUNICATION,
                                   "on the link, waited for (exposed)": colors.EXPOSED})
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1])
    fig.update_layout(title=title, height=140 + 48 * len(order), barmode="overlay",
                      plot_bgcolor="white", xaxis_title="ms since the step began",
                      legend=dict(orientation="h", y=-0.25), margin=dict(l=10, r=10, t=60, b=40))
    return fig


def hidden_table(results: list, splits=("zigzag", "contiguous")) -> None:
    """Per split, rank and pass: the link time, the hidden share (and with skew counted as
    hidden, as the grader does) and the exposed time, from each rank's trace."""
    print(f"{'split':11s}{'rank':>5}{'pass':>10}{'link ms':>9}{'hidden %':>10}{'w/o skew %':>12}"
          f"{'exposed ms':>12}")
    for split in splits:
        for r, res in enumerate(results):
            for phase, o in res["splits"][split]["hidden"].items():
                print(f"{split:11s}{r:5d}{phase:>10}{o['comm_ms']:9.0f}{o['pct'] or 0:10.0f}"
                      f"{o['pct_ex_skew'] or 0:12.0f}{o['exposed_ms']:12.0f}")


def prediction_table(results: list, mine, sim, S: int, B: int = 1, h: int = 4,
                     d: int = 64) -> None:
    """The lab's prediction task at the traced step's shape (zig-zag, fp32, the link ``sim`` as
    the ranks calibrated it): your ``predict_forward_exposed_ms`` (``-`` until it is written),
    the model's value (only once your prediction exists: before, it would be the answer), and
    the forward pass's exposed exchange in the trace (the slower rank, skew excused)."""
    from workbook.context_parallel.cp_ring_report import PREDICTED, forward_exposed_model_ms
    from workbook.grading.predictions import comparison_lines
    n = len(results)
    try:
        predicted = float(mine.predict_forward_exposed_ms(sim, n, S, B, h, d, torch.float32))
    except Exception:                               # noqa: BLE001 - not written yet: "-"
        predicted = None
    # the model's value only beside a prediction of your own: before it, it would be the answer
    model = None if predicted is None else forward_exposed_model_ms(sim, n, S, B, h, d, 4)
    measured = max(max(0.0, o["exposed_ms"] - o["skew_ms"])
                   for o in (res["splits"]["zigzag"]["hidden"]["forward"] for res in results))
    for line in comparison_lines([(PREDICTED, predicted, model, measured)]):
        print(line)
    if predicted is None:
        print("  (write predict_forward_exposed_ms first: the model's value is shown beside "
              "your prediction, not before it)")


def sweep_rows(sweep: list, preset: str, ranks: int, B: int = 1, h: int = 4,
               d: int = 64) -> list[dict]:
    """Per sequence length of ``ring_sweep``: the calibrated rate, the forward hop (modelled), the
    attention the slower rank computed between posting it and waiting for it, the ratio of the
    two by the FLOP model (step 0's three blocks at the calibrated rate) and as measured, and
    each pass's hidden share (the ranks' mean)."""
    from workbook import link
    rows = []
    for S in sweep[0]:
        per_rank = [res[S] for res in sweep]
        lk = link.make_link(preset, per_rank[0]["local_flops"])
        hop = lk.op_time("send", per_rank[0]["hop_bytes"], ranks) * 1e3
        L = S // (2 * ranks)
        model = hop / (3 * 4 * B * h * L * L * d / lk.local_flops * 1e3)
        behind = []
        for res in per_rank:
            p = res["splits"]["zigzag"]
            recv = next(o for o in p["ops"] if o["op"] == "recv")
            behind.append(sum(b["end"] - b["start"] for b in p["blocks"]
                              if b["pass"] == "forward" and recv["issued"] <= b["start"]
                              and b["end"] <= (recv["waited"] or 0)))
        hidden = {ph: np.mean([r["splits"]["zigzag"]["hidden"][ph]["pct"] or 0 for r in per_rank])
                  for ph in ("forward", "backward")}
        rows.append(dict(S=S, gflops=lk.local_flops / 1e9, hop=hop, behind=min(behind),
                         model=model, measured=hop / max(min(behind), 1e-3), **hidden))
    return rows


SWEEP_COLUMNS = [("S", 6, "{S:d}"), ("GFLOP/s", 9, "{gflops:.0f}"), ("hop ms", 8, "{hop:.0f}"),
                 ("attention behind it, ms", 25, "{behind:.0f}"),
                 ("ratio: FLOP model", 19, "{model:.2f}"), ("measured", 10, "{measured:.2f}"),
                 ("fwd hidden %", 14, "{forward:.0f}"), ("bwd hidden %", 14, "{backward:.0f}")]


def sweep_figure(rows, title: str):
    """Left, the forward hop over the attention behind it, modelled and measured; right, each
    pass's hidden share, with 1 / ratio dotted."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    sizes = [r["S"] for r in rows]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        "forward hop / attention behind it", "link time hidden (mean of the ranks)"))
    for key, name, dash in (("model", "FLOP model", "dash"), ("measured", "measured", "solid")):
        fig.add_trace(go.Scatter(x=sizes, y=[r[key] for r in rows], mode="lines+markers",
                                 name=f"ratio, {name}",
                                 line=dict(color=colors.COMMUNICATION, dash=dash),
                                 hovertemplate="S = %{x}: %{y:.2f}<extra></extra>"), 1, 1)
    fig.add_hline(y=1, line_dash="dot", line_color=colors.OTHER, row=1, col=1)
    for phase, color in (("forward", colors.COMPUTE), ("backward", lf.BACKWARD)):
        fig.add_trace(go.Scatter(x=sizes, y=[r[phase] for r in rows], mode="lines+markers",
                                 name=f"{phase} hidden", line=dict(color=color),
                                 hovertemplate="S = %{x}: %{y:.0f}%<extra></extra>"), 1, 2)
    fig.add_trace(go.Scatter(x=sizes, y=[min(100, 100 / r["measured"]) for r in rows],
                             mode="lines", name="forward, if hidden = 1 / ratio",
                             line=dict(color=colors.OTHER, dash="dot")), 1, 2)
    fig.update_xaxes(title_text="sequence length S (2 ranks, zig-zag)")
    fig.update_yaxes(type="log", title_text="ratio (below 1: hides)", row=1, col=1)
    fig.update_yaxes(title_text="% of the pass's link time", range=[0, 105], row=1, col=2)
    fig.update_layout(title=title, height=420, margin=dict(l=10, r=10, t=80, b=40))
    return fig
