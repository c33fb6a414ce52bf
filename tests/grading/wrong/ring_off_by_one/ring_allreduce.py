"""DELIBERATELY WRONG (autograder self-test, tests/package/test_wrong_impls_caught.py): the
all-gather phase starts one chunk too early, so it forwards a chunk that is only partly reduced."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "ring_allreduce")


def ring_all_gather(chunks):
    rank, n = dist.get_rank(), dist.get_world_size()  # noqa: F821 (from the reference)
    left, right = neighbours()  # noqa: F821
    for step in range(n - 1):
        send_i, recv_i = (rank - step) % n, (rank - step - 1) % n   # BUG: one chunk behind
        received = dist.irecv(chunks[recv_i], src=left)  # noqa: F821
        sent = dist.isend(chunks[send_i], dst=right)  # noqa: F821
        received.wait()
        sent.wait()
