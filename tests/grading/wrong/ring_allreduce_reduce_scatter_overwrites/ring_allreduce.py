"""DELIBERATELY WRONG (autograder self-test, tests/package/test_ring_collectives_wrong_caught.py):
the reduce-scatter phase receives each incoming partial result straight into its chunk, so it
replaces what the rank had instead of combining with it."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "ring_allreduce")


def ring_reduce_scatter(chunks, op=SUM):  # noqa: F821 (from the reference)
    rank, n = dist.get_rank(), dist.get_world_size()  # noqa: F821
    left, right = neighbours()  # noqa: F821
    for step in range(n - 1):
        send_i, recv_i = (rank - step) % n, (rank - step - 1) % n
        received = dist.irecv(chunks[recv_i], src=left)  # noqa: F821 BUG: overwrites, no combine
        sent = dist.isend(chunks[send_i], dst=right)  # noqa: F821
        received.wait()
        sent.wait()
    return (rank + 1) % n
