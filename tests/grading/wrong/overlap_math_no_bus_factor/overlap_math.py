"""WRONG ON PURPOSE: collective_time ignores the nccl-tests bus factor."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "overlap_math")


def collective_time(op, size_bytes, n, hw):
    if n <= 1 and op not in ("send", "recv"):
        return 0.0
    return hw.latency_s + size_bytes / hw.bandwidth_Bps      # WRONG: forgets the bus factor
