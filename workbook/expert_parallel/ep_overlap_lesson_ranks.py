"""Lesson 13's runs on ranks (lab ``ep_overlap``): the lab's layer checked and traced on 2 ranks
over the simulated ``dgx-h100`` link, and what the lesson draws from it.

* ``check(impl)``, on every rank: each variant of the lab (``ep_moe``, the shared-expert overlap,
  the deferred weight gradients, two micro-batches) on a tiny fp64 case against the single-device
  ``MoE`` (output, input gradient, this rank's experts' gradients): a verdict per variant;
* ``ep_step(run_dir, impls)``, on every rank: the link recalibrated, then per variant a warm-up
  step and one traced step (a ``forward`` and a ``backward`` range) at the grader's overlap shape,
  while spies note when each two-micro-batch action and the shared expert ran; the link's
  all-to-alls (with their rows, sender by receiver) and each pass's hidden share in the trace;
* ``rank_timeline`` (both ranks' actions and all-to-alls), ``hidden_table`` and
  ``prediction_table`` (the learner's ``predict_dispatch_exposed_ms`` beside the model and the
  measured exposed dispatch) draw and print them.
"""
from __future__ import annotations

import torch

from workbook.measure import lesson_figures as lf
from workbook.trace import colors

from .ep_overlap_bench import layer_fn
from .ep_overlap_lesson import A_COLOR, B_COLOR, PRESET

VARIANTS = ("ep_moe", "shared_overlap", "deferred_wgrad", "two_batch")
CALL = {"ep_moe": "ep_moe", "shared_overlap": "ep_moe_shared_overlap",
        "deferred_wgrad": "ep_moe_deferred_wgrad", "two_batch": "TwoBatchMoE"}
#: the traced runs' shape (the grader's overlap case): GPT experts, E = 4, k = 1, a shared
#: expert 16 H wide, each expert 8 H wide, 256 tokens of width 256 a rank, fp32
TOKENS, HIDDEN, E, K = 256, 256, 4, 1
WIDTHS = (16 * HIDDEN, 8 * HIDDEN)
WARM_UP_TOKENS = 16


def reference_here() -> bool:
    """Does this copy of the course hold the reference (``solutions/``)? A student release does
    not: there the lesson runs your lab once every task is written (and shows the reference's
    recorded outputs before)."""
    from workbook.grading.labs import repo_root
    return (repo_root() / "solutions").is_dir()


def _case(ep: int, tokens: int, hidden: int, dtype, widths, top_k: int = K, seed: int = 0):
    from workbook.model import ModelConfig, MoEConfig
    cfg = ModelConfig(style="gpt", dtype=str(dtype).split(".")[-1], hidden=hidden, heads=2,
                      ffn_hidden=widths[0])
    moe = MoEConfig(num_experts=E, top_k=top_k, shared_expert=True, expert_hidden=widths[1])
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(ep * tokens, hidden, generator=gen, dtype=dtype)
    g = torch.randn(ep * tokens, hidden, generator=gen, dtype=dtype)
    return cfg, moe, x, g


# --------------------------------------------------------------------------- on every rank
def check(impl: str) -> dict:
    """Each variant of ``impl``'s lab on a tiny fp64 case (E = 4, k = 2, a shared expert, 8
    tokens a rank) against the single-device layer: ``{variant: "ok" | "WRONG: ..." | error}``."""
    import torch.distributed as dist

    from workbook.expert_parallel import MoE, local_moe, rank_rows
    from workbook.grading.labs import load_lab
    rank, ep = dist.get_rank(), dist.get_world_size()
    cfg, moe, x, g = _case(ep, 8, 8, torch.float64, (12, 6), top_k=2, seed=1)
    rows = rank_rows(x.shape[0], rank, ep)
    try:
        lab = load_lab("ep_overlap", impl)
    except Exception as exc:                     # noqa: BLE001 - unfinished work is expected
        return dict.fromkeys(VARIANTS, lf.verdict_of(exc))
    verdicts = {}
    for variant in VARIANTS:
        groups = 2 * ep if variant == "two_batch" else ep
        ref, xs = MoE(cfg, moe), x.clone().requires_grad_()
        want = ref(xs, groups)
        want.backward(g)
        try:
            layer = local_moe(cfg, moe, rank, ep)
            xr = x[rows].clone().requires_grad_()
            y = layer_fn(lab, variant, layer)(xr)
            y.backward(g[rows])
            bad = [] if torch.allclose(y, want[rows].detach(), atol=1e-10) else ["output"]
            if xr.grad is None or not torch.allclose(xr.grad, xs.grad[rows], atol=1e-10):
                bad.append("input gradient")
            mine = dict(layer.named_parameters())
            for name, p in ref.named_parameters():
                if ".experts." in name and name in mine and (
                        mine[name].grad is None or not torch.allclose(mine[name].grad, p.grad,
                                                                      atol=1e-10)):
                    bad.append(f"the gradient of {name}")
                    break
            verdicts[variant] = f"WRONG: {', '.join(bad)} differ from one device" if bad else "ok"
        except Exception as exc:                 # noqa: BLE001 - unfinished work is expected
            verdicts[variant] = lf.verdict_of(exc)
    return verdicts


def _spy_actions(executor, notes: list) -> None:
    """Note each action the executor runs: ``(pass, kind, mb, step, start, end)`` in ms."""
    for phase in ("forward", "backward"):
        real = getattr(executor, f"{phase}_action")

        def note(args, kwargs, t0, t1, phase=phase):
            notes.append((phase, *args, t0, t1))
        setattr(executor, f"{phase}_action", lf.timed(real, note))


def _all_to_alls(since: int, t0: float) -> list[dict]:
    """The link's all-to-alls from entry ``since`` on, as ``lf.link_ops`` gives them, each with
    its rows sender by receiver (``split_bytes`` over a row's bytes, fp32)."""
    from workbook import link
    records = [r for r in link.op_log()[since:] if r.op == "all_to_all"]
    ops = lf.link_ops(since, t0, kinds=("all_to_all",))
    for o, r in zip(ops, records):
        o["rows"] = [[b // (HIDDEN * 4) for b in row] for row in (r.split_bytes or [])]
        o["counts"] = o["bytes"] == E * 8 and r.recv_bytes == E * 8
    return ops


def ep_step(run_dir: str, impls: dict, narrow: int | None = None) -> dict:
    """On every rank: recalibrate the link; per variant of ``impls`` (variant -> ``"labs"`` or
    ``"solutions"``) a small warm-up step, then a traced one (``run_dir/VARIANT``) at the
    grader's shape; with ``narrow``, also ``shared_overlap`` with its shared expert ``narrow``
    wide (under ``"shared_narrow"``). Per variant, in ms since the traced step began: each pass's
    end, the two-micro-batch actions, the shared expert's forward, the all-to-alls, each pass's
    hidden share (the trace); or ``{"impl", "error"}`` where the lab raised."""
    from workbook.measure.calibration import recalibrate
    out = {"local_flops": recalibrate(PRESET), "variants": {}}
    todo = [(v, v, impl, WIDTHS[0]) for v, impl in impls.items()]
    if narrow:
        todo.append(("shared_narrow", "shared_overlap", impls["shared_overlap"], narrow))
    for name, variant, impl, width in todo:
        try:
            out["variants"][name] = {"impl": impl, **_traced(run_dir, name, variant, impl, width)}
        except Exception as exc:                 # noqa: BLE001 - shown, not raised
            out["variants"][name] = {"impl": impl, "error": lf.verdict_of(exc)}
    return out


def _traced(run_dir: str, name: str, variant: str, impl: str, width: int) -> dict:
    """``ep_step``'s run of one variant on this rank (its docstring)."""
    from pathlib import Path

    import torch.distributed as dist

    from workbook import link, trace
    from workbook.expert_parallel import local_moe, rank_rows
    from workbook.grading.labs import load_lab
    from workbook.trace.capture import rank_trace
    rank, ep = dist.get_rank(), dist.get_world_size()
    cfg, moe, x, g = _case(ep, TOKENS, HIDDEN, torch.float32, (width, WIDTHS[1]))
    rows = rank_rows(x.shape[0], rank, ep)
    lab, layer = load_lab("ep_overlap", impl), local_moe(cfg, moe, rank, ep)
    xr = x[rows][:WARM_UP_TOKENS].clone().requires_grad_()              # warm-up: the code
    layer_fn(lab, variant, layer)(xr).backward(g[rows][:WARM_UP_TOKENS])       # paths, cheaply
    fn, actions, shared = layer_fn(lab, variant, layer), [], []
    if variant == "two_batch":
        _spy_actions(fn, actions)
    hooks = [layer.shared.register_forward_pre_hook(lambda *_: shared.append(lf.ms_now())),
             layer.shared.register_forward_hook(lambda *_: shared.append(lf.ms_now()))]
    xr = x[rows].clone().requires_grad_()
    dist.barrier()
    since, t0 = len(link.op_log()), lf.ms_now()
    try:
        with rank_trace(Path(run_dir) / name, lab="ep_overlap"):
            with torch.profiler.record_function("forward"):
                y = fn(xr)
            t1 = lf.ms_now()
            with torch.profiler.record_function("backward"):
                y.backward(g[rows])
            t2 = lf.ms_now()
    finally:
        for h in hooks:
            h.remove()
    t = trace.load_trace(Path(run_dir) / name / f"rank{rank}.trace.json")
    return {"forward_end": t1 - t0, "end": t2 - t0,
            "actions": [(p, k, mb, s, a - t0, b - t0) for p, k, mb, s, a, b in actions],
            "shared": [(shared[i] - t0, shared[i + 1] - t0) for i in range(0, len(shared) - 1, 2)],
            "ops": _all_to_alls(since, t0),
            "hidden": {ph: lf.overlap_summary(trace.overlap(t, within=ph))
                       for ph in ("forward", "backward")}}


def failed(results: list, variant: str) -> str | None:
    """The first rank's error for ``variant``, or None when every rank ran it."""
    return next((f"rank {r}: {res['variants'][variant]['error']}" for r, res in enumerate(results)
                 if "error" in res["variants"][variant]), None)


# --------------------------------------------------------------------------- drawn from ranks
def rank_timeline(results: list, variant: str, title: str):
    """Both ranks' traced step of ``variant``: on each compute row one bar per action (A dark
    blue, B green; the backward's paler), on each link row every all-to-all while the link
    carried it (red from the moment the rank waited for it)."""
    import plotly.graph_objects as go
    if failed(results, variant):
        print(f"{variant} did not run: {failed(results, variant)}")
        return None
    fig, order = go.Figure(), []
    for r, res in enumerate(results):
        v = res["variants"][variant]
        rows = (f"rank {r} · compute", f"rank {r} · link")
        order += rows
        for phase, kind, mb, step, a, b in v["actions"]:
            if kind != "compute":
                continue
            color = A_COLOR if mb == "A" else B_COLOR
            fig.add_trace(lf.span(a, b, rows[0], color, f"{phase}: {mb}.{step}, {b - a:.1f} ms",
                                  f"{mb}.{step}" if b - a > 0.04 * v["end"] else ""))
            if phase == "backward":
                fig.data[-1].marker.opacity = 0.55
        for a, b in v["shared"]:
            fig.add_trace(lf.span(a, b, rows[0], A_COLOR, f"shared expert, {b - a:.1f} ms",
                                  "shared"))
        names = ["counts" if o["counts"] else f"rows {o['rows']}" for o in v["ops"]]
        lf.link_bars(fig, v["ops"], rows[1], exposed_from=lambda o: o["waited"], names=names,
                     text=lambda o, k: "counts" if o["counts"] else "tokens")
    fig.add_vline(x=results[0]["variants"][variant]["forward_end"], line_dash="dash",
                  line_color=colors.OTHER, annotation_text="rank 0: backward begins",
                  annotation_position="top")
    lf.legend_keys(fig, order[0], {"micro-batch A": A_COLOR, "micro-batch B": B_COLOR,
                                   "on the link": colors.COMMUNICATION,
                                   "on the link, waited for (exposed)": colors.EXPOSED})
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1])
    fig.update_layout(title=title, height=150 + 48 * len(order), barmode="overlay",
                      plot_bgcolor="white", xaxis_title="ms since the step began",
                      legend=dict(orientation="h", y=-0.25), margin=dict(l=10, r=10, t=60, b=40))
    return fig


def hidden_table(results: list) -> None:
    """Per variant and pass: the slower rank's step, a rank's all-to-all link time and exposed
    time (the ranks' mean; a late peer's skew counted as hidden, as the grader does) and the
    share hidden."""
    print(f"{'variant':16s}{'whose':>11}{'step ms':>9}{'pass':>10}{'link ms':>9}{'hidden %':>10}"
          f"{'exposed ms':>12}")
    for variant in results[0]["variants"]:
        if failed(results, variant):
            print(f"{variant:16s}  did not run: {failed(results, variant)}")
            continue
        per = [res["variants"][variant] for res in results]
        step = max(v["end"] for v in per)
        for phase in ("forward", "backward"):
            hs = [v["hidden"][phase] for v in per]
            comm, exposed = sum(h["comm_ms"] for h in hs), sum(h["exposed_ms"] - h["skew_ms"]
                                                                 for h in hs)
            pct = 100 * (1 - max(exposed, 0.0) / comm) if comm else 0.0
            whose = "yours" if per[0]["impl"] == "labs" else "reference"
            print(f"{variant:16s}{whose:>11}{step:9.0f}{phase:>10}{comm / len(hs):9.0f}"
                  f"{pct:10.0f}{max(exposed, 0.0) / len(hs):12.1f}")


def dispatch_of(v: dict) -> dict:
    """The forward pass's token dispatch: its first all-to-all that is not the counts."""
    return next(o for o in v["ops"] if not o["counts"] and o["issued"] < v["forward_end"])


def measured_exposed_ms(v: dict) -> float:
    """How long the rank waited for its dispatch beyond the link's modelled end: from its first
    wait to the end of the transfer (0 when it had arrived)."""
    o = dispatch_of(v)
    return max(0.0, o["end"] - max(o["waited"] or o["end"], o["start"]))


def prediction_table(results: list, mine, sim, variant: str = "shared_narrow") -> None:
    """Per rank: your ``predict_dispatch_exposed_ms(sim, rows, HIDDEN, 4, t_shared)`` (``-`` until
    it is written), the model's value (``ep_overlap_report.dispatch_exposed_model``, the one the
    grader and ``workbook run`` use; only beside yours: before, it would be the answer) and the
    exposed dispatch measured in the shared-expert step; ``t_shared`` is the shared expert's
    forward as the rank measured it, ``rows`` the dispatch's rows sender by receiver. Where your
    value is off, what the judge says of it."""
    from workbook.grading.predictions import comparison_lines, judge_prediction

    from .ep_overlap_report import dispatch_exposed_model
    if failed(results, variant):
        print(f"{variant} did not run: {failed(results, variant)}")
        return
    rows, missing, verdicts = [], None, []
    for r, res in enumerate(results):
        v = res["variants"][variant]
        sent, (a, b) = dispatch_of(v)["rows"], v["shared"][0]
        args = (sim, sent, HIDDEN, 4, b - a)
        try:
            predicted = float(mine.predict_dispatch_exposed_ms(*args))
        except Exception as exc:                 # noqa: BLE001 - not written yet: "-"
            predicted, missing = None, lf.verdict_of(exc)
        model = None
        if predicted is not None:
            model, mistakes = dispatch_exposed_model(*args)
            verdicts.append(judge_prediction(predicted, model, mistakes,
                                             what=f"rank {r}'s exposed dispatch"))
        rows.append((f"rank {r}: dispatch exposed (shared expert {b - a:.0f} ms)", predicted,
                     model, measured_exposed_ms(v)))
    for line in comparison_lines(rows):
        print(line)
    if missing:
        print(f"  (your predict_dispatch_exposed_ms: {missing}; the model's value is shown beside "
              f"your prediction, not before it)")
    for verdict in filter(None, verdicts):
        print("  " + verdict)
