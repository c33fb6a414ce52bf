"""The link's timeline: one record per operation a rank issued, and the queue that places it.

The link is a *resource*: like one NCCL stream, it carries one operation at a time, in issue
order. Operation k, issued at time i_k, starts when it is issued and the link is free, and ends
t(op_k) later::

    start_k = max(i_k, end_{k-1}),    end_k = start_k + t(op_k)

The link is full duplex, as NVLink and InfiniBand are: a send and a receive travel in opposite
directions at the same time (a ring step sends one chunk while it receives another), so
point-to-point ops queue per direction, while a collective occupies both. A receive can be posted
long before its peer sends (a pipeline stage posts the next micro-batch's receive early): its
transfer starts when the data is really there, ``start = max(arrival, end of the previous
receive)``, not when it was posted, so a late sender is never hidden by an early receive.

The modelled time is paid only when the result is needed: ``work.wait()`` (which a synchronous
call makes for you) returns once the real gloo op is done *and* ``end_k`` has passed. Compute
issued between an async op and its wait therefore runs *during* the modelled transfer: overlap
on CPU is real wall-clock overlap. A peer that arrives late still delays the real op, so rank
skew shows up as waiting beyond the modelled time (``OpRecord.arrival_ns`` records it).

Nodes
-----
Ranks started as several nodes (``torchrun --nnodes``, ``workbook run --nnodes``,
``launch.run(..., nnodes=2)``) get a link with two fabrics, NVLink inside a node and one network
card per rank between nodes: each op is costed by which ranks take part (``workbook.link.topology``:
a subgroup inside a node runs at NVLink speed, one rank per node at the card's, a group spanning
both the hierarchical way). Each fabric has its own two lanes, so a data-parallel all-reduce
across nodes and a tensor-parallel one inside a node can run at the same time, as on the real
machine; an op that needs both fabrics holds both. A preset without a network
(``dgx-h100-ib``) stays flat.

On GPU ranks served by gloo nothing is modelled: each op is recorded as it really ran
(``measure_real_ops``; ``OpRecord.link_ns`` is then the real op's time).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from workbook.link.cost_model import Link


# --------------------------------------------------------------------------- the op log
@dataclass
class OpRecord:
    """One operation on the link. Times are ``time.perf_counter_ns()`` of this rank."""
    seq: int
    op: str
    size_bytes: int
    group_size: int
    async_op: bool
    issued_ns: int
    modelled_ns: int
    start_ns: int = 0        # the link starts carrying it: issued, or later if the link is busy
    end_ns: int = 0          # modelled completion: start + modelled
    arrival_ns: int = 0      # the real gloo op completed (every peer had arrived): skew shows here
    first_wait_ns: int = 0   # the rank first waited on it (0: never): the schedule's structure
    gemms_at_issue: int | None = None   # GEMMs the rank had run when it issued the op, and when
    gemms_at_wait: int | None = None    # it first waited (program_order.CountGemms; else None)
    measured: bool = False   # no link modelled (GPU ranks on gloo): start..end is the real op
    recv_bytes: int = 0      # an all-to-all: the bytes this rank received (size_bytes: it sent)
    split_bytes: tuple | None = None   # an all-to-all on a modelled link: bytes [sender][receiver]
    ranks: tuple = ()        # the global ranks taking part (the group's, or a p2p's two): which
                             # group of a mesh carried it (the capstone's traffic per group)

    @property
    def link_ns(self) -> int:
        """How long the op held the link: its modelled time on the simulated link; on GPU ranks
        (``measured``), the real op from issue to completion (0 while it has not completed)."""
        if not self.measured:
            return self.modelled_ns
        return max(0, self.arrival_ns - self.start_ns) if self.arrival_ns else 0


class _LinkState:
    """Per-process state of the link: the calibrated model, the queue, and the log of ops."""

    def __init__(self) -> None:
        self.link: Link | None = None
        self.lock = threading.Lock()
        self.free_at_ns: dict = {}    # (fabric, direction) -> when that lane is free again
        self.log: list[OpRecord] = []
        self.seq = 0
        self.measure = False          # with no link, still log every op as it really ran

    def reset(self, link: Link | None) -> None:
        with self.lock:
            self.link, self.free_at_ns, self.log, self.seq = link, {}, [], 0


STATE = _LinkState()


def set_link(link: Link | None) -> None:
    """Use ``link`` for the ops issued from now on in this process (all ranks must agree)."""
    STATE.reset(link)


def measure_real_ops(on: bool = True) -> None:
    """With no simulated link, log every op anyway, timed as it really ran (issue to completion),
    so that a trace names each op with its bytes: GPU ranks on gloo (``gloo-cuda``), whose gloo
    spans would show a reduce-scatter as the all-reduce it runs on."""
    STATE.measure = on


def current_link() -> Link | None:
    return STATE.link


def op_log() -> list[OpRecord]:
    """Every op this rank put on the link since the last ``set_link``, in issue order."""
    return list(STATE.log)


def _note_arrival(record: OpRecord) -> None:
    record.arrival_ns = time.perf_counter_ns()

