"""One intra-op thread for a grader's tiny cases: ``with one_thread(): ...``.

A rank alone (a pool of one rank on two cores) and the judging process run torch on two
threads. On the graded models (``B = 2``, ``S = 16``, ``H = 64``) every op is microseconds of
work, and the second OpenMP thread mostly waits for the first, spinning while it waits: on a
busy machine, most of the CPU such a check spends. tp_overlap's numerics on one rank took 6.2
CPU s on two threads and 0.5 on one, with the same results (a sum split another way differs by
a few ulps, inside every comparison's tolerance); dp_overlap's single-device references,
2-3 CPU s in the judging process and 0.5 on one thread.
"""
from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def one_thread():
    """Run the block on one torch intra-op thread, then put the thread count back."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
