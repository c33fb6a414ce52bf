"""A point-to-point work may be waited on twice (and a hang in its wait names it), as on NCCL: gloo's send and receive works block
for ever on a second ``wait()``, so the flight recorder hands learners works that wait once
(``workbook.runtime.flight.WaitOnce``). A ring that waits again on an exchange it already waited on must
finish, on plain gloo and on the simulated link alike."""
from __future__ import annotations

import pytest

from workbook.runtime import launch


def _exchange_and_wait_twice():
    import torch
    import torch.distributed as dist
    r, n = dist.get_rank(), dist.get_world_size()
    send, recv = torch.full((4,), float(r)), torch.empty(4)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, (r + 1) % n),
                                    dist.P2POp(dist.irecv, recv, (r - 1) % n)])
    works.append(dist.isend(send, (r + 1) % n))
    dist.recv(torch.empty(4), (r - 1) % n)
    for _ in range(2):
        for w in works:
            w.wait()
    return recv.tolist()


@pytest.mark.parametrize("link", ["none", "dgx-h100"])
def test_p2p_work_waited_twice_does_not_hang(link):
    got = launch.run(_exchange_and_wait_twice, 2, link=link, timeout=30)
    assert got == [[1.0] * 4, [0.0] * 4]


def _receive_what_nobody_sends():
    import torch
    import torch.distributed as dist
    r, n = dist.get_rank(), dist.get_world_size()
    for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, torch.empty(4), (r - 1) % n)]):
        w.wait()


def test_a_hang_in_a_p2p_wait_names_the_wait():
    """A rank blocked in ``wait()`` on a receive nobody sends: the hang report says where."""
    with pytest.raises(launch.RanksTimedOut) as err:
        launch.run(_receive_what_nobody_sends, 2, timeout=8)
    assert "rank 0: in your wait() on batch_isend_irecv #1 (float32[4])" in str(err.value)
