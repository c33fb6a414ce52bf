"""A point-to-point work may be waited on twice, as on NCCL: gloo's send and receive works block
for ever on a second ``wait()``, so the flight recorder hands learners works that wait once
(``workbook.flight.WaitOnce``). A ring that waits again on an exchange it already waited on must
finish, on plain gloo and on the simulated link alike."""
from __future__ import annotations

import pytest

from workbook import launch


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
