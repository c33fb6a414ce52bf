"""Grading on a small machine: the rank cap, the live-rank budget, what a rank imports.

``WORKBOOK_MAX_RANKS`` (``workbook grade --max-ranks N``) drops the world sizes above N without
changing a verdict: a check never vanishes, never degenerates to one rank, and keeps the sizes
it needs (tests/package/test_*_wrong_caught.py, run with the cap set, show the wrong labs are
still caught; README "Resources grading needs").
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workbook.grading import engine
from workbook.runtime.pool import _POOLS, shared_pool

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cap(monkeypatch):
    def set_cap(value):
        if value is None:
            monkeypatch.delenv(engine.ENV_MAX_RANKS, raising=False)
        else:
            monkeypatch.setenv(engine.ENV_MAX_RANKS, str(value))
    return set_cap


@pytest.mark.parametrize("value, expected", [
    (None, [(1, 2, 3, 4), (2, 3, 4), (3, 4), (4,), (1, 2, 3, 4), 3]),
    (4, [(1, 2, 3, 4), (2, 3, 4), (3, 4), (4,), (1, 2, 3, 4), 3]),
    (3, [(1, 2, 3), (2, 3), (3,), (4,), (1, 2, 3, 4), 3]),
    (2, [(1, 2), (2,), (3,), (4,), (1, 2, 4), 2]),
    (1, [(1, 2), (2,), (3,), (4,), (1, 4), 2]),     # one rank cannot show a communication bug
])
def test_world_sizes_under_a_cap(cap, value, expected):
    cap(value)
    got = [engine.world_sizes(1, 2, 3, 4), engine.world_sizes(2, 3, 4), engine.world_sizes(3, 4),
           engine.world_sizes(4), engine.world_sizes(1, 2, 3, 4, needs=(4,)),
           engine.graded_size(3, 2, 3)]
    assert got == expected
    assert engine.world_sizes(1) == (1,)


@pytest.mark.parametrize("value, live", [(None, [None] * 4), (1, [3, 3, 3, 4]), (2, [3, 3, 3, 4]),
                                         (3, [6] * 4), (4, [10] * 4)])
def test_the_pools_up_to_the_cap_stay_warm(cap, value, live):
    cap(value)
    assert [engine._live_ranks(n) for n in (1, 2, 3, 4)] == live


def test_a_self_checks_own_size_is_not_capped(cap):
    cap(2)
    engine.STATE.nproc = 4
    try:
        assert engine.world_sizes(1, 2, 3, 4) == (4,)
    finally:
        engine.STATE.nproc = None


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_cap_is_a_clear_error(cap, value):
    cap(value)
    with pytest.raises(ValueError, match="WORKBOOK_MAX_RANKS"):
        engine.world_sizes(1, 2)


def _rank():
    import torch.distributed as dist
    return dist.get_rank()


def test_pools_beyond_the_live_budget_are_closed():
    for pool in list(_POOLS.values()):
        pool.close()
    _POOLS.clear()
    one, two = shared_pool(1, max_live=3), shared_pool(2, max_live=3)
    assert one.alive() and two.alive()                 # 1 + 2 ranks fit in 3
    assert shared_pool(1, max_live=3) is one           # reused, now the most recently used
    three = shared_pool(3, max_live=3)                 # needs all 3: both others close
    assert three.run(_rank) == [0, 1, 2]
    assert not one.alive() and not two.alive()
    assert shared_pool(1, max_live=4) is not one and three.alive()
    for pool in list(_POOLS.values()):
        pool.close()
    _POOLS.clear()


def test_tracing_does_not_import_the_compiler(tmp_path):
    """torch's profiler imports torch._inductor (about 40 MB and 2 s per rank) on start unless
    the workbook's capture keeps it out; traces are still written."""
    code = ("import sys, torch\n"
            "from workbook.trace.capture import rank_trace\n"
            f"with rank_trace({str(tmp_path)!r}, lab='x'):\n"
            "    torch.ones(3).add_(1)\n"
            "print('torch._inductor' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout + out.stderr
    assert (tmp_path / "rank0.trace.json").is_file()
