"""Lesson 13's helpers (lab ``ep_overlap``): routing and its load, the all-to-all's cost on the
link model, two micro-batches on paper, and the lab's layer on ranks, traced.

On paper (no rank starts):

* ``routing``: ``ep`` ranks' tokens routed by the given ``route`` (top-k of a softmax), their
  router logits tilted by ``skew`` so that low-numbered experts are more popular; the assignments
  per source rank and expert (``counts [ep][E]``) and the load-balancing loss. ``load_heatmap``
  draws the counts; ``sent_rows`` turns them into rows from each rank to each rank;
* ``a2a_costs``: an uneven all-to-all of those rows on a link (``Link.all_to_all_time``, the busiest
  rank's bytes), beside the same bytes spread evenly; ``busiest_figure`` draws each rank's bytes
  sent and received; ``load_explorer`` puts it all under widgets (E, k, skew, EP size, ...);
* ``simulated_all_to_all`` and ``adjoint_check``: the all-to-all as a matrix on one process,
  its transpose the exchange with the splits swapped (why a dispatch's backward is a combine);
* ``play`` / ``paper_figure``: a two-micro-batch schedule (``two_batch``'s actions) played with
  given costs on one compute stream and one link, every wait's exposed part drawn.

On ranks (``on_ranks``, 2 ranks, the simulated ``dgx-h100`` link): ``check`` (the lab's variants
against the single-device layer, fp64, a verdict each) and ``ep_step`` (one traced step per variant
at the grader's overlap shape: the two-micro-batch executor's actions, the link's all-to-alls, each
pass's hidden share, the shared expert's time); ``rank_timeline``, ``hidden_table`` and
``prediction_table`` show them.
"""
from __future__ import annotations

import math

import torch

from workbook.measure import lesson_figures as lf
from workbook.model.moe import load_balancing_loss, route
from workbook.trace import colors

PRESET = "dgx-h100"
A_COLOR, B_COLOR = colors.COMPUTE, colors.MEMCPY            # micro-batch A, micro-batch B


# --------------------------------------------------------------------------- routing (section 1)
def tilted_logits(tokens: int, num_experts: int, skew: float, seed: int = 0) -> torch.Tensor:
    """Router logits ``[tokens, E]``: standard normal per token (a random router on random
    tokens), plus a tilt that lowers expert e's logit by ``skew * e / (E - 1)`` (0: balanced)."""
    gen = torch.Generator().manual_seed(seed)                # fp32: the explorer's 64k x 256
    tilt = -skew * torch.arange(num_experts, dtype=torch.float32) / max(num_experts - 1, 1)
    return torch.randn(tokens, num_experts, generator=gen) + tilt


def routing(num_experts: int, top_k: int, tokens_per_rank: int, ep: int, skew: float = 0.0,
            seed: int = 0) -> dict:
    """Every rank's tokens routed by the given ``route`` (the logits fed as tokens through an
    identity router). Returns ``counts [ep][E]`` (assignments of rank r's tokens to expert e),
    ``aux`` (the load-balancing loss of all the tokens) and the routing itself (``probs``,
    ``experts``, ``weights``)."""
    if num_experts % ep:
        raise ValueError(f"E={num_experts} experts do not split over EP={ep} ranks: choose E as "
                         f"a multiple of {ep}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top-k={top_k} must be between 1 and E={num_experts}")
    logits = tilted_logits(ep * tokens_per_rank, num_experts, skew, seed)
    r = route(logits, torch.eye(num_experts, dtype=logits.dtype), top_k)
    per_rank = r.experts.reshape(ep, tokens_per_rank * top_k)
    counts = [torch.bincount(row, minlength=num_experts).tolist() for row in per_rank]
    return {"counts": counts, "aux": float(load_balancing_loss(r.probs, r.experts)),
            "probs": r.probs, "experts": r.experts, "weights": r.weights}


def sent_rows(counts, ep: int) -> list[list[int]]:
    """Rows rank s sends rank d (``[ep][ep]``): s's assignments to the experts d holds (expert e
    lives on rank ``e // (E / ep)``). The diagonal stays home."""
    per = len(counts[0]) // ep
    return [[sum(row[d * per:(d + 1) * per]) for d in range(ep)] for row in counts]


def load_heatmap(counts, title: str = ""):
    """Tokens per expert (columns, grouped by the rank that holds them) per source rank (rows)."""
    import plotly.graph_objects as go
    ep, E = len(counts), len(counts[0])
    per = E // ep
    fig = go.Figure(go.Heatmap(
        z=counts, x=[f"e{e}·r{e // per}" for e in range(E)], y=[f"rank {r}" for r in range(ep)],
        colorscale="Blues", colorbar=dict(title="tokens"),
        text=counts if E * ep <= 256 else None, texttemplate="%{text}" if E * ep <= 256 else None,
        hovertemplate="from %{y} to expert %{x}: %{z} tokens<extra></extra>"))
    for d in range(1, ep):                               # the rank boundaries between experts
        fig.add_vline(x=d * per - 0.5, line_color=colors.EXPOSED, line_width=1)
    fig.update_yaxes(autorange="reversed", title="source rank")
    fig.update_xaxes(title="expert · the rank that holds it", type="category")
    fig.update_layout(title=title, height=160 + 28 * ep, margin=dict(l=10, r=10, t=60, b=40))
    return fig


# --------------------------------------------------------------------------- cost (section 3)
def rank_bytes(rows, row_bytes: int) -> tuple[list[int], list[int]]:
    """``(sent, received)`` bytes per rank, leaving out what a rank keeps (the diagonal)."""
    n = len(rows)
    sent = [sum(rows[r][d] for d in range(n) if d != r) * row_bytes for r in range(n)]
    got = [sum(rows[s][r] for s in range(n) if s != r) * row_bytes for r in range(n)]
    return sent, got


def a2a_costs(link, rows, row_bytes: int) -> dict:
    """One dispatch's all-to-all on ``link``, in ms: ``uneven`` (these rows) and ``balanced`` (the
    same bytes, every pair of ranks an equal share), with each rank's bytes and the busiest."""
    n = len(rows)
    matrix = [[c * row_bytes for c in r] for r in rows]
    total = sum(sum(r) for r in matrix)
    even = [[total / (n * n)] * n for _ in range(n)]
    sent, got = rank_bytes(rows, row_bytes)
    busiest = max(range(n), key=lambda r: max(sent[r], got[r]))
    return {"uneven": link.all_to_all_time(matrix, range(n)) * 1e3,
            "balanced": link.all_to_all_time(even, range(n)) * 1e3,
            "sent": sent, "received": got, "busiest": busiest}


def busiest_figure(costs: dict, title: str):
    """Each rank's bytes sent and received (MiB) in the all-to-all, the busiest rank marked."""
    import plotly.graph_objects as go
    n = len(costs["sent"])
    ranks = [f"rank {r}" + (" (busiest)" if r == costs["busiest"] else "") for r in range(n)]
    fig = go.Figure([go.Bar(x=ranks, y=[b / 2**20 for b in costs[key]], name=key,
                            marker_color=c)
                     for key, c in (("sent", colors.COMMUNICATION), ("received", colors.EXPOSED))])
    mean = sum(costs["received"]) / n / 2**20
    fig.add_hline(y=mean, line_dash="dot", annotation_text="the mean: what a balanced router gives")
    fig.update_layout(title=title, barmode="group", yaxis_title="MiB", height=360,
                      margin=dict(l=10, r=10, t=60, b=40))
    return fig


def real_link(preset: str, ep: int, gpus_per_node: int = 8):
    """``preset`` at its real GPU's rate (not this CPU's slow motion), ``gpus_per_node`` ranks a
    node: an EP group larger than a node crosses the network."""
    from workbook import link
    p = link.PRESETS[preset]
    return link.make_link(preset, p.peak_tflops * 1e12, gpus_per_node if ep > gpus_per_node else 0)


def explore(E: int, k: int, skew: float, ep: int, tokens: int, hidden: int, preset: str):
    """One view of the explorer: the heatmap of the routing, and the dispatch's cost printed."""
    if E % ep or k > E:
        print(f"E={E} must be a multiple of EP={ep}, and k={k} at most E")
        return None
    r = routing(E, k, tokens, ep, skew)
    rows, lk = sent_rows(r["counts"], ep), real_link(preset, ep)
    c = a2a_costs(lk, rows, hidden * 2)                  # bf16 activations
    load = [sum(col) for col in zip(*r["counts"])]
    print(f"aux loss {r['aux']:.3f} (1 = balanced); the busiest expert takes {max(load)} of "
          f"{sum(load)} assignments ({max(load) / (sum(load) / E):.2f}x the mean)")
    print(f"dispatch on {preset}" + (" (nodes of 8, over the network)" if ep > 8 else "")
          + f", bf16, H={hidden}: {c['uneven']:.3f} ms; the same bytes balanced "
          f"{c['balanced']:.3f} ms ({c['uneven'] / c['balanced']:.2f}x); busiest: rank "
          f"{c['busiest']}")
    return load_heatmap(r["counts"], f"tokens per expert per rank: E={E}, k={k}, skew {skew:g}, "
                                     f"EP={ep}, {tokens} tokens a rank")


def load_explorer():
    """``explore`` under widgets: E, k, skew, EP size, tokens a rank, hidden, the machine."""
    import ipywidgets as W
    style = {"description_width": "110px"}
    controls = dict(
        E=W.Dropdown(options=[4, 8, 16, 32, 64, 128, 256], value=16, description="experts E",
                     style=style),
        k=W.IntSlider(value=2, min=1, max=8, description="top-k", style=style),
        skew=W.FloatSlider(value=1.0, min=0.0, max=5.0, step=0.25, description="router skew",
                           style=style),
        ep=W.Dropdown(options=[2, 4, 8, 16, 32], value=8, description="EP ranks", style=style),
        tokens=W.Dropdown(options=[256, 512, 1024, 2048], value=1024, description="tokens a rank",
                          style=style),
        hidden=W.Dropdown(options=[2048, 4096, 7168], value=4096, description="hidden H",
                          style=style),
        preset=W.Dropdown(options=["dgx-h100", "dgx-a100", "pcie-h100"], value=PRESET,
                          description="machine", style=style))
    return lf.live_figure(explore, controls, [["E", "k", "skew"], ["ep", "tokens", "hidden"],
                                              ["preset"]])


# --------------------------------------------------------------------------- autograd (section 4)
def simulated_all_to_all(buffers: list, splits: list[list[int]]) -> list:
    """An all-to-all of ``buffers`` (one ``[N_r, H]`` per rank) on one process: rank s sends its
    rows in consecutive runs of ``splits[s][d]`` rows to rank d; rank d receives source 0's run,
    then source 1's, ... A reference for the picture, not the lab's ``AllToAll``."""
    runs = [list(torch.split(b, list(s))) for b, s in zip(buffers, splits)]
    return [torch.cat([runs[s][d] for s in range(len(buffers))]) for d in range(len(buffers))]


def adjoint_check(splits: list[list[int]], hidden: int = 3, seed: int = 0) -> dict:
    """The all-to-all of ``splits`` as a matrix ``P`` over all the rows (it is a permutation);
    ``P^T`` applied to the received side equals the exchange with ``splits`` transposed (each
    rank's receive splits as its send splits). Returns both checks and the matrix's shape."""
    n = len(splits)
    sizes = [sum(s) for s in splits]
    back = [[splits[s][d] for s in range(n)] for d in range(n)]    # what d received, by source
    total = sum(sizes)
    eye = torch.eye(total, dtype=torch.float64)
    P = torch.cat(simulated_all_to_all(list(torch.split(eye, sizes)), splits))  # [M, N]
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(total, hidden, generator=gen, dtype=torch.float64)   # a gradient, received
    recv_sizes = [sum(b) for b in back]
    swapped = torch.cat(simulated_all_to_all(list(torch.split(g, recv_sizes)), back))
    return {"shape": tuple(P.shape), "permutation": bool((P.sum(0) == 1).all() and
                                                           (P.sum(1) == 1).all()),
            "transpose_is_swapped": bool(torch.equal(P.T @ g, swapped))}


# --------------------------------------------------------------------------- on paper (section 7)
def play(schedule, costs: dict) -> dict:
    """``schedule`` (``(kind, mb, step)`` actions) on one compute stream and one link: a compute
    takes ``costs[step]``; a start puts its transfer on the link (``costs["transfer"]``, after the
    one before it); a wait holds the stream until its transfer is over. Returns the spans per
    row, the time the stream waited and the end."""
    now, link_free, ends, rows = 0.0, 0.0, {}, {"compute": [], "link": []}
    waited = 0.0
    for kind, mb, step in schedule:
        if kind == "compute":
            rows["compute"].append((now, now + costs[step], mb, f"{mb}.{step}"))
            now += costs[step]
        elif kind == "start":
            a = max(now, link_free)
            link_free = ends[(mb, step)] = a + costs["transfer"]
            rows["link"].append((a, link_free, "transfer", f"{mb}.{step}"))
        else:
            end = ends[(mb, step)]
            if end > now:
                rows["compute"].append((now, end, "waiting", f"wait {mb}.{step}"))
                waited += end - now
                now = end
    return {"rows": rows, "waited": waited, "end": now}


def paper_figure(schedules: dict, costs: dict, title: str):
    """Schedules (``{name: actions}``) played by ``play``, a compute row and a link row each."""
    rows = {}
    for name, acts in schedules.items():
        played = play(acts, costs)
        print(f"{name}: ends at {played['end']:g}, waits {played['waited']:g} "
              f"(transfer {costs['transfer']:g})")
        rows[f"{name} · compute"] = played["rows"]["compute"]
        rows[f"{name} · link"] = played["rows"]["link"]
    return lf.lanes_figure(rows, title, {"A": A_COLOR, "B": B_COLOR, "transfer":
                                         colors.COMMUNICATION, "waiting": colors.EXPOSED},
                           "time (units of the costs)", thin=("transfer",))


def schedule_or_none(lab, phase: str):
    """The lab's ``two_batch_schedule(phase)`` where the given ``check_schedule`` accepts it, else
    None, saying why (never the reference: the order is the task)."""
    from workbook.expert_parallel.two_batch import check_schedule
    try:
        acts = [tuple(a) for a in lab.two_batch_schedule(phase)]
        check_schedule(acts, phase)
    except Exception as exc:                     # noqa: BLE001 - unfinished work is expected
        print(f"your two_batch_schedule({phase!r}): {lf.verdict_of(exc)}")
        return None
    print(f"your two_batch_schedule({phase!r}) runs and hides: drawn below")
    return acts


# --------------------------------------------------------------------------- dispatch (section 2)
def dispatch_on_paper(num_experts: int = 4, top_k: int = 2, tokens: int = 3, ep: int = 2,
                      skew: float = 1.0, seed: int = 3) -> dict:
    """The given bookkeeping on every rank of a tiny routing, on one process: each rank's kept
    assignments sorted by expert (``sort_by_expert``: token, slot, rows per expert) and its send
    splits (``rank_splits``), printed. Returns ``{"counts": [ep][E] tensors, ...}`` for the
    cells that follow (what each rank sends each expert)."""
    from workbook.expert_parallel.expert_parallel import rank_splits, sort_by_expert
    r = routing(num_experts, top_k, tokens, ep, skew, seed)
    experts = r["experts"].reshape(ep, tokens, top_k)
    out = {"counts": [], "experts": experts}
    for rank in range(ep):
        keep = torch.ones(tokens, top_k, dtype=torch.bool)
        token, slot, counts = sort_by_expert(experts[rank], keep, num_experts)
        out["counts"].append(counts)
        print(f"rank {rank}: experts chosen per token {experts[rank].tolist()}")
        print(f"         sorted by expert: token {token.tolist()}, slot {slot.tolist()}; rows per "
              f"expert {counts.tolist()} -> send splits {rank_splits(counts, ep)}")
    return out


def regroup_on_paper(recv_counts: torch.Tensor) -> None:
    """What a rank does with the rows that arrive, source-major (``recv_counts [ep, E/ep]``: row
    s what source s sent each local expert): the given ``expert_major_order``, printed with
    labels ``s0e1`` (from source 0, for local expert 1)."""
    from workbook.expert_parallel.expert_parallel import expert_major_order
    labels = [f"s{s}e{e}" for s, row in enumerate(recv_counts.tolist())
              for e, c in enumerate(row) for _ in range(c)]
    order = expert_major_order(recv_counts)
    print("arrived (source-major):", " ".join(labels))
    print("order                 :", order.tolist())
    print("regrouped (expert-major):", " ".join(labels[i] for i in order.tolist()))


# --------------------------------------------------------------------------- shared expert (5)
def mlp_ms(tokens: int, hidden: int, width: int, flops: float) -> float:
    """A GPT MLP's forward (two products, ``2 * tokens * hidden * width`` FLOPs each) in ms at
    ``flops`` FLOP/s."""
    return 4 * tokens * hidden * width / flops * 1e3


def shared_vs_dispatch(rows, tokens: int, hidden: int, widths=(1, 2, 4), preset: str = PRESET,
                       itemsize: int = 2) -> None:
    """The dispatch of ``rows`` (``[ep][ep]``) on ``preset`` at its real rate, beside a shared
    expert of ``w * hidden`` wide for each ``w`` of ``widths`` on ``tokens`` tokens at the GPU's
    peak: what there is to hide, and what could hide it (the exposed part is yours to work out)."""
    ep = len(rows)
    lk = real_link(preset, ep)
    t = a2a_costs(lk, rows, hidden * itemsize)["uneven"]
    where = "across nodes of 8" if ep > 8 else "inside one node"
    print(f"EP {ep} ({where}): dispatch on {preset}, H={hidden}, {itemsize}-byte activations: "
          f"{t * 1e3:.1f} us")
    for w in widths:
        s = mlp_ms(tokens, hidden, w * hidden, lk.local_flops)
        print(f"  shared expert {w}H wide on {tokens} tokens at {lk.local_flops / 1e12:.0f} "
              f"TFLOP/s: {s * 1e3:.1f} us")


# --------------------------------------------------------------------------- deferred wgrad (6)
def deferred_demo(hidden: int = 8, width: int = 12, rows: int = 5, seed: int = 0) -> None:
    """One expert run by the given ``run_experts_deferred`` on one device: after ``backward``,
    the input gradient is there and the weights' are not, their products wait in the store; the
    store's ``flush`` then gives autograd's own weight gradients. Printed."""
    from workbook.expert_parallel.deferred_wgrad import ExpertGradStore, run_experts_deferred
    from workbook.model import ModelConfig, MoE, MoEConfig
    cfg = ModelConfig(style="gpt", dtype="float64", hidden=hidden, heads=2, ffn_hidden=width)
    moe = MoE(cfg, MoEConfig(num_experts=1, top_k=1))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=gen, dtype=torch.float64, requires_grad=True)
    g = torch.randn(rows, hidden, generator=gen, dtype=torch.float64)
    expert = moe.expert_list()[0]
    expert(x).backward(g)                                   # autograd's way: both at once
    want = {n: p.grad.clone() for n, p in expert.named_parameters()}
    dx_autograd = x.grad.clone()
    expert.zero_grad(set_to_none=True)
    x.grad = None
    store = ExpertGradStore()
    run_experts_deferred([expert], x, [rows], store).backward(g)
    print("after backward: input gradient equal to autograd's:", torch.equal(x.grad, dx_autograd))
    print("                weight gradients:", {n.split("mlp.")[1]: p.grad for n, p in
                                                 expert.named_parameters()})
    print("                waiting in the store:", store.pending())
    print("flush: linears updated", store.flush(),
          "; equal to autograd's:", all(torch.allclose(p.grad, want[n])
                                        for n, p in expert.named_parameters()))
