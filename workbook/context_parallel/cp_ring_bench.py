"""``workbook bench cp_ring``: ring attention's K/V traffic hidden behind the attention of each
ring step, on a contiguous and a zig-zag split, over a sweep of sequence lengths.

What runs. ``--nproc`` context-parallel ranks (2 to 4) each hold ``[batch, heads, S/n,
head_dim]`` fp32 queries, keys and values of their positions; the lab's ``ring_attention``
(``--impl``, default solutions) runs one forward and one backward per step, for every ``--seq``
S and ``--splits`` split (``contiguous``: rank r holds chunk r; ``zigzag``: the lab's
``zigzag_layout``, chunks r and 2n-1-r). Warm-up steps without link; then the ranks measure
their matmul rate once (``domino_measure.recalibrate``) and calibrate every ``--link`` preset to
it, and run ``--repeats`` rounds in which every case takes a ``no_comm`` step (the link set to
None: the blocks still cross loopback gloo, at about the cost of a copy: the compute-only step)
and a profiled step on each preset, so that noise hits them alike. Spies on the lab's
``block_forward`` / ``block_backward`` time every block. Medians over the repeats per rank, then
one row over the ranks:

* ``step_ms`` the slowest rank's wall time of the pass; ``no_comm_ms`` the same without link;
* ``link_ms`` the modelled time of the pass's hops on the busiest rank (``link.op_log()``; a hop
  is one send and one receive, travelling at once on the full-duplex link: the longer counts);
* ``exposed_ms`` link time no compute ran beside, rank skew excused (``trace.overlap(t,
  within=pass)``: exposed - skew), the slowest rank's; ``skew_ms`` the excused part;
* ``hidden_pct`` the share of the pass's link time hidden behind compute, skew excused, the
  ranks' link and exposed times added up (as the grader's ``ranks_hidden_pct``);
* ``by_design_ms``: the backward pass's last dK/dV hop, which brings each rank its own sum after
  the last step's compute and so has nothing to hide behind (its send and its receive on the
  link, the union: with a late peer they do not travel at once); ``hideable_hidden_pct`` the
  hidden share of the rest (that hop counted exposed and taken out); forward: = hidden_pct;
* ``steps``: per ring step t, each rank's attention compute (its blocks of that step, from the
  first block's start to the last one's end) and the K/V exchange that travels behind it
  (modelled): forward, hop t (none at the last step); backward, hop t of K/V and hop t-1 of
  dK/dV (both posted before the step's compute, waited for after it); ``ratio`` = compute /
  exchange, each rank; the pass's ``ratio`` is the smallest over ranks and steps (and where).

Per split and S: ``causal_work`` (``Layout.causal_work``, unmasked scores per rank) and the
measured attention compute per rank (forward + backward, the ``no_comm`` steps), each with its
max/mean: the ring runs at the pace of the busiest rank. On CPU a diagonal (causal) block costs a
full block (its upper triangle is masked, not skipped), so the measured imbalance follows the
block count, below the causal-work imbalance. On CPU the contiguous split's blocks (S/n a side)
also cost more per score than the zig-zag's (S/2n): memory traffic, not balance; compare a
split's step with its own ``no_comm`` step.

Target (a benchmark figure, not a test): ring attention hides at least 80% of the K/V exchange
when the block's attention compute exceeds it; per pass, judged where its ratio is at least 1
(forward: ``hidden_pct``; backward: ``hideable_hidden_pct``), ``n/a`` below. The sweep over S
shows the ratio (attention ~ S^2, a hop ~ S) crossing 1 and the hidden share following it. Times
are on the SIMULATED link (``workbook.link``): a CPU in slow motion, labelled so. With more ranks
than CPU cores (``--nproc 4`` on 2 cores) the ranks share cores: the output says so.

    workbook bench cp_ring --json cp_ring.json --figure cp_ring.html
    python -m workbook.context_parallel.cp_ring_bench --seq 1024,2048,4096
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from workbook.measure.bench_cli import UsageError, listed, measure_and_save, run_as_command

LINKS = ("dgx-h100", "dgx-h100-ib")
SPLITS = ("contiguous", "zigzag")
PASSES = ("forward", "backward")
SEQS = (1024, 2048, 4096)
# The grader's overlap shape (tests/grading/test_cp_ring.py). On 2 ranks here (~100 GFLOP/s a
# rank) the zig-zag forward's first step over one hop's modelled time is about 0.23, 0.64, 1.9
# on dgx-h100 and 0.10, 0.27, 0.8 on dgx-h100-ib at S = 1024, 2048, 4096 (a hop is mostly the
# preset's latency, scaled up by the slow-motion factor, at 1024; mostly bytes at 4096).
DEFAULTS = dict(batch=1, heads=4, head_dim=64)
TARGET_HIDDEN_PCT = 80.0
FIELDS = ("step_ms", "no_comm_ms", "link_ms", "exposed_ms", "skew_ms", "hidden_pct",
          "by_design_ms", "hideable_hidden_pct", "ratio")
PREFIX = "workbook bench cp_ring: "
TARGET = ("ring attention hides at least 80% of the K/V exchange when the block's attention "
          "compute exceeds it")


def add_arguments(parser) -> None:
    parser.add_argument("--nproc", type=int, default=2,
                        help="context-parallel ranks, 2 to 4 (default 2; 4 on 2 cores is "
                             "oversubscribed)")
    parser.add_argument("--link", dest="links", nargs="+", default=list(LINKS), metavar="PRESET",
                        help="simulated link presets, a table each (default: %(default)s)")
    parser.add_argument("--impl", default="solutions", help="labs, solutions or a folder")
    parser.add_argument("--seq", dest="seqs", default=",".join(map(str, SEQS)),
                        help="sequence lengths to sweep, comma-separated (default %(default)s); "
                             "each a multiple of 2 x nproc")
    for name, value in DEFAULTS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, default=value,
                            help=f"default {value}")
    parser.add_argument("--splits", default=",".join(SPLITS), help="subset of %(default)s")
    parser.add_argument("--repeats", type=int, default=3,
                        help="measured steps a case and link (median; default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps a case")
    parser.add_argument("--trace-dir", default=None, help="keep the traces here")
    for name, what in (("json", "the results as JSON"), ("figure", "the figure (plotly HTML)")):
        parser.add_argument(f"--{name}", default=None, metavar="PATH", help=f"write {what}")


# --------------------------------------------------------------------------- the ring's shape
def blocks_per_step(layout, rank: int) -> list[int]:
    """Blocks rank ``rank`` computes at each ring step t (holding rank ``(rank - t) mod n``'s
    K/V): its chunk pairs that the causal mask does not skip (key chunk <= query chunk)."""
    n = layout.n
    return [sum(kc <= qc for qc in layout.chunks[rank] for kc in layout.chunks[(rank - t) % n])
            for t in range(n)]


def hops_behind(n: int, phase: str) -> list[int]:
    """Hops that travel behind step t's compute (posted before it, waited for after it), per
    step: forward, hop t of K/V (none at the last step); backward, K/V hop t and the dK/dV hop
    t-1 (one hop at the first step and at the last; the dK/dV hop of the last step follows)."""
    if phase == "forward":
        return [1] * (n - 1) + [0]
    return [1 if t in (0, n - 1) else 2 for t in range(n)] if n > 1 else [0]


# --------------------------------------------------------------------------- inside a rank
def _union_ms(spans) -> float:
    """The length (ms) of the union of ``(start_ns, end_ns)`` spans."""
    total, end = 0, None
    for s, e in sorted(spans):
        if end is None or s > end:
            total, end = total + e - s, e
        elif e > end:
            total, end = total + e - end, e
    return total / 1e6


def pass_figures(layout, rank: int, times, calls, ops, t=None) -> dict:
    """One step's figures per pass on one rank: wall time, the attention compute per ring step
    (the spies' calls binned by ``blocks_per_step``; None when the lab made other calls), the
    pass's hops (from the link's op log) and, with a trace ``t``, its overlap."""
    from workbook import trace
    t0, t1, t2 = times
    counts, out = blocks_per_step(layout, rank), {}
    for phase, (a, b) in zip(PASSES, ((t0, t1), (t1, t2))):
        mine = [c for c in calls if a <= c[0] < b]
        steps = None
        if len(mine) == sum(counts):
            steps, i = [], 0
            for c in counts:
                chunk, i = mine[i:i + c], i + c
                steps.append((chunk[-1][1] - chunk[0][0]) / 1e6 if chunk else 0.0)
        ours = sorted((r for r in ops if a <= r.issued_ns < b), key=lambda r: r.seq)
        sends, recvs = ([r for r in ours if r.op == op] for op in ("send", "recv"))
        hops = [max(s.link_ns, r.link_ns) / 1e6 for s, r in zip(sends, recvs)]
        last = [(r.start_ns, r.end_ns) for r in (sends[-1:] + recvs[-1:])]
        row = {"wall_ms": (b - a) / 1e6, "compute_ms": sum(e - s for s, e in mine) / 1e6,
               "step_compute_ms": steps, "hops": len(hops), "link_ms": sum(hops),
               "hop_ms": max(hops, default=0.0),
               "by_design_ms": _union_ms(last) if phase == "backward" else 0.0}
        if t is not None:
            o = trace.overlap(t, within=phase)
            row.update(comm_ms=o.comm_us / 1e3, exposed_ms=(o.exposed_comm_us - o.skew_us) / 1e3,
                       skew_ms=o.skew_us / 1e3)
        out[phase] = row
    return out


def _median_rows(rows: list[dict]) -> dict:
    """Per pass, the median over repeats of each figure (of each step's compute, step-wise)."""
    out = {}
    for phase in PASSES:
        rs = [r[phase] for r in rows]
        m = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "step_compute_ms"}
        steps = [r["step_compute_ms"] for r in rs]
        m["step_compute_ms"] = None if None in steps else [statistics.median(s) for s in zip(*steps)]
        out[phase] = m
    return out


def _rank_bench(o: dict, root: str) -> dict:
    import torch.distributed as dist
    from torch.profiler import record_function

    from workbook import link
    from workbook.context_parallel import BlockCallTimer, contiguous_layout
    from workbook.measure.profiled_step import profiled_step
    from workbook.measure.calibration import recalibrate
    from workbook.grading.labs import load_lab
    from workbook.runtime import ranks
    from workbook.trace.capture import hardware
    lab, rank, n, dev = load_lab("cp_ring", o["impl"]), dist.get_rank(), dist.get_world_size(), ranks.device()
    cases = {}
    for S in o["seqs"]:
        g = torch.Generator().manual_seed(7919 * S + rank)
        x = [torch.randn(o["batch"], o["heads"], S // n, o["head_dim"], generator=g).to(dev)
             for _ in range(4)]
        made = {"contiguous": lambda: contiguous_layout(S, n), "zigzag": lambda: lab.zigzag_layout(S, n)}
        for split in o["splits"]:
            cases[S, split] = (x, made[split]())
    spy = BlockCallTimer(lab)

    def step(key, times: list) -> None:
        (q, k, v, do), layout = cases[key]
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        with spy as calls:
            t0 = time.perf_counter_ns()
            with record_function("forward"):
                y = lab.ring_attention(qq, kk, vv, layout)
            t1 = time.perf_counter_ns()
            with record_function("backward"):
                y.backward(do)
            times[:] = [t0, t1, time.perf_counter_ns(), calls]

    def plain(key):                   # no profiler: the warm-up and no_comm steps
        times = []
        dist.barrier()
        step(key, times)
        return pass_figures(cases[key][1], rank, times[:3], times[3], [])

    link.set_link(None)
    for key in cases:
        for _ in range(o["warmup"]):
            plain(key)
    rate = recalibrate(o["links"][0])           # the matmul rate now, one for every preset
    links = {None: None, **{p: link.make_link(p, rate) for p in o["links"]}}
    order = list(links)
    rows = {(p, key): [] for p in links for key in cases}
    for k in range(o["repeats"]):     # cases and links take turns, so noise hits them alike;
        turn = order[k % len(order):] + order[:k % len(order)]   # the first after a switch of
        for key in cases:                                         # case is slower: each goes first
            for preset in turn:                                   # in a round of its own
                lk = links[preset]
                link.set_link(lk)
                if lk is None:
                    rows[None, key].append(plain(key))
                    continue
                times = []
                _, ops, t = profiled_step(lambda: step(key, times), Path(root) / preset
                                          / f"S{key[0]}" / key[1] / f"step{k}", rank, "cp_ring")
                rows[preset, key].append(pass_figures(cases[key][1], rank, times[:3], times[3], ops, t))
    name = {key: f"{key[0]}/{key[1]}" for key in cases}
    return {"hardware": hardware(), "local_gflops": rate / 1e9,
            "layouts": {name[key]: {"chunks": lay.chunks, "causal_work": lay.causal_work()}
                        for key, (_, lay) in cases.items()},
            "no_comm": {name[key]: _median_rows(rows[None, key]) for key in cases},
            "links": {p: {"link_label": lk.label, "cases": {
                name[key]: _median_rows(rows[p, key]) for key in cases}}
                for p, lk in links.items() if lk is not None}}


# --------------------------------------------------------------------------- the figures
def _pct(comm: float, exposed: float) -> float | None:
    return 100.0 * (1.0 - max(0.0, exposed) / comm) if comm > 0 else None


def combine(per_rank: list[dict], no_comm: list[dict], n: int) -> dict:
    """The ranks' figures of one case (``pass_figures`` medians) as one row per pass."""
    out = {}
    for phase in PASSES:
        rs, nc = [r[phase] for r in per_rank], [r[phase] for r in no_comm]
        comm = sum(r["comm_ms"] for r in rs)
        exposed = sum(r["exposed_ms"] for r in rs)
        design = sum(r["by_design_ms"] for r in rs)
        behind = hops_behind(n, phase)
        steps, ratio, where = [], None, None
        if all(r["step_compute_ms"] is not None for r in rs):
            for t in range(n):
                compute = [r["step_compute_ms"][t] for r in rs]
                exchange = behind[t] * statistics.median(r["hop_ms"] for r in rs)
                ratios = [c / exchange if exchange else None for c in compute]
                steps.append({"compute_ms": compute, "exchange_ms": exchange, "hops": behind[t],
                              "ratio": ratios})
                for rank, x in enumerate(ratios):
                    if x is not None and (ratio is None or x < ratio):
                        ratio, where = x, {"rank": rank, "step": t}
        out[phase] = {
            "step_ms": max(r["wall_ms"] for r in rs), "no_comm_ms": max(r["wall_ms"] for r in nc),
            "link_ms": max(r["link_ms"] for r in rs), "exposed_ms": max(r["exposed_ms"] for r in rs),
            "skew_ms": max(r["skew_ms"] for r in rs), "hidden_pct": _pct(comm, exposed),
            "by_design_ms": max(r["by_design_ms"] for r in rs),
            "hideable_hidden_pct": _pct(comm - design, exposed - design),
            "ratio": ratio, "ratio_at": where, "hops": max(r["hops"] for r in rs),
            "hop_ms": max(r["hop_ms"] for r in rs), "steps": steps}
    return out


def _target(row: dict, phase: str) -> dict:
    got, r = row["hideable_hidden_pct"], row["ratio"]
    applies = r is not None and r >= 1
    return {"want": f">= {TARGET_HIDDEN_PCT:.0f}% where ratio >= 1", "ratio": r,
            "ratio_at": row["ratio_at"], "got": got,
            "of": "the K/V exchange" if phase == "forward" else
                  "the hops with compute behind them (the last dK/dV hop counted out)",
            "met": None if got is None or not applies else got >= TARGET_HIDDEN_PCT}


def _imbalance(xs: list[float]) -> float | None:
    mean = sum(xs) / len(xs) if xs else 0
    return max(xs) / mean if mean else None


def _check(o: dict, nproc: int, links: list, splits: list, seqs: list, repeats: int, warmup: int,
           unknown_options) -> None:
    from workbook.link.presets import preset_names
    bad_links = [x for x in links if x not in preset_names() or x == "none"]
    unknown = sorted(set(splits) - set(SPLITS))
    problems = [msg for bad, msg in (
        (unknown_options, f"unknown option(s) {sorted(unknown_options)}"),
        (bad_links, f"unknown link preset(s) {bad_links}: choose from "
                    f"{', '.join(x for x in preset_names() if x != 'none')} (the no-communication "
                    f"reference runs anyway)"),
        (not links, "name at least one --link preset"),
        (unknown, f"unknown split(s) {unknown}: choose from {', '.join(SPLITS)}"),
        (not splits, "name at least one split"),
        (not 2 <= nproc <= 4, f"--nproc {nproc}: 2 to 4 context-parallel ranks"),
        (not seqs, "--seq: sequence lengths such as 1024,2048,4096"),
        (seqs and nproc >= 1 and [s for s in seqs if s < 2 * nproc or s % (2 * nproc)],
         f"--seq {','.join(map(str, seqs))}: every length must be a multiple of 2 x nproc = "
         f"{2 * nproc} (the zig-zag split's chunks)"),
        (min(o["batch"], o["heads"], o["head_dim"]) < 1,
         "--batch, --heads and --head-dim must be at least 1"),
        (repeats < 1 or warmup < 0, "--repeats must be at least 1 and --warmup at least 0"),
    ) if bad]
    if problems:
        raise UsageError(PREFIX + "; ".join(problems))


def parse_seqs(text) -> list[int]:
    """``"1024,2048"`` -> ``[1024, 2048]`` (a list of ints passes through)."""
    if not isinstance(text, str):
        return [int(x) for x in text]
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{PREFIX}--seq {text!r}: sequence lengths such as 1024,2048,4096") from None


def measure(*, impl: str = "solutions", nproc: int = 2, links=LINKS, seqs=SEQS, splits=SPLITS,
            repeats: int = 3, warmup: int = 1, trace_dir=None, **shape) -> dict:
    """Run the benchmark on ``nproc`` fresh ranks; return what ``--json`` writes (module
    docstring). ``shape``: any of ``DEFAULTS``; a bad option raises ``UsageError`` (a
    ``SystemExit``, status 2, one line)."""
    from workbook.runtime import launch
    links, splits, seqs, o = list(links), list(splits), parse_seqs(seqs), dict(DEFAULTS)
    unknown_options = set(shape) - set(o)
    o.update({k: v for k, v in shape.items() if k in o})
    _check(o, nproc, links, splits, seqs, repeats, warmup, unknown_options)
    o.update(impl=impl, repeats=repeats, warmup=warmup, links=links, splits=splits, seqs=seqs)
    with tempfile.TemporaryDirectory(prefix="cp-ring-bench-") as tmp:
        results = launch.run(_rank_bench, nproc, o, str(trace_dir or tmp), link=links[0],
                             timeout=3600)
    layouts = results[0]["layouts"]
    balance = {}
    for case, lay in layouts.items():
        compute = [sum(r["no_comm"][case][p]["compute_ms"] for p in PASSES) for r in results]
        balance[case] = {"causal_work": lay["causal_work"], "chunks": lay["chunks"],
                         "work_imbalance": _imbalance(lay["causal_work"]),
                         "compute_ms": compute, "compute_imbalance": _imbalance(compute)}
    out = {}
    for preset in links:
        cases = {}
        for case in layouts:
            S = int(case.split("/")[0])
            row = combine([r["links"][preset]["cases"][case] for r in results],
                          [r["no_comm"][case] for r in results], nproc)
            cases[case] = {"seq": S, "split": case.split("/")[1],
                           "hop_bytes": 2 * o["batch"] * o["heads"] * (S // nproc) * o["head_dim"] * 4,
                           "passes": row, "targets": {p: _target(row[p], p) for p in PASSES}}
        out[preset] = {"link_label": results[0]["links"][preset]["link_label"], "cases": cases}
    cores = os.cpu_count() or 1
    return {"nproc": nproc, "cores": cores, "oversubscribed": nproc > cores, "options": o,
            "balance": balance, "links": out, "target": TARGET, "hardware": results[0]["hardware"],
            "local_gflops": results[0]["local_gflops"],
            "torch": torch.__version__}


def _fmt(x, spec="{:.0f}"):
    return "-" if x is None else spec.format(x)


def _ms(x: float) -> str:
    """A step's compute: whole ms, a decimal below 10."""
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def _work(ws: list[int]) -> str:
    return " / ".join(f"{w / 1e6:.2f}M" if max(ws) >= 1e5 else str(w) for w in ws)


def _at(t: dict) -> str:
    """Where a zero ratio comes from: a rank with no block to compute at that step."""
    w = t.get("ratio_at")
    return f" (rank {w['rank']} has no block at step {w['step']})" if w and t["ratio"] == 0 else ""


VERDICT = {True: "met", False: "NOT met", None: "n/a (ratio < 1)"}


def report(result: dict) -> str:
    """The balance table; per preset and S a row per split and pass (with each ring step's
    compute, exchange and ratio); the target over the sweep."""
    from workbook.measure.output import human
    from workbook.measure.output import where_measured
    o, n = result["options"], result["nproc"]
    first = next(iter(result["links"].values()))
    lines = [f"cp_ring benchmark, {where_measured(first['link_label'], 'no simulated link')}: "
             f"{n} ranks on {result.get('hardware', '?')}, torch {result.get('torch')}",
             f"ring attention (the lab's RingAttention, --impl {o['impl']}): batch {o['batch']}, "
             f"{o['heads']} heads of {o['head_dim']}, fp32, forward + backward; S = "
             f"{', '.join(map(str, o['seqs']))}; median of {o['repeats']} steps a rank"]
    if result.get("oversubscribed"):
        lines.append(f"note: {n} ranks on {result['cores']} CPU cores: oversubscribed, the ranks "
                     f"share cores, so compute is slower and the ranks skewed")
    lines += ["", "load balance: causal work (unmasked scores of a head) and measured attention compute "
                  "(ms, forward + backward, no link) per rank; max/mean"]
    for case, b in result["balance"].items():
        S, split = case.split("/")
        lines.append(f"  S={S:<6}{split:<12}work {_work(b['causal_work'])}"
                     f" ({_fmt(b['work_imbalance'], '{:.2f}')})   compute "
                     f"{' / '.join(f'{c:.0f}' for c in b['compute_ms'])} "
                     f"({_fmt(b['compute_imbalance'], '{:.2f}')})")
    for preset, r in result["links"].items():
        lines += ["", f"[{preset}] {where_measured(r['link_label'], 'no simulated link')}"]
        seen = set()
        for case, c in r["cases"].items():
            S = c["seq"]
            if S not in seen:
                seen.add(S)
                hop = c["passes"]["forward"]["hop_ms"] or c["passes"]["backward"]["hop_ms"]
                lines += [f"S={S}: one hop 2*B*h*(S/n)*d*4 = {human(c['hop_bytes'])}B, {hop:.1f} ms "
                          f"modelled",
                          f"  {'split':<12}{'pass':<10}{'step ms':>8}{'no-comm':>8}{'link ms':>8}"
                          f"{'exposed':>8}{'skew':>6}{'hid %':>7}{'hid*%':>7}{'ratio':>7}   per ring "
                          f"step: compute ms (each rank) / exchange ms"]
            for phase, p in c["passes"].items():
                per = "  ".join(f"s{t} {'|'.join(map(_ms, s['compute_ms']))}/"
                                + (_ms(s["exchange_ms"]) if s["hops"] else "-")
                                for t, s in enumerate(p["steps"]))
                lines.append(f"  {c['split']:<12}{phase:<10}{p['step_ms']:>8.0f}{p['no_comm_ms']:>8.0f}"
                             f"{p['link_ms']:>8.0f}{p['exposed_ms']:>8.0f}{p['skew_ms']:>6.0f}"
                             f"{_fmt(p['hidden_pct'], '{:.1f}'):>7}"
                             f"{_fmt(p['hideable_hidden_pct'], '{:.1f}'):>7}"
                             f"{_fmt(p['ratio'], '{:.2f}'):>7}   {per}")
    lines += ["", f"target: {result['target']} (ratio = a step's attention compute / the "
                  f"exchange behind it, the smallest over ranks and steps):"]
    for preset, r in result["links"].items():
        by = {}
        for c in r["cases"].values():
            for phase in PASSES:
                by.setdefault((c["split"], phase), []).append((c["seq"], c["targets"][phase]))
        for (split, phase), xs in by.items():
            lines.append(f"  {preset:<13}{split:<12}{phase:<10}" + "   ".join(
                f"S={S}: ratio {_fmt(t['ratio'], '{:.2f}')}{_at(t)}, {_fmt(t['got'], '{:.0f}%')} "
                f"{VERDICT[t['met']]}" for S, t in xs))
    lines += ["",
              "step ms: the slowest rank's pass; no-comm: the same without link; link ms: the "
              "modelled hops; exposed: link time nothing hid, skew (a late peer) excused; hid %: "
              "share of the pass's link time hidden (ranks added up); hid*%: the same not counting "
              "the backward's last dK/dV hop (nothing left to hide it), the target's figure",
              "simulated figures: a CPU in slow motion, calibrated to the preset's compute/link ratio"]
    return "\n".join(lines)


def figure(result: dict):
    """Per preset, over S: each split and pass's ratio (top, a line at 1) and the target's hidden
    share (bottom, a line at 80%)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    from workbook.measure.output import where_measured
    links = result["links"]
    fig = make_subplots(rows=2, cols=len(links), shared_xaxes=True, subplot_titles=[
        where_measured(r["link_label"], p) for p, r in links.items()] + [""] * len(links))
    for col, r in enumerate(links.values(), 1):
        series = {}
        for c in r["cases"].values():
            for phase in PASSES:
                series.setdefault(f"{c['split']} {phase}", []).append(
                    (c["seq"], c["passes"][phase]["ratio"], c["passes"][phase]["hideable_hidden_pct"]))
        for name, pts in series.items():
            for row, i in ((1, 1), (2, 2)):
                fig.add_trace(go.Scatter(name=name, x=[p[0] for p in pts], y=[p[i] for p in pts],
                                         mode="lines+markers", legendgroup=name,
                                         showlegend=col == 1 and row == 1), row, col)
        fig.add_hline(y=1, line_dash="dot", row=1, col=col)
        fig.add_hline(y=TARGET_HIDDEN_PCT, line_dash="dot", row=2, col=col)
    fig.update_yaxes(title_text="compute / exchange", row=1, col=1)
    fig.update_yaxes(title_text="K/V exchange hidden %", row=2, col=1)
    fig.update_xaxes(title_text="sequence length S", type="log", row=2)
    fig.update_layout(height=640, width=1200,
                      title=f"cp_ring, {result['nproc']} ranks, SIMULATED links")
    return fig


def run_bench(args) -> dict:
    return measure_and_save(args, measure, report, figure, links=args.links, seqs=args.seqs,
                            splits=listed(args.splits), repeats=args.repeats, warmup=args.warmup,
                            **{k: getattr(args, k) for k in DEFAULTS})


def main(argv=None) -> None:
    run_as_command(add_arguments, run_bench, "ring attention's K/V exchange hidden behind each "
                   "ring step's attention, contiguous vs zig-zag", argv,
                   prog="python -m workbook.context_parallel.cp_ring_bench")


if __name__ == "__main__":
    main()
