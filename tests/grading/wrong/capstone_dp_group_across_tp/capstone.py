"""WRONG ON PURPOSE (capstone_dp_group_across_tp): the DP groups are built across the TP ranks
(the inner groups again), so the gradients are averaged over ranks that hold different shards."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "capstone")


def mesh_ranks(world_size, inner, dp):
    inner_groups = [list(range(d * inner, (d + 1) * inner)) for d in range(dp)]
    return inner_groups, [list(g) for g in inner_groups]              # WRONG: not strided
