"""WRONG ON PURPOSE (capstone_same_shard): every DP rank takes the first shard of the global
batch, so two replicas train on the same rows and the rest of the batch is never seen."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "capstone")


def dp_shard(batch, dp_rank, dp_size):
    rows = batch.shape[0]
    if rows % dp_size:
        raise ValueError(f"a batch of {rows} rows does not split into {dp_size} equal DP shards")
    return batch[:rows // dp_size]                                    # WRONG: ignores dp_rank
