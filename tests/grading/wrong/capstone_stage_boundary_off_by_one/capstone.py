"""WRONG ON PURPOSE (capstone_stage_boundary_off_by_one): each stage's run of blocks ends one
block late (an inclusive end), so the block at the boundary runs on two stages."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "capstone")


def stage_blocks(n_layers, pp, stage):
    if n_layers % pp:
        raise ValueError(f"n_layers={n_layers} does not split into pp={pp} stages")
    k = n_layers // pp
    return list(range(stage * k, min(n_layers, (stage + 1) * k + 1)))  # WRONG: one too far
