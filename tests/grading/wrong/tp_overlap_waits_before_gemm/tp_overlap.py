"""WRONG ON PURPOSE (tp_overlap_waits_before_gemm): each ring step waits for its exchange before
the GEMM it should hide behind: right numbers, the forward exchanges fully exposed."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "tp_overlap")


def ring_all_gather_matmul(x, weight):
    n, r, s = tp_world_size(), tp_rank(), x.shape[1]                          # noqa: F821
    y = x.new_empty(x.shape[0], n * s, weight.shape[0])
    x_full = x.new_empty(x.shape[0], n * s, x.shape[2])
    shard = x.contiguous()
    for k in range(n):
        src = (r - k) % n
        if k < n - 1:
            nxt = torch.empty_like(shard)                                     # noqa: F821
            for w in exchange(shard, nxt):                                    # noqa: F821
                w.wait()                              # WRONG: waited before the GEMM
        rows = slice(src * s, (src + 1) * s)
        y[:, rows] = shard @ weight.T
        x_full[:, rows] = shard
        if k < n - 1:
            shard = nxt
    return y, x_full
