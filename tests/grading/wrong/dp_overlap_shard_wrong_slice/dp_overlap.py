"""WRONG ON PURPOSE (dp_overlap_shard_wrong_slice): ZeRO-1/2's Adam updates the *next* rank's
slice of each flat buffer, while the reduce-scatter hands it its own slice's gradient."""
from workbook.data_parallel import dp_rank, dp_world_size
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "dp_overlap")


def _next_ranks_slices(self):
    n, r = dp_world_size(), dp_rank()
    out = []
    for flat in self.flats:
        size = flat.numel // n
        lo = (r + 1) % n * size                           # WRONG: the next rank's slice
        out.append(flat.data[lo:lo + size].requires_grad_())
    return out


ShardedTrainer.make_shards = _next_ranks_slices                               # noqa: F821
