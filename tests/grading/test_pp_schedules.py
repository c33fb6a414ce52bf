"""Autograder for lab 12, ``pp_schedules``: the schedules, the numbers, the traffic, the overlap.

Schedules (instant, no ranks): ``interleaved_1f1b``, ``zb_h1`` and ``zbv`` for several
pipelines. Each set of ranks' actions first goes through the given
``check_chunked_schedule`` (every action once, F before B before W on each chunk, no deadlock on
paper), then is compared action by action with the order ``torch.distributed.pipelining`` runs
for the same shape (``workbook.pipeline_parallel.torch_orders``: torch's own runtime loop,
recorded), so the expected order is not written out here: PyTorch's implementation is the peer.
A schedule that differs is told where, and how its bubble and its activations in flight compare
with the schedule it should be (``simulate_chunked``, t_F = t_B = t_W), which is what the order
is for. Interleaved 1F1B with one chunk is lab 10's 1F1B (torch's ``Schedule1F1B``).

Prediction (instant, no ranks): ``predict_step_ms`` for four pipelines (interleaved 1F1B, ZB-H1,
ZBV twice) on four link presets, against the model
(``workbook.pipeline_parallel.pp_schedules_report.step_model``: ``simulate_chunked`` of PyTorch's
order with a whole stage's compute divided by v and the link's alpha-beta time for one activation
between two ranks, none at the V's turn); a value that equals a known wrong derivation gets a
message naming that term; a prediction that calls the package's model is refused.

Numerics (fp64, 2 and 4 ranks, 8 micro-batches of 2 rows, GPT and Llama): the learner's
``OverlappedChunkedExecutor`` runs one step of each schedule *in PyTorch's order* (so the
executor is graded on its own, whatever the state of the schedule functions): the loss on the
rank holding the last stage and every parameter's gradient must equal single-device training
on the whole batch.

Traffic (2 and 3 ranks, from the trace of one step of interleaved 1F1B and of ZBV): the sends
and receives of each rank, counted and sized, against the schedule's crossings between ranks
(one activation ``[b, S, H]`` per F whose next stage lives on another rank, one gradient per B
whose previous stage does; the V's turn on one rank moves nothing).

Overlap (fp32, 2 ranks, interleaved 1F1B with v = 2, simulated ``dgx-h100`` link), through the
shared timing policy: structure first (a send waited on right after it was posted, a receive
posted only when its data was needed: the link's log), then the share of the steady state's
point-to-point link time hidden behind compute, read from the trace. Numbers first, as in every
lab: traffic and overlap earn nothing while the executor's numerics fail.
"""
from __future__ import annotations

import os

import pytest
import torch

from workbook.grading.checks import numbers_first
from workbook.grading.engine import graded_size, on_ranks, simulated_link, world_sizes
from workbook.grading.model_checks import raise_if_failed, rank_error, to_cpu
from workbook.grading.overlap_run import profile_lab_step
from workbook.grading.threads import one_thread
from workbook.grading.trace_checks import OverlapCheck, trace_root_fixture
from workbook.grading.traffic_link import untimed_link
from workbook.link.program_order import waited_at_once
from workbook.pipeline_parallel.torch_orders import TORCH_CLASS, first_difference, torch_order

LAB = "pp_schedules"
TIMEOUT_S = 90.0
LINK = "dgx-h100"
M, ROWS = 8, 2                    # micro-batches per step, rows per micro-batch
TOL = dict(rtol=1e-9, atol=1e-12)
EXECUTOR = "OverlappedChunkedExecutor"
#: the runs on ranks: (schedule, chunks per rank v)
RUNS = {"interleaved_1f1b": 2, "zb_h1": 2, "zbv": 2}
NAMES = {"interleaved_1f1b": "interleaved 1F1B (v=2)", "zb_h1": "ZB-H1 (v=2)", "zbv": "ZBV"}
EXPOSED_P2P = 1               # per rank and kind: the first receive (nothing computes before it)
                              # and the last send (nothing computes after it)
THRESHOLD = 20.0              # % of the steady state's p2p link time hidden: a floor under the
                              # structure checks, which carry this test (docs/timing-checks.md)
#: (p ranks, v chunks per rank, m micro-batches) graded per schedule; torch accepts each
CASES = {"interleaved_1f1b": [(2, 1, 4), (4, 1, 6), (2, 2, 4), (2, 2, 8), (4, 2, 8), (3, 3, 6)],
         "zb_h1": [(2, 1, 4), (4, 1, 8), (3, 1, 6), (2, 2, 8), (4, 2, 8)],
         "zbv": [(2, 2, 2), (2, 2, 4), (2, 2, 8), (3, 2, 5), (4, 2, 4), (4, 2, 8)]}
SECTION = {"interleaved_1f1b": "sections 2 and 3", "zb_h1": "sections 4 and 5",
           "zbv": "section 6"}
#: shapes each schedule must refuse, with a ValueError of one line
REFUSED = {"interleaved_1f1b": (2, 2, 3), "zb_h1": (2, 2, 3), "zbv": (2, 3, 4)}


def _fmt(acts: list) -> str:
    return " ".join(f"{k}{i}" + (f".{c}" if c else "") for k, i, c in acts)


def _shape(acts, p: int, v: int, placement: str) -> str:
    """Bubble (all ranks) and the most chunk-activations any rank holds, on paper."""
    from workbook.pipeline_parallel import simulate_chunked
    line = simulate_chunked(acts, p, v, placement)
    return f"bubble {100 * line.bubble:.1f} %, peak {max(line.peak_in_flight)} chunk-activations"


def schedule_problem(lab, name: str, p: int, v: int, m: int) -> str | None:
    """Why the lab's ``name`` schedule for (p, v, m) is wrong, or None: completeness and
    deadlock first (the given checker), then torch's order, action by action."""
    from workbook.pipeline_parallel import ScheduleError, check_chunked_schedule
    fn, placement = lab.SCHEDULES[name]
    call = f"{name}(p={p}, v={v}, m={m})"
    acts = [[tuple(a) for a in fn(p, v, m, r)] for r in range(p)]
    try:
        check_chunked_schedule(acts, p, v, m, placement)
    except ScheduleError as exc:
        return f"{call}: {exc}"
    peer = "1f1b" if (name, v) == ("interleaved_1f1b", 1) else name
    want = torch_order(peer, p, v, m)
    if isinstance(want, str):                      # the grader's own set-up, not the learner's
        raise RuntimeError(f"cannot read torch's {TORCH_CLASS[peer][0]} order for {call}: "
                           f"{want} (the course pins torch 2.13: `workbook doctor`)")
    diff = first_difference(acts, want, ("yours", "torch's"))
    if diff is None:
        return None
    r = int(diff.split(",")[0].split()[1])
    return (f"{call}, {diff} (lesson 12, {SECTION[name]}; torch's {TORCH_CLASS[peer][0]} runs "
            f"the same order). Yours: {_shape(acts, p, v, placement)}; the schedule's: "
            f"{_shape(want, p, v, placement)}. Rank {r} runs {_fmt(acts[r])}")


def refusal_problem(lab, name: str) -> str | None:
    """A shape the schedule cannot run must be refused with a one-line ValueError."""
    fn, _ = lab.SCHEDULES[name]
    p, v, m = REFUSED[name]
    try:
        fn(p, v, m, 0)
    except ValueError as exc:
        return None if "\n" not in str(exc).strip() else (
            f"{name}(p={p}, v={v}, m={m}, rank=0): the error should be one line, got {exc!s:.200}")
    why = ("m must be a multiple of p when v > 1 (Megatron's rule: the given "
           "check_interleaved_shape)" if name != "zbv" else "a V holds exactly two chunks per rank")
    return f"{name}(p={p}, v={v}, m={m}, rank=0) returned a schedule: {why}; raise ValueError"


def _grade(name: str) -> None:
    from workbook.grading.labs import load_lab
    lab = load_lab(LAB)
    problems = [schedule_problem(lab, name, *case) for case in CASES[name]]
    problems.append(refusal_problem(lab, name))
    problems = [p for p in problems if p]
    if problems:
        raise AssertionError(problems[0] + (f" (and {len(problems) - 1} more case(s))"
                                            if problems[1:] else ""))


@pytest.mark.points(5)
@pytest.mark.tasks("interleaved_1f1b")
def test_interleaved_1f1b_schedule():
    """Interleaved 1F1B (v = 1, 2, 3) in Megatron's order; v = 1 is lab 10's 1F1B."""
    _grade("interleaved_1f1b")


@pytest.mark.points(5)
@pytest.mark.tasks("zb_h1")
def test_zb_h1_schedule():
    """ZB-H1 (v = 1, 2): the W's deferred to fill the drain."""
    _grade("zb_h1")


@pytest.mark.points(5)
@pytest.mark.tasks("zbv")
def test_zbv_schedule():
    """ZBV: two chunks per rank in a V, the backward split."""
    _grade("zbv")


# --------------------------------------------------------------------------- prediction
#: (link preset, schedule, p, v, m, activation shape, itemsize, a whole stage's F, B, W in ms)
PREDICTION_CASES = [
    ("dgx-h100", "interleaved_1f1b", 2, 2, 8, (2, 256, 256), 4, 120.0, 100.0, 110.0),
    ("dgx-a100", "zb_h1", 4, 1, 8, (1, 128, 512), 8, 80.0, 70.0, 60.0),
    ("pcie-h100", "zbv", 4, 2, 8, (1, 256, 128), 4, 300.0, 280.0, 260.0),
    ("dgx-h100-ib", "zbv", 2, 2, 6, (2, 128, 256), 4, 150.0, 160.0, 140.0),
]
PREDICTION_FLOPS = 40e9         # the local matmul rate the links are calibrated to


def prediction_model(name: str, p: int, v: int, m: int, link, shape, itemsize: int,
                     t_f: float, t_b: float, t_w: float) -> tuple[float, dict]:
    """The model's step and the known wrong derivations' values for PyTorch's order of ``name``."""
    from workbook.pipeline_parallel.pp_schedules_report import step_model
    peer = "1f1b" if (name, v) == ("interleaved_1f1b", 1) else name
    acts = torch_order(peer, p, v, m)
    if isinstance(acts, str):                      # the grader's own set-up, not the learner's
        raise RuntimeError(f"cannot read torch's order for {name} (p={p}, v={v}, m={m}): {acts}")
    return step_model(name, acts, TORCH_CLASS[peer][1], link, shape, itemsize, t_f, t_b, t_w)


@pytest.mark.points(3)
@pytest.mark.tasks("predict_step_ms")
def test_predict_step_ms():
    """The step of each schedule with overlapped p2p, predicted from the link's alpha-beta
    figures and a whole stage's compute, for four pipelines on four links: the model's."""
    from workbook.grading.labs import load_lab
    from workbook.grading.predictions import judge_prediction, reads_the_model
    from workbook.link.cost_model import make_link
    lab = load_lab(LAB)
    copied = reads_the_model(lab.predict_step_ms, ("step_model", "pp_schedules_report",
                                                   "prediction_model"))
    if copied:
        raise AssertionError(copied)
    for preset, name, p, v, m, shape, itemsize, t_f, t_b, t_w in PREDICTION_CASES:
        link = make_link(preset, PREDICTION_FLOPS)
        got = lab.predict_step_ms(link, name, p, v, m, shape, itemsize, t_f, t_b, t_w)  # first:
        # a stub is told before the model reads PyTorch's order (importing its pipelining: seconds)
        model, mistakes = prediction_model(name, p, v, m, link, shape, itemsize, t_f, t_b, t_w)
        problem = judge_prediction(
            got, model, mistakes, what=f"the step of {name} (p={p}, v={v}, m={m})",
            terms="one transfer = the link's latency + the activation's bytes (rows x seq x "
                  "hidden x itemsize) / its bandwidth, in ms, at every dependency between two "
                  "ranks; one chunk action = a whole stage's compute / v; your schedule played "
                  "with its own placement (lesson 12, section 7, \"Predict your step\")")
        if problem:
            raise AssertionError(
                f"predict_step_ms(link={preset} ({1e3 * link.latency_s:.3g} ms latency, "
                f"{link.bandwidth_Bps / 1e9:.3g} GB/s), schedule={name!r}, p={p}, v={v}, m={m}, "
                f"shape={shape}, itemsize={itemsize}, t_f_ms={t_f}, t_b_ms={t_b}, t_w_ms={t_w}): "
                f"{problem}")


# --------------------------------------------------------------------------- rank side
def _configs():
    from workbook.model import ModelConfig
    small = dict(hidden=32, heads=2, ffn_hidden=64, seq_len=8, vocab_size=64, dtype="float64")
    return [("gpt fp64", ModelConfig(n_layers=8, **small)),
            ("llama fp64", ModelConfig(style="llama", n_layers=8, **small))]


def _layers_for(cfg, n: int, v: int):
    """The config with exactly ``n * v`` blocks: one block per chunk."""
    import dataclasses
    return dataclasses.replace(cfg, n_layers=n * v)


def _step(lab, name: str, cfg, dev, m: int = M, rows: int = ROWS, seed: int = 3):
    """One step of the lab's executor on PyTorch's order of ``name``; (executor, loss)."""
    import torch.distributed as dist

    from workbook.model import make_batch
    p, v = dist.get_world_size(), RUNS[name]
    schedules = torch_order(name, p, v, m)
    if isinstance(schedules, str):
        raise RuntimeError(f"cannot read torch's order for {name} (p={p}, v={v}, m={m}): "
                           f"{schedules}")
    runner = lab.OverlappedChunkedExecutor(cfg, m, v, TORCH_CLASS[name][1], dev)
    tokens, targets = make_batch(cfg, rows * m, seed=seed)
    return runner, runner.step(tokens.to(dev), targets.to(dev), schedules)


def _run_numerics(name: str) -> dict:
    import torch.distributed as dist

    from workbook.grading.labs import load_lab
    from workbook.runtime.launch import device
    lab, dev, out = load_lab(LAB), device(), {}
    for tag, cfg in _configs():
        try:
            runner, loss = _step(lab, name, _layers_for(cfg, dist.get_world_size(), RUNS[name]),
                                 dev)
            out[tag] = {"loss": None if loss is None else float(loss),
                        "grads": runner.named_grads(), "stages": runner.stage_of}
        except Exception as exc:                  # noqa: BLE001 - graded by the test
            out[tag] = rank_error(exc)
    return to_cpu(out)


_REFERENCE: dict = {}


def _reference(tag: str, cfg):
    key = (tag, cfg.n_layers)
    if key not in _REFERENCE:
        from workbook.model import ReferenceModel, grads_by_name, make_batch
        with one_thread():                      # a tiny model (threads.py)
            model = ReferenceModel(cfg)
            tokens, targets = make_batch(cfg, ROWS * M, seed=3)
            loss = model(tokens, targets)
            loss.backward()
        _REFERENCE[key] = (loss.item(), grads_by_name(model))
    return _REFERENCE[key]


def _stub_first() -> None:
    """The executor's ``step`` (a stub at the challenge level) or its ``forward_step`` (the base
    step calls it first: every schedule starts with a forward) still the stub: told here, before
    any rank reads PyTorch's order and builds its chunks (``workbook.grading.stubs``)."""
    from workbook.grading.labs import load_lab
    from workbook.grading.stubs import raise_if_stub
    executor = load_lab(LAB).OverlappedChunkedExecutor
    raise_if_stub(executor.step, executor.forward_step)


def _check_numerics(name: str, n: int) -> None:
    n = graded_size(n, 2, 4)
    _stub_first()
    per_rank = on_ranks(n, _run_numerics, name, timeout=TIMEOUT_S, key=("numerics", name, n))
    for tag, cfg in _configs():
        loss, grads = _reference(tag, _layers_for(cfg, n, RUNS[name]))
        losses = []
        for rank, res in enumerate(per_rank):
            entry = res[tag]
            raise_if_failed(entry, rank, n, f"{EXECUTOR} on {NAMES[name]} ({tag})")
            where = (f"rank {rank} of {n} (stages {entry['stages']}): {EXECUTOR} running "
                     f"{NAMES[name]}, {tag}, {M} micro-batches")
            if entry["loss"] is not None:
                losses.append((rank, entry["loss"]))
            for pname, g in entry["grads"].items():
                want = grads[pname]
                if g is None:
                    raise AssertionError(f"{where}: {pname} has no gradient after the step: every "
                                         f"micro-batch's backward must run on every chunk")
                if not torch.allclose(g, want, **TOL):
                    ratio = float((g * want).sum() / (want * want).sum())
                    scaled = min(abs(ratio / M - 1), abs(ratio * M - 1)) < 0.05     # m x off
                    raise AssertionError(
                        f"{where}: the gradient of {pname} is off by up to "
                        f"{(g - want).abs().max().item():.3g} from one device on the whole batch "
                        f"(about {ratio:.3g} x the right one); "
                        + ("every micro-batch must run forward and backward once on every "
                           "chunk, its loss divided by m" if scaled else
                           "each received activation or gradient must be the one sent for that "
                           "micro-batch and chunk: a peer's messages fill your receives in the "
                           "order you post them, so post them in the order that peer sends "
                           "(arrivals)"))
        if len(losses) != 1:
            raise AssertionError(f"{EXECUTOR} on {NAMES[name]} ({tag}, {n} ranks): "
                                 f"{len(losses)} ranks returned a loss; the step returns the "
                                 f"loss on the rank holding the last stage only, None elsewhere")
        rank, got = losses[0]
        if abs(got - loss) > 1e-9 * max(1.0, abs(loss)):
            raise AssertionError(f"rank {rank}: {EXECUTOR} on {NAMES[name]} ({tag}) returned loss "
                                 f"{got}, the whole batch's mean loss on one device is "
                                 f"{loss:.12g}: each micro-batch's loss is its mean over m")


def _numbers_test(name: str, doc: str):
    @pytest.mark.points(2)
    @pytest.mark.tasks(EXECUTOR)
    @pytest.mark.parametrize("n", [2, 4])
    def test(n):
        _check_numerics(name, n)
    test.__doc__ = doc
    return test


test_interleaved_numbers = _numbers_test("interleaved_1f1b", "Interleaved 1F1B (v = 2) on your "
                                         "executor: the loss and every gradient of one device.")
test_zb_h1_numbers = _numbers_test("zb_h1", "ZB-H1 (v = 2, W's deferred): the same numbers.")
test_zbv_numbers = _numbers_test("zbv", "ZBV (the V, the turn on one rank): the same numbers.")
NUMBERS_TEST = {"interleaved_1f1b": "interleaved_numbers", "zb_h1": "zb_h1_numbers",
                "zbv": "zbv_numbers"}


def _numbers_first(name: str) -> None:
    def numbers():
        for n in (2, 4):
            _check_numerics(name, n)
    numbers_first(numbers, NUMBERS_TEST[name], once=(LAB, name))


# --------------------------------------------------------------------------- traffic
def _run_traffic(trace_dir: str, name: str) -> dict:
    import torch.distributed as dist

    from workbook import trace
    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig
    from workbook.runtime.launch import device
    from workbook.trace.capture import rank_trace
    lab, rank, dev = load_lab(LAB), dist.get_rank(), device()
    cfg = ModelConfig(n_layers=dist.get_world_size() * RUNS[name])
    folder = os.path.join(trace_dir, name)
    m = 6
    with untimed_link():          # counted, not timed: no slow-motion transfers
        try:
            _step(lab, name, cfg, dev, m=m)
            dist.barrier()
            with rank_trace(folder, lab=LAB):
                _step(lab, name, cfg, dev, m=m)
        except Exception as exc:                          # noqa: BLE001 - graded by its test
            return rank_error(exc)
    t = trace.load_trace(os.path.join(folder, f"rank{rank}.trace.json"))
    return {"ops": trace.collectives(t), "activation": ROWS * cfg.seq_len * cfg.hidden * 4, "m": m}


def crossings(name: str, p: int, m: int, rank: int) -> dict:
    """How many activations or gradients rank ``rank`` sends to and receives from other ranks in
    one step of ``name`` (PyTorch's order): what the trace must show."""
    from workbook.pipeline_parallel.chunked_executor import destination_of, source_of
    from workbook.pipeline_parallel.virtual_stages import ChunkAction
    v, placement = RUNS[name], TORCH_CLASS[name][1]
    out = {"send": 0, "recv": 0}
    for a in map(ChunkAction._make, torch_order(name, p, v, m)[rank]):
        for op, peer in (("send", destination_of(rank, a, p, v, placement)),
                         ("recv", source_of(rank, a, p, v, placement))):
            out[op] += peer is not None and peer[0] != rank
    return out


def _check_traffic(name: str, trace_root) -> None:
    _numbers_first(name)
    for n in world_sizes(2, 3):
        per_rank = on_ranks(n, _run_traffic, str(trace_root / f"traffic{n}"), name,
                            link=simulated_link(n, LINK), timeout=TIMEOUT_S,
                            key=("traffic", name, n, str(trace_root)))
        for rank, res in enumerate(per_rank):
            raise_if_failed(res, rank, n, f"one traced step of {NAMES[name]}")
            a, want = res["activation"], crossings(name, n, res["m"], rank)
            for op, count in want.items():
                have = res["ops"].get(op, {"count": 0, "bytes": 0})
                if have["count"] != count or (have["bytes"] is not None
                                              and have["bytes"] != count * a):
                    raise AssertionError(
                        f"rank {rank} of {n}: {NAMES[name]}, one step of {res['m']} micro-batches "
                        f"(from the trace): {have['count']} {op} moving {have['bytes']} bytes, "
                        f"expected {count} moving {count * a} bytes: one activation [b, S, H] "
                        f"({a} bytes) per F whose next stage is on another rank, one gradient "
                        f"per B whose previous stage is; a stage on this rank is handed its "
                        f"tensor in memory, nothing else")
    return None


trace_root = trace_root_fixture("pp_schedules_traces")


@pytest.mark.points(2)
@pytest.mark.tasks(EXECUTOR)
def test_traffic_interleaved(trace_root):
    """Interleaved 1F1B (v = 2): every crossing between ranks sent and received once, sized
    (2 and 3 ranks)."""
    _check_traffic("interleaved_1f1b", trace_root)


@pytest.mark.points(2)
@pytest.mark.tasks(EXECUTOR)
def test_traffic_zbv(trace_root):
    """ZBV: the same, and nothing for the V's turn, which stays on its rank (2 and 3 ranks)."""
    _check_traffic("zbv", trace_root)


# --------------------------------------------------------------------------- overlap
def _overlap(trace_dir: str, name: str) -> dict:
    """One profiled step (after a warm-up step) on a model whose compute per micro-batch can
    cover a transfer; the link's point-to-point ops and the steady state's hidden share."""
    from workbook.model import ModelConfig
    from workbook.runtime.launch import device
    dev = device()
    cfg = ModelConfig(hidden=256, heads=4, ffn_hidden=1024, n_layers=4, seq_len=256,
                      vocab_size=256, dtype="float32")

    def step(lab, _=None):
        return _step(lab, name, cfg, dev, rows=1)
    run = profile_lab_step(LAB, LINK, trace_dir, step, step)         # a warm-up, then the step
    if isinstance(run, dict):
        return run
    ops = [r for r in run.link_ops if r.op in ("send", "recv")]
    return {**run.head(),
            "at_once": {op: sum(1 for r in ops if r.op == op and waited_at_once(r))
                        for op in ("send", "recv")},
            "count": {op: sum(r.op == op for r in ops) for op in ("send", "recv")},
            "never_waited": sum(1 for r in ops if not r.first_wait_ns),
            "steady": run.figures("steady")}


def _structure(r: dict, phases=()) -> str | None:
    where = f"rank {r['rank']}: {EXECUTOR} on {NAMES['interleaved_1f1b']} (2 ranks, {r['link']})"
    if r["never_waited"]:
        return (f"{where}: {r['never_waited']} sends or receives never waited on: until "
                f"work.wait() returns, a send's buffer may still be read and a receive's is "
                f"not filled (wait for every send in finish)")
    if r["at_once"]["send"] > EXPOSED_P2P:
        return (f"{where}: {r['at_once']['send']} of its {r['count']['send']} sends were waited on "
                f"right after they were posted, so the rank sat idle while each travelled: post "
                f"a send with dist.isend and wait for it only in finish(), after the last action")
    if r["at_once"]["recv"] > EXPOSED_P2P:
        return (f"{where}: {r['at_once']['recv']} of its {r['count']['recv']} receives were posted "
                f"only when their data was needed and waited on at once: post the next receiving "
                f"action's receive before the running action computes (prefetch)")
    return None


OVERLAP = OverlapCheck(
    _overlap, {"steady": THRESHOLD}, _structure,
    where=f"{EXECUTOR} on {NAMES['interleaved_1f1b']} (2 ranks, {{link}})",
    what="the point-to-point link time of the steady state",
    advice={"steady": "post the next receiving action's receive before computing and leave "
                      "sends in flight until finish()"},
    link=LINK, timeout=TIMEOUT_S, failed=f"the overlap run of {NAMES['interleaved_1f1b']}",
    args=("interleaved_1f1b",))


@pytest.mark.points(7)
@pytest.mark.tasks(EXECUTOR)
def test_steady_state_p2p_hidden(trace_root):
    """Interleaved 1F1B (v = 2), overlapped: no send waited on as it is posted, every receive
    but the first posted an action ahead, and at least 20% of the steady state's p2p link time
    hidden. Graded once its numbers are right."""
    _numbers_first("interleaved_1f1b")
    OVERLAP.check(trace_root)
