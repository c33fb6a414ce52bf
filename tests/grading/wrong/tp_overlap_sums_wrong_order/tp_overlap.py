"""WRONG ON PURPOSE (tp_overlap_sums_wrong_order): the running sums go round the ring in the wrong
order (step k adds to shard r + k + 1 instead of r - k - 1): right on 2 ranks, wrong from 3 on."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "tp_overlap")


def ring_matmul_reduce_scatter(a, weight):
    n, r = tp_world_size(), tp_rank()                                         # noqa: F821
    s = a.shape[1] // n
    total = None
    for k in range(n):
        dst = (r + k + 1) % n                         # WRONG: the ring passes sums to r + 1
        part = a[:, dst * s:(dst + 1) * s] @ weight.T
        if k > 0:
            for w in works:
                w.wait()
            part = part + received
        if k < n - 1:
            received = torch.empty_like(part)                                 # noqa: F821
            works = exchange(part, received)                                  # noqa: F821
        total = part
    return total
