"""Every tensor a rank hands to a collective sits on that rank's device, checked on a CPU machine.

On a GPU node each rank owns one device (``workbook.runtime.ranks.device()``: ``cuda:N``), and
NCCL takes no tensor from anywhere else ("No backend type associated with device type cpu"). On
CPU ranks every tensor is on the CPU anyway, so a grader, bench or lesson that builds its inputs
on the CPU and never moves them passes every CPU test and fails on its first GPU run.

These tests show that mistake without a GPU. A *meta rank* is this process posing as rank 0 of
2 whose device is ``meta`` (tensors with a shape and no data): ``ranks._CONTEXT`` says so, and
the collectives of ``torch.distributed`` are replaced by a spy that notes the device of every
tensor handed to it and returns at once. Then

* each input builder (the graders' ``_sample``, ``block_bench.inputs``, ``block_case``,
  ``tp_overlap_bench.model_on_rank``) must put every tensor it makes on ``meta``;
* each rank function (the graders' rank sides, ``domino_measure.agrees``, lesson 0's ``hello``
  and ``two_ways``) must hand the spy meta tensors only. On meta a run stops at the first value
  it needs (``.item()``, a copy to the CPU), which comes after the collectives the spy saw, so
  the test asserts that the run reached at least one.

A builder that makes CPU tensors fails here as it would under NCCL, naming the call and the
device (before the fix of 2026-11-26: ``block_bench.inputs``, the domino grader's numerics,
``domino_measure.agrees``, ``tp_overlap_bench`` and lesson 0's ``hello`` and ``two_ways``; see
docs/gpu.md).
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from workbook.runtime import ranks

ROOT = Path(__file__).resolve().parents[2]
META = torch.device("meta")
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
               "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "all_to_all_single",
               "send", "recv", "isend", "irecv", "batch_isend_irecv", "barrier")


# --------------------------------------------------------------------------- the meta rank
class _Done:
    """The work handle of a collective the spy finished at once."""

    def wait(self, *args, **kwargs):
        return True

    def is_completed(self):
        return True


def _tensors(obj):
    """Every tensor in ``obj``: a tensor, a list or tuple of them, a ``P2POp``, a module, a
    ``TPStack`` (its ``params``), a dict's values."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, torch.nn.Module):
        yield from obj.parameters()
        yield from obj.buffers()
    elif isinstance(obj, _P2POp):
        yield obj.tensor
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)
    elif isinstance(getattr(obj, "params", None), dict):
        yield from _tensors(obj.params)


class _P2POp:
    """``dist.P2POp`` without a process group (the real one looks up the default group)."""

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        self.op, self.tensor, self.peer, self.group, self.tag = op, tensor, peer, group, tag


class Spy:
    """Stands in for ``torch.distributed``'s collectives: ``calls`` holds ``(name, devices)``."""

    def __init__(self):
        self.calls: list[tuple[str, list]] = []

    def op(self, name: str):
        def collective(*args, **kwargs):
            self.calls.append((name, [t.device for t in _tensors((args, kwargs))]))
            if name == "batch_isend_irecv":
                return [_Done() for _ in args[0]]
            return _Done() if kwargs.get("async_op") or name in ("isend", "irecv") else None
        return collective


@pytest.fixture
def meta_rank(monkeypatch):
    """This process as rank 0 of 2 on the ``meta`` device, the collectives spied on; the lab
    files under test are the solutions."""
    spy = Spy()
    monkeypatch.setattr(ranks, "_CONTEXT", ranks.RankContext(0, 2, 0, "nccl", "meta"))
    monkeypatch.setenv("WORKBOOK_IMPL", "solutions")
    for name in COLLECTIVES:
        monkeypatch.setattr(dist, name, spy.op(name))
    monkeypatch.setattr(dist, "P2POp", _P2POp)
    for name, value in (("get_rank", 0), ("get_world_size", 2), ("get_backend", "nccl"),
                        ("is_initialized", True)):
        monkeypatch.setattr(dist, name, lambda *a, _v=value, **k: _v)
    monkeypatch.setattr(dist, "new_group", lambda *a, **k: object())
    monkeypatch.setattr(dist, "get_process_group_ranks", lambda group: [0, 1])
    return spy


def assert_on_rank_device(label: str, obj) -> None:
    """Every tensor in ``obj`` (``_tensors``) is on the meta rank's device."""
    found = list(_tensors(obj))
    assert found, f"{label} made no tensor"
    off = sorted({str(t.device) for t in found if t.device != META})
    assert not off, (f"{label}: {sum(t.device != META for t in found)} of {len(found)} tensors on "
                     f"{', '.join(off)}, not on the rank's device (workbook.runtime.ranks.device(): "
                     f"meta here, cuda:N on a GPU rank)")


def _case_errors(result) -> list[str]:
    """Every error a rank function recorded for a case (``{"error": ...}``, anywhere in its
    result): it keeps going after one, so a device mismatch there ("Expected all tensors to be
    on the same device") would otherwise go unseen."""
    if isinstance(result, dict):
        found = [result["error"]] if isinstance(result.get("error"), str) else []
        return found + [e for v in result.values() for e in _case_errors(v)]
    if isinstance(result, (list, tuple)):
        return [e for v in result for e in _case_errors(v)]
    return []


def assert_collectives_on_rank_device(label: str, spy: Spy, stopped, result=None) -> None:
    """The spy saw at least one collective, every tensor handed to one was on meta, and neither
    what stopped the run nor an error it recorded for a case names a device."""
    for error in [str(stopped or "")] + _case_errors(result):
        assert "device" not in error.lower(), (
            f"{label} on the meta rank: {error.splitlines()[0][:300]}: a tensor it built is not "
            f"on the rank's device (workbook.runtime.ranks.device())")
    assert spy.calls, f"{label} reached no collective on the meta rank (it stopped on {stopped!r})"
    for index, (name, devices) in enumerate(spy.calls):
        off = [str(d) for d in devices if d != META]
        assert not off, (f"{label}: collective {index + 1} of {len(spy.calls)}, dist.{name}, was "
                         f"handed a tensor on {off[0]}, not on the rank's device (meta here, "
                         f"cuda:N on a GPU rank, where NCCL takes no other): build it on "
                         f"workbook.runtime.ranks.device()")


def run_on_meta_rank(fn, *args):
    """``fn(*args)`` on the meta rank: ``(its result, what stopped it)`` (None: nothing)."""
    try:
        return fn(*args), None
    except Exception as exc:                       # noqa: BLE001 - meta has no values to read
        return None, exc


# --------------------------------------------------------------------------- what runs there
def _grader(lab: str):
    path = ROOT / "tests" / "grading" / f"test_{lab}.py"
    spec = importlib.util.spec_from_file_location(f"_device_placement_{lab}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.to_cpu = lambda obj: obj                # meta has no data to copy: keep the results,
    module.assert_equal_on_rank = lambda *a, **k: None      # and none to judge on the rank side
    return module


def _lesson_function(lesson: str, name: str):
    """Function ``name`` of ``lessons/LESSON.py``, defined on its own (the notebook's other cells
    do not run)."""
    tree = ast.parse((ROOT / "lessons" / f"{lesson}.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = {"os": __import__("os")}
    exec(compile(ast.Module([node], type_ignores=[]), f"lessons/{lesson}.py", "exec"), namespace)
    return namespace[name]


def _small_cfg():
    from workbook.model import ModelConfig
    return ModelConfig(hidden=32, heads=4, ffn_hidden=64, n_layers=2, seq_len=8, vocab_size=32,
                       dtype="float32")


def _tp_overlap_model():
    from workbook.grading.labs import load_lab
    from workbook.tensor_parallel import tp_overlap_bench
    opts = dict(hidden=32, heads=4, ffn=64, layers=2, seq=8, vocab=32, batch=4, style="gpt",
                chunks=2, variants=["sp", "domino"])
    return tp_overlap_bench.model_on_rank(opts, load_lab("tp_overlap"), ranks.device())


def _tp_overlap_step():
    from workbook.grading.labs import load_lab
    from workbook.tensor_parallel.tp_overlap_bench import lab_step
    _, _, xs, targets, m, blocks = _tp_overlap_model()
    lab_step(load_lab("tp_overlap"), blocks["sp"], m, xs, targets)


def _domino_step():
    from workbook.grading.labs import load_lab
    from workbook.tensor_parallel.variant_step import training_step
    _, x, _, targets, m, _ = _tp_overlap_model()
    training_step(load_lab("domino"), m, x, targets, "domino", p=2)


def _tp(module: str):
    return importlib.import_module(f"workbook.tensor_parallel.{module}")


BUILDERS = {
    "block_bench.inputs": lambda: _tp("block_bench").inputs(_small_cfg(), 4),
    "block_case": lambda: _tp("block_case").block_case()[1:],
    "tp_overlap_bench.model_on_rank": lambda: _tp_overlap_model()[1:],
    "collectives grader's _sample": lambda: _grader("collectives")._sample(7, torch.float64, 1),
    "ring_allreduce grader's _sample": lambda: _grader("ring_allreduce")._sample((7, 3),
                                                                                torch.int64, 1),
    "async_overlap grader's _sample": lambda: _grader("async_overlap")._sample((3, 7),
                                                                              torch.float32, 1),
}

RANK_FUNCTIONS = {
    **{f"collectives grader, {what}": (lambda what=what: _grader("collectives")._run_cases(what))
       for what in ("broadcast", "reduce", "all_reduce", "gather", "scatter", "all_gather",
                    "reduce_scatter")},
    **{f"ring_allreduce grader, {what}": (lambda what=what: _grader("ring_allreduce")._run(what))
       for what in ("ring_reduce_scatter", "ring_all_gather", "ring_all_reduce")},
    **{f"async_overlap grader, {ex}": (lambda ex=ex: _grader("async_overlap")._numerics(ex))
       for ex in ("overlapped", "pipelined")},
    "tp grader": lambda: _grader("tp")._run_all(),
    "sp grader": lambda: _grader("sp")._run_all(),
    **{f"domino grader, {kind}": (lambda kind=kind: _grader("domino")._numerics(kind))
       for kind in ("domino", "registry", "column")},
    "tp_overlap grader": lambda: _grader("tp_overlap")._run_all(),
    **{f"dp_overlap grader, {v}": (lambda v=v: _grader("dp_overlap")._run_numerics(v))
       for v in ("naive", "bucketed", "zero1", "zero2", "zero3")},
    **{f"pp_overlap grader, {v}": (lambda v=v: _grader("pp_overlap")._run_numerics(v))
       for v in ("gpipe", "1f1b", "1f1b_overlap")},
    "cp_ring grader": lambda: _grader("cp_ring")._run_numerics(),
    "domino_measure.agrees": lambda: _tp("domino_measure").agrees("solutions"),
    "tp_overlap_bench, an sp step": _tp_overlap_step,
    "tp_overlap_bench, a domino step": _domino_step,
    "lesson 0, hello": lambda: _lesson_function("00_setup", "hello")(),
    "lesson 0, two_ways": lambda: _lesson_function("00_setup", "two_ways")(),
}


# --------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("label", sorted(BUILDERS))
def test_input_builder_puts_tensors_on_the_rank_device(label, meta_rank):
    assert_on_rank_device(label, BUILDERS[label]())


@pytest.mark.parametrize("label", sorted(RANK_FUNCTIONS))
def test_rank_function_hands_collectives_the_rank_device(label, meta_rank):
    result, stopped = run_on_meta_rank(RANK_FUNCTIONS[label])
    assert_collectives_on_rank_device(label, meta_rank, stopped, result)


def test_outside_a_rank_inputs_stay_on_the_cpu():
    """Outside a rank (the grading process, a plain script) the batch is on the CPU; a device
    argument moves the same draw there."""
    from workbook.tensor_parallel.block_bench import inputs
    x, targets = inputs(_small_cfg(), 4)
    assert x.device.type == targets.device.type == "cpu"
    assert torch.equal(inputs(_small_cfg(), 4, device="cpu")[0], x)
    again, _ = inputs(_small_cfg(), 4, device="meta")
    assert again.device == META and again.shape == x.shape and again.dtype == x.dtype


def test_the_spy_catches_a_cpu_tensor(meta_rank):
    """The check itself: a rank function that all-reduces a CPU tensor fails, naming the call."""
    def careless():
        dist.all_reduce(torch.ones(3, device=ranks.device()))
        dist.all_reduce(torch.ones(3))

    run_on_meta_rank(careless)
    with pytest.raises(AssertionError, match=r"collective 2 of 2, dist.all_reduce, was handed a "
                                             r"tensor on cpu"):
        assert_collectives_on_rank_device("careless", meta_rank, None)


def test_a_device_mismatch_a_case_recorded_fails(meta_rank):
    """A rank function that records a case's error and goes on: an error naming a device fails."""
    def mixes_devices():
        dist.all_reduce(torch.ones(3, device=ranks.device()))
        return {("block", "gpt"): {"error": "RuntimeError: Expected all tensors to be on the same "
                                            "device, but found at least two devices, meta and cpu!"}}

    result, stopped = run_on_meta_rank(mixes_devices)
    with pytest.raises(AssertionError, match=r"mixes_devices on the meta rank: RuntimeError: "
                                             r"Expected all tensors to be on the same device"):
        assert_collectives_on_rank_device("mixes_devices", meta_rank, stopped, result)
