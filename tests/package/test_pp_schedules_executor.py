"""Lab ``pp_schedules`` on ranks: the reference ``OverlappedChunkedExecutor`` (section 4 of the
lab) on the given ``ChunkedExecutor`` runs interleaved 1F1B, ZB-H1 and ZBV to the numbers of one
device.

For each schedule, m in {4, 8}, GPT and Llama (fp64): the loss on the rank holding the last
stage and every parameter's gradient, gathered from the ranks' chunks, equal the single-device
reference on the whole batch within 1e-12, on 2 ranks, and for two cases on 4. A schedule the
checker refuses raises the same one-line ``ScheduleError`` on every rank before any transfer,
and a step after it still computes the right loss (nothing was left in flight). The transfers
have the overlapped executor's pattern (receives posted an action early, sends waited at the
end), and lab 10's trace reader finds every action's range (``F3.c1``) in the schedule's order.
The ranks are the package's warm pool; each call runs all its cases on the ranks and sends back
only what the test judges.
"""
from __future__ import annotations

from pp_schedules_reference import ROOT

from workbook.runtime.launch import run

DRAFT = next(str(p) for p in (ROOT / "solutions/pp_schedules.py",
                              ROOT / "solutions/pp_schedules.py.draft") if p.exists())
TOL = 1e-12
ROWS = 2                                                     # rows per micro-batch


def _config(style: str, layers: int):
    from workbook.model import ModelConfig
    return ModelConfig(style=style, dtype="float64", hidden=16, heads=2, ffn_hidden=24,
                       n_layers=layers, seq_len=6, vocab_size=40, seed=3)


def _load_lab(path: str):
    """The lab file at ``path`` as a module (on a rank: the draft is no registered lab yet)."""
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("pp_schedules_under_test", path)
    lab = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(lab)
    return lab


def _run_cases(path: str, cases: list) -> list:
    """On every rank: for each ``(schedule, v, m, style)`` the loss error (the loss rank; None
    elsewhere), the largest gradient error and its parameter, and the names of this rank's
    parameters."""
    import torch.distributed as dist

    from workbook.model import ReferenceModel, grads_by_name, make_batch
    lab = _load_lab(path)
    p, out = dist.get_world_size(), []
    for name, v, m, style in cases:
        schedule, placement = lab.SCHEDULES[name]
        cfg = _config(style, p * v)
        tokens, targets = make_batch(cfg, ROWS * m, seed=1)
        ref = ReferenceModel(cfg)
        want_loss = ref(tokens, targets)
        want_loss.backward()
        want = grads_by_name(ref)
        ex = lab.OverlappedChunkedExecutor(cfg, m, v, placement)
        loss = ex.step(tokens, targets, lab.all_ranks(schedule, p, v, m))
        got = ex.named_grads()
        worst = max(((want[k] - g).abs().max().item(), k) for k, g in got.items())
        out.append({"loss": None if loss is None else abs(loss.item() - want_loss.item()),
                    "grad": worst, "names": sorted(got)})
        dist.barrier()
    return out


def _bad_schedule_then_good(path: str) -> list:
    """A ZB-H1 schedule with rank 1's last W dropped, then a 1F1B that deadlocks on 2 ranks: each
    rank's error; then the right schedule's loss."""
    import torch.distributed as dist

    from workbook.model import ReferenceModel, make_batch
    from workbook.pipeline_parallel import ScheduleError
    lab = _load_lab(path)
    p, m, v = dist.get_world_size(), 4, 1
    cfg = _config("gpt", p * v)
    tokens, targets = make_batch(cfg, ROWS * m, seed=1)
    ex = lab.OverlappedChunkedExecutor(cfg, m, v, "interleaved")
    bad = lab.all_ranks(lab.zb_h1, p, v, m)
    bad[1] = bad[1][:-1]
    try:
        ex.step(tokens, targets, bad)
        message = None
    except ScheduleError as err:
        message = str(err)
    # rank 0 waits at B(0) for rank 1, which waits at F(1) for rank 0's F(1), after that B(0)
    deadlock = [[("F", 0, 0), ("B", 0, 0)] + [(k, i, 0) for i in range(1, m) for k in "FB"],
                [("F", 1, 0), ("F", 0, 0), ("B", 0, 0), ("B", 1, 0)]
                + [(k, i, 0) for i in range(2, m) for k in "FB"]]
    try:
        ex.step(tokens, targets, deadlock)
        refused = None
    except ScheduleError as err:
        refused = str(err)
    loss = ex.step(tokens, targets, lab.all_ranks(lab.zb_h1, p, v, m))
    want = ReferenceModel(cfg)(tokens, targets).item()
    return [message, refused, None if loss is None else abs(loss.item() - want)]


def _check(results: list, cases: list, p: int) -> None:
    for k, case in enumerate(cases):
        per_rank = [r[k] for r in results]
        losses = [r["loss"] for r in per_rank if r["loss"] is not None]
        assert len(losses) == 1, f"{case}: one rank holds the loss, got {len(losses)}"
        assert losses[0] < TOL, f"{case}: loss differs from one device by {losses[0]:.1e}"
        for rank, r in enumerate(per_rank):
            err, name = r["grad"]
            assert err < TOL, f"{case}, rank {rank}: gradient of {name} differs by {err:.1e}"
        names = [n for r in per_rank for n in r["names"]]
        assert len(names) == len(set(names)), f"{case}: a parameter on two ranks"
        assert any(n.startswith("embed.") for n in names) and "head.weight" in names, case
        assert sum(n.endswith("attn.wq.weight") for n in names) == p * case[1], case


CASES_2 = [(name, v, m, style) for name, v in (("interleaved_1f1b", 2), ("zb_h1", 1),
                                               ("zb_h1", 2), ("zbv", 2))
           for m in (4, 8) for style in ("gpt", "llama")]


def test_every_schedule_on_two_ranks_equals_one_device():
    _check(run(_run_cases, 2, DRAFT, CASES_2, pool=True, timeout=120), CASES_2, 2)


def test_zbv_and_interleaved_on_four_ranks_equal_one_device():
    cases = [("zbv", 2, 8, "llama"), ("interleaved_1f1b", 2, 4, "gpt")]
    _check(run(_run_cases, 4, DRAFT, cases, pool=True, timeout=120), cases, 4)


def test_a_bad_schedule_is_refused_in_one_line_on_every_rank():
    results = run(_bad_schedule_then_good, 2, DRAFT, pool=True, timeout=60)
    missing = {r[0] for r in results}
    assert len(missing) == 1 and None not in missing, missing
    text = missing.pop()
    assert "\n" not in text and "rank 1" in text and "missing W(3, chunk 0)" in text, text
    deadlock = {r[1] for r in results}
    assert len(deadlock) == 1 and None not in deadlock, deadlock
    text = deadlock.pop()
    assert "\n" not in text and text.startswith("deadlock: rank 0 waits at B(0, chunk 0)") \
        and "rank 1 waits at F(1, chunk 0)" in text, text
    assert results[0][2] is None and results[1][2] < TOL        # the next step's loss is right


def _transfer_pattern(path: str) -> dict:
    """ZB-H1 (v = 2, m = 4) and ZBV (m = 4): when each receive was posted (the running action's
    position) against the action it feeds, and how many sends were still in flight at
    ``finish``."""
    import torch.distributed as dist

    from workbook.model import make_batch
    lab = _load_lab(path)

    class Watched(lab.OverlappedChunkedExecutor):
        def receive_for(self, k):
            self.posted_at.append((self.position, k))
            return super().receive_for(k)

        def finish(self):
            self.in_flight = len(self.sends)
            super().finish()

    out, p, m, v = {}, dist.get_world_size(), 4, 2
    for name in ("zb_h1", "zbv"):
        schedule, placement = lab.SCHEDULES[name]
        cfg = _config("llama", p * v)
        tokens, targets = make_batch(cfg, ROWS * m, seed=1)
        ex = Watched(cfg, m, v, placement)
        ex.posted_at = []
        ex.step(tokens, targets, lab.all_ranks(schedule, p, v, m))
        remote = sum(1 for a in ex.actions
                     if (d := ex.destination(a)) is not None and d[0] != ex.rank)
        out[name] = {"posted_at": ex.posted_at, "fed": sorted(ex.arrival),
                     "in_flight": ex.in_flight, "remote_sends": remote,
                     "left": len(ex.receives) + len(ex.sends) + len(ex.handed)}
    return out


def test_receives_are_posted_an_action_early_and_sends_waited_at_the_end():
    """The overlapped executor's structure (lab 10's, with chunks): every receive but the
    rank's first is posted while an earlier action runs, each once; no send is waited for
    before ``finish``; nothing is left over after the step."""
    for rank, by_name in enumerate(run(_transfer_pattern, 2, DRAFT, pool=True, timeout=60)):
        for name, r in by_name.items():
            fed = r["fed"]
            assert sorted(k for _, k in r["posted_at"]) == fed, (rank, name)
            late = [(at, k) for at, k in r["posted_at"] if at >= k and k != fed[0]]
            assert not late, f"rank {rank}, {name}: posted only when their action ran: {late}"
            assert r["in_flight"] == r["remote_sends"] > 0, (rank, name, r)
            assert r["left"] == 0, (rank, name)


def _traced_step(path: str, run_dir: str) -> list:
    """One ZBV step (m = 4, GPT) under the package's profiler; this rank's actions."""
    import torch.distributed as dist

    from workbook.model import make_batch
    from workbook.trace.capture import rank_trace
    lab = _load_lab(path)
    p, m, v = dist.get_world_size(), 4, 2
    cfg = _config("gpt", p * v)
    tokens, targets = make_batch(cfg, ROWS * m, seed=1)
    ex = lab.OverlappedChunkedExecutor(cfg, m, v, "v")
    schedules = lab.all_ranks(lab.zbv, p, v, m)
    with rank_trace(run_dir, lab="pp_schedules"):
        ex.step(tokens, targets, schedules)
    return [tuple(a) for a in schedules[dist.get_rank()]]


def test_the_trace_names_every_action_in_the_schedules_order(tmp_path):
    """Lab 10's trace reader (``phase_ranges``) finds each action by its exact name (``F3.c1``),
    once, in the order of the rank's schedule, and the phases around them (warm-up, steady,
    cool-down)."""
    from workbook.pipeline_parallel import ChunkAction, action_name
    from workbook.trace import load_trace
    from workbook.trace.analyse import phase_ranges
    actions = run(_traced_step, 2, DRAFT, str(tmp_path), pool=True, timeout=60)
    for rank, acts in enumerate(actions):
        t = load_trace(tmp_path / f"rank{rank}.trace.json")
        starts = []
        for a in map(ChunkAction._make, acts):
            (lo, hi), _ = phase_ranges(t, action_name(a))
            assert len(lo) == 1, f"rank {rank}: {action_name(a)} is {len(lo)} ranges"
            starts.append(lo[0])
        assert starts == sorted(starts), f"rank {rank}: actions out of the schedule's order"
        for phase in ("warmup", "steady", "cooldown"):
            assert len(phase_ranges(t, phase)[0][0]) >= 1, (rank, phase)
