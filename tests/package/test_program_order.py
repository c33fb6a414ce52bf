"""Program order, not the clock: whether a GEMM ran between an op's start and its first wait.

The overlap graders' structure checks read ``workbook.link.program_order.waited_at_once`` on the
link's op log. These tests pin the rule where the clock would get it wrong: a rank that sleeps
(a descheduled rank on a loaded machine) between an all-reduce's start and its wait has still
hidden nothing, and a GEMM that runs in a few microseconds has still been placed correctly.
"""
import time

import torch
import torch.distributed as dist

from workbook import link
from workbook.runtime import launch
from workbook.link import Link
from workbook.link.program_order import CountGemms, gemms_run, waited_at_once

SLOW = Link("dgx-h100", bandwidth_Bps=40e6, latency_s=0.0, local_flops=5e10, scale=1.0)


def schedules() -> dict:
    """Four all-reduces on a link pinned to 0.2 s each, in a counted run; one more uncounted."""
    link.set_link(SLOW)
    g, a = torch.ones(2_000_000), torch.randn(64, 64, requires_grad=True)
    dist.barrier()
    with CountGemms():
        work = dist.all_reduce(g, async_op=True)        # waited at once, after a long stall
        time.sleep(0.1)                                 # half the transfer: the clock is fooled
        work.wait()
        work = dist.all_reduce(g, async_op=True)        # a tiny GEMM between: placed right
        (a @ a).sum().backward()                        # forward mm, backward mm x 2
        work.wait()
        work = dist.all_reduce(g, async_op=True)        # elementwise work only: hides nothing
        torch.tanh(g).sum()
        work.wait()
        dist.all_reduce(g)                              # blocking: waited inside the call
        counted = gemms_run()
    work = dist.all_reduce(g, async_op=True)            # not counted: the clock decides
    work.wait()
    log = [r for r in link.op_log() if r.op == "all_reduce"]
    return {"at_once": [waited_at_once(r) for r in log], "gemms": counted,
            "uncounted": (log[-1].gemms_at_issue, log[-1].gemms_at_wait), "outside": gemms_run()}


def test_a_gemm_between_start_and_wait_decides_not_the_clock():
    for r in launch.run(schedules, 2, backend="gloo", pool=True):
        assert r["at_once"] == [True, False, True, True, True], r
        assert r["gemms"] == 3, r                       # a @ a, and its backward's two mm
        assert r["uncounted"] == (None, None) and r["outside"] is None, r


def test_nested_counts_and_the_clock_fallback():
    from workbook.link import OpRecord
    with CountGemms():
        torch.ones(2, 2) @ torch.ones(2, 2)
        with CountGemms():
            assert gemms_run() == 0
            torch.mm(torch.ones(2, 2), torch.ones(2, 2))
            assert gemms_run() == 1
        assert gemms_run() == 2                         # the outer count saw the inner GEMM
    never = OpRecord(1, "all_reduce", 8, 2, True, issued_ns=100, modelled_ns=1000)
    assert not waited_at_once(never)                    # never waited: reported on its own
    soon = OpRecord(1, "all_reduce", 8, 2, True, issued_ns=100, modelled_ns=1000,
                    first_wait_ns=120)
    late = OpRecord(1, "all_reduce", 8, 2, True, issued_ns=100, modelled_ns=1000,
                    first_wait_ns=900)
    assert waited_at_once(soon) and not waited_at_once(late)   # within 5% of the transfer
