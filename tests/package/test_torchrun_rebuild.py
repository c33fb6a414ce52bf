"""After a failed check under torchrun, the job's ranks build a fresh process group together
(``workbook.grading.torchrun_ranks.JobRanks.rebuild``): where one rank's build fails (gloo's full
mesh: "Connection closed by peer", seen once under load in the test command), every rank tries
the next generation, so no rank goes on without a group while the others have one; where every
try fails, every rank raises the same failure. Four ranks as threads over one in-memory store,
standing in for torchrun's TCPStore (set, get, wait on keys)."""
from __future__ import annotations

import threading

from workbook.grading import torchrun_ranks
from workbook.grading.torchrun_ranks import JobRanks

WORLD = 4


class MemoryStore:
    def __init__(self):
        self.values, self.cond = {}, threading.Condition()

    def set(self, key, value):
        with self.cond:
            self.values[key] = value if isinstance(value, bytes) else str(value).encode()
            self.cond.notify_all()

    def get(self, key):
        with self.cond:
            return self.values[key]

    def wait(self, keys):
        with self.cond:
            assert self.cond.wait_for(lambda: all(k in self.values for k in keys), timeout=30)


def _ranks(fails):
    """Four ranks sharing a store; ``fails(rank, generation)`` says whether a build fails."""
    store, built = MemoryStore(), []
    ranks = []
    for r in range(WORLD):
        job = JobRanks.__new__(JobRanks)
        job.store, job.rank, job.world, job.generation = store, r, WORLD, 0

        def init(job=job):
            if fails(job.rank, job.generation):
                raise RuntimeError("Gloo connectFullMesh failed with ... Connection closed by peer")
            built.append((job.rank, job.generation))
        job._init = init
        ranks.append(job)
    return ranks, built


def _rebuild_all(ranks):
    errors = {}

    def go(job):
        try:
            job.rebuild()
        except Exception as exc:                        # noqa: BLE001 - compared below
            errors[job.rank] = str(exc)
    threads = [threading.Thread(target=go, args=(job,)) for job in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return errors


def test_one_rank_failing_its_build_makes_every_rank_build_the_next_generation():
    ranks, built = _ranks(lambda rank, gen: rank == 2 and gen == 1)
    assert _rebuild_all(ranks) == {}
    assert {job.generation for job in ranks} == {2}              # every rank, the same group
    assert sorted(b for b in built if b[1] == 2) == [(r, 2) for r in range(WORLD)]


def test_every_try_failing_raises_the_same_failure_on_every_rank():
    ranks, _ = _ranks(lambda rank, gen: rank == 1)
    errors = _rebuild_all(ranks)
    assert sorted(errors) == list(range(WORLD))
    assert {job.generation for job in ranks} == {torchrun_ranks.REBUILD_TRIES}
    assert all("Connection closed by peer" in e for e in errors.values()), errors


def test_a_first_build_that_works_is_kept():
    ranks, built = _ranks(lambda rank, gen: False)
    assert _rebuild_all(ranks) == {}
    assert {job.generation for job in ranks} == {1} and len(built) == WORLD
