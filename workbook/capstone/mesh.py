"""The 2-D device mesh of the capstone: an inner group (TP or PP) inside each data-parallel replica.

``world = inner x dp`` ranks. The inner groups are contiguous, the data-parallel groups strided
(Megatron-LM's order, Shoeybi et al. 2019 / Narayanan et al. 2021, arXiv 2104.04473, sec. 3:
tensor parallelism innermost, so that its traffic, the heaviest, stays inside a node)::

    world 4 = inner 2 x dp 2        inner groups [0, 1], [2, 3]      dp groups [0, 2], [1, 3]

    rank = dp_rank * inner + inner_rank

Which ranks form which group is the learner's task 1 (``mesh_ranks``); ``Mesh.build`` turns
rank lists into process groups (every rank creates every group, in the same order, as
``torch.distributed.new_group`` requires) and precomputes this rank's coordinates.

``Mesh.as_world(group)``: the earlier labs were written for one group, the world: they call
``dist.all_reduce(t)`` with no ``group=``, ``dist.get_rank()`` for their index, p2p with
group-local peers. This context manager lets them run unchanged inside a subgroup, by making
that group the default one for the duration (``distributed_c10d._world.default_pg``): every
``group=None`` call then runs on it, seen as the world, while calls that name a group
(``group=mesh.dp_group``) still run on theirs. Megatron-LM instead passes
``get_tensor_model_parallel_group()`` to every call; the capstone's lesson is the same: inside a
mesh every collective names its group, here the DP one. Caveat: inside the scope
``dist.get_rank(group=other)`` is wrong (torch converts the swapped default's rank), so the
mesh's coordinates are computed once, outside.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

KINDS = ("tp", "pp")


def check_mesh_sizes(world_size: int, inner: int, dp: int) -> None:
    """One-line ``ValueError`` unless ``world_size == inner * dp`` with both positive integers."""
    for name, value in (("world_size", world_size), ("inner", inner), ("dp", dp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"mesh: {name}={value!r} must be a positive integer")
    if inner * dp != world_size:
        raise ValueError(f"mesh: {inner} x {dp} = {inner * dp} ranks, but the world has "
                         f"{world_size}: the mesh's sizes must multiply to the world size")


def check_rank_lists(world_size: int, inner: int, dp: int, inner_groups, dp_groups) -> None:
    """One-line ``ValueError`` unless there are ``dp`` inner groups of ``inner`` ranks and
    ``inner`` DP groups of ``dp`` ranks, each covering every rank exactly once."""
    for name, groups, count, size in (("inner", inner_groups, dp, inner),
                                      ("dp", dp_groups, inner, dp)):
        groups = [list(g) for g in groups]
        flat = sorted(r for g in groups for r in g)
        if len(groups) != count or any(len(g) != size for g in groups) or \
                flat != list(range(world_size)):
            raise ValueError(f"mesh: the {name} groups {groups} must be {count} groups of {size} "
                             f"ranks covering ranks 0..{world_size - 1} once each")


@dataclass
class Mesh:
    """This rank's place in an ``inner x dp`` mesh and its two process groups.

    ``kind``: ``"tp"`` or ``"pp"`` (what the inner groups do); ``inner_ranks`` / ``dp_ranks``:
    the global ranks of this rank's two groups; ``inner_rank`` / ``dp_rank``: its index in each
    (computed outside any ``as_world`` scope, where ``dist.get_rank(group)`` is right)."""
    kind: str
    world_size: int
    inner: int
    dp: int
    rank: int
    inner_groups: list
    dp_groups: list
    inner_ranks: list = field(default_factory=list)
    dp_ranks: list = field(default_factory=list)
    inner_group: object = None
    dp_group: object = None

    @property
    def inner_rank(self) -> int:
        return self.inner_ranks.index(self.rank)

    @property
    def dp_rank(self) -> int:
        return self.dp_ranks.index(self.rank)

    @classmethod
    def build(cls, kind: str, inner: int, dp: int, inner_groups, dp_groups) -> "Mesh":
        """The mesh on this rank: every rank must call it, with the same rank lists (from
        ``mesh_ranks``), in the same order. One-line ``ValueError`` for a bad kind or sizes."""
        import torch.distributed as dist
        if kind not in KINDS:
            raise ValueError(f"mesh: kind={kind!r}: use one of {KINDS}")
        world, rank = dist.get_world_size(), dist.get_rank()
        check_mesh_sizes(world, inner, dp)
        inner_groups = [sorted(int(r) for r in g) for g in inner_groups]
        dp_groups = [sorted(int(r) for r in g) for g in dp_groups]
        check_rank_lists(world, inner, dp, inner_groups, dp_groups)
        mesh = cls(kind, world, inner, dp, rank, inner_groups, dp_groups)
        for ranks in inner_groups:                       # every rank creates every group
            group = dist.new_group(ranks)
            if rank in ranks:
                mesh.inner_ranks, mesh.inner_group = ranks, group
        for ranks in dp_groups:
            group = dist.new_group(ranks)
            if rank in ranks:
                mesh.dp_ranks, mesh.dp_group = ranks, group
        return mesh

    @contextmanager
    def as_world(self, group):
        """Run the enclosed code with ``group`` as the default process group (see the module
        docstring); the real default comes back on exit, an exception included."""
        from torch.distributed import distributed_c10d as c10d
        saved = c10d._world.default_pg
        c10d._world.default_pg = group
        try:
            yield group
        finally:
            c10d._world.default_pg = saved

    def group_of(self, ranks) -> str:
        """``"TP"``/``"PP"``, ``"DP"`` or ``"world"``/``"other"``: which group these global ranks
        form on this mesh (the trace's collectives carry their ranks)."""
        ranks = sorted(ranks)
        if ranks in self.inner_groups:
            return self.kind.upper()
        if ranks in self.dp_groups:
            return "DP"
        return "world" if ranks == list(range(self.world_size)) else "other"
