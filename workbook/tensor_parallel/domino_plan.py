"""The planner of lesson 6: a training step on paper, drawn from the lab's own ``schedule``.

A rank has two resources: its compute thread and the link, which carries one operation at a
time in issue order (``workbook.link``). Compute time is FLOPs over a FLOP rate; an all-reduce
costs ``link.op_time`` (latency + bytes x bus factor / bandwidth). ``plan`` replays a step and
records when each resource is busy:

* ``"vanilla"``: every all-reduce waited on at once; ``"no_comm"``: the same without them;
* ``"domino"`` and ``"domino_intra"``: the events of ``schedule(stages, p, lookahead,
  inter_layer)`` -- the learner's function from ``labs/domino.py`` (or the reference's) -- with
  the backward replayed in reverse event order, as autograd runs it (Wang et al. 2024, arXiv
  2409.15241): a ``compute`` starts the chunk's all-reduce, its backward the gradient's; a
  ``prepare`` (or ``wait``) waits for the chunk's last forward all-reduce, and its backward, the
  no-op, for the gradient's;
* ``"column"``: the column split of B, forward only.

The backward does the matmuls twice (input and weight gradients): twice the forward FLOPs.
Messages are fp32, as in the lab. ``hidden_pct`` reads the share of a pass's link time that
lies under compute; ``busy_ms`` and ``exposed_ms`` the compute and the exposed communication
(``exposed_ms`` is the model the lab's prediction is judged against); ``chunk_seconds`` says
whether a setting is compute-bound; ``plan_figure`` draws a plan like
``workbook.trace.timeline_figure``.
"""
from __future__ import annotations

from workbook.trace import intervals as iv
from workbook.tensor_parallel.layer_stack import HEAD, stages

RANKS = 2
VARIANTS = ("vanilla", "no_comm", "domino", "domino_intra", "column")


def sublayer_flops(model: dict, tokens: float, ranks: int = RANKS) -> dict:
    """One rank's FLOPs for ``tokens`` tokens: ``{kind: (A half, B half)}`` for attn, mlp, head."""
    h, f, s, v = (model[k] for k in ("hidden", "ffn_hidden", "seq_len", "vocab_size"))
    per_token = {"attn": ((6 * h * h + 4 * s * h) / ranks, 2 * h * h / ranks),  # q,k,v + scores | wo
                 "mlp": (2 * h * f / ranks, 2 * h * f / ranks),                 # fc1 | fc2
                 "head": (2 * h * v, 0.0)}                                      # replicated LM head
    return {k: (a * tokens, b * tokens) for k, (a, b) in per_token.items()}


class Plan:
    """One rank's planned step: spans ``(start, end, label)`` on the compute thread and on the
    link (seconds); ``t`` the step's end, ``fwd_end`` the forward's."""

    def __init__(self):
        self.t = self.link_free = self.fwd_end = 0.0
        self.compute: list[tuple] = []
        self.comm: list[tuple] = []

    def run(self, seconds: float, label: str) -> None:
        self.compute.append((self.t, self.t + seconds, label))
        self.t += seconds

    def all_reduce(self, seconds: float, label: str) -> float:
        """Issue an all-reduce now; returns when its result will be there."""
        start = max(self.t, self.link_free)
        self.link_free = start + seconds
        self.comm.append((start, start + seconds, label))
        return start + seconds

    def wait(self, until: float) -> None:
        self.t = max(self.t, until)


def _name(stage) -> str:
    return "head" if stage == HEAD else f"layer{stage[0]}.{stage[1]}"


def plan(variant: str, schedule=None, *, model: dict, batch: int, p: int, flops_rate: float,
         lk, lookahead: int = 1, ranks: int = RANKS) -> Plan:
    """Plan one training step of ``variant`` (see the module docstring) on the link ``lk``.

    ``schedule``: the lab's ``schedule`` function (needed for the Domino variants)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, not {variant!r}")
    tokens = batch * model["seq_len"]
    order = stages(model["n_layers"])
    pieces = p if variant.startswith("domino") else 1
    fl = sublayer_flops(model, tokens / pieces, ranks)
    secs = lambda st, times=1: times * sum(fl[st[1]]) / flops_rate         # noqa: E731
    nbytes = int(tokens / pieces * model["hidden"] * 4)
    ar = 0.0 if variant == "no_comm" or lk is None else lk.op_time("all_reduce", nbytes, ranks)
    pl = Plan()
    if variant in ("vanilla", "no_comm"):
        for phase, run, times in (("fwd", order, 1), ("bwd", order[::-1], 2)):
            for st in run:
                pl.run(secs(st, times), f"{_name(st)} {phase}")
                if st != HEAD and ar:
                    pl.wait(pl.all_reduce(ar, f"{_name(st)} {phase}"))    # blocking: on the path
            pl.fwd_end = pl.fwd_end or pl.t
    elif variant == "column":
        piece = 0.0 if lk is None else lk.op_time("all_reduce", nbytes // p, ranks)
        for st in order:
            a, b = fl[st[1]]
            pl.run(a / flops_rate, f"{_name(st)} A fwd")
            if st != HEAD:
                ends = []
                for j in range(p):
                    pl.run(b / p / flops_rate, f"{_name(st)} B piece{j} fwd")
                    ends.append(pl.all_reduce(piece, f"{_name(st)} piece{j} fwd"))
                pl.wait(max(ends))                   # the next norm needs every feature
        pl.fwd_end = pl.t
    else:
        if schedule is None:
            raise ValueError("plan a Domino variant with the lab's schedule function")
        _replay(pl, schedule(order, p, lookahead, variant == "domino"), secs, ar)
    return pl


def _replay(pl: Plan, events, secs, ar: float) -> None:
    """Forward in event order, backward in reverse (autograd: the reverse of creation)."""
    inflight, pending = {}, {}
    for kind, st, k in events:
        if kind in ("prepare", "wait") and k in inflight:
            pl.wait(inflight.pop(k))
        if kind == "compute":
            pl.run(secs(st), f"{_name(st)} chunk{k} fwd")
            if st != HEAD:
                inflight[k] = pl.all_reduce(ar, f"{_name(st)} chunk{k} fwd")
    pl.fwd_end = pl.t
    for kind, st, k in reversed(events):
        if kind == "compute":
            pl.run(secs(st, 2), f"{_name(st)} chunk{k} bwd")
            if st != HEAD:                           # AsyncCopyToTP.backward starts it
                pending[tuple(st), k] = pl.all_reduce(ar, f"{_name(st)} chunk{k} bwd")
        elif kind == "prepare" and st != HEAD:       # WaitInBackward.backward waits for it
            pl.wait(pending.pop((tuple(st), k), 0.0))


def _union(spans):
    return iv.union(*zip(*[(s, e) for s, e, *_ in spans])) if spans else iv.EMPTY


def hidden_pct(pl: Plan, phase: str) -> float | None:
    """Share (%) of the phase's (``"fwd"``/``"bwd"``) link time the plan hides behind compute."""
    comm = _union([s for s in pl.comm if s[2].endswith(phase)])
    total = iv.measure(comm)
    return None if not total else 100 * (1 - iv.measure(iv.subtract(comm, _union(pl.compute))) / total)


def busy_ms(pl: Plan) -> tuple[float, float]:
    """``(compute, exposed communication)`` of the plan, in ms."""
    busy = _union(pl.compute)
    return iv.measure(busy) * 1e3, iv.measure(iv.subtract(_union(pl.comm), busy)) * 1e3


def exposed_ms(schedule, *, inter_layer: bool = True, lookahead: int = 1, **settings) -> float:
    """The planned exposed communication (ms) of one Domino step in ``schedule``'s order: the
    link time of ``plan("domino" or "domino_intra", schedule, ...)`` with no compute under it.
    ``settings``: ``plan``'s keywords (model, batch, p, flops_rate, lk, ranks)."""
    variant = "domino" if inter_layer else "domino_intra"
    return busy_ms(plan(variant, schedule, lookahead=lookahead, **settings))[1]


def chunk_seconds(*, model: dict, batch: int, p: int, flops_rate: float, lk,
                  ranks: int = RANKS) -> tuple[float, float]:
    """``(shortest, all_reduce)``: the shortest forward compute of one chunk's stage (the head
    included) and one chunk's all-reduce, in seconds. Compute-bound when the first is longer."""
    fl = sublayer_flops(model, batch * model["seq_len"] / p, ranks)
    nbytes = int(batch * model["seq_len"] / p * model["hidden"] * 4)
    ar = 0.0 if lk is None else lk.op_time("all_reduce", nbytes, ranks)
    return min(sum(v) for v in fl.values()) / flops_rate, ar


def plan_figure(pl: Plan, title: str, unit: float = 1e6, ranks: int = RANKS):
    """The plan drawn like ``trace.timeline_figure``: compute, link and exposed rows per rank (µs)."""
    import plotly.graph_objects as go

    from workbook.trace import colors
    exposed = [(s, e, "exposed communication")
               for s, e in zip(*iv.subtract(_union(pl.comm), _union(pl.compute)))]
    fig, rows = go.Figure(), []
    for r in range(ranks):
        for row, spans, kind in (("compute", pl.compute, "compute"), ("link", pl.comm, "communication"),
                                 ("exposed comm", exposed, "exposed")):
            rows.append(f"rank {r} · {row}")
            if spans:
                s, e, lab = zip(*spans)
                fig.add_trace(go.Bar(
                    orientation="h", base=[x * unit for x in s], x=[(b - a) * unit for a, b in zip(s, e)],
                    y=[len(rows) - 1] * len(s), name=kind, legendgroup=kind, showlegend=r == 0,
                    marker_color=colors.color(kind), width=0.35 if kind == "exposed" else 0.8,
                    hovertext=[f"{t}<br>{(b - a) * unit:,.0f} µs" for a, b, t in zip(s, e, lab)],
                    hoverinfo="text"))
    if pl.t > pl.fwd_end:
        fig.add_vline(x=pl.fwd_end * unit, line_dash="dot", annotation_text="backward →",
                      annotation_position="bottom right")
    fig.update_layout(title=title, barmode="overlay", xaxis_title="time (µs)", height=90 + 34 * len(rows),
                      yaxis=dict(tickvals=list(range(len(rows))), ticktext=rows, autorange="reversed"),
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
                      margin=dict(l=10, r=10, t=70, b=40))
    return fig
