"""The process group behind the simulated link: gloo, with every op charged to the link.

``dist.Backend.register_backend`` installs a backend named ``gloo_link`` whose process group
wraps ``ProcessGroupGloo`` and returns works that add the modelled wait (``LinkWork``).
Learners keep writing plain ``dist.all_reduce(t, async_op=True)``.

On GPU ranks that gloo serves (``gloo-cuda``: more ranks than NCCL can place) the same group is
registered for CUDA tensors as ``gloo_link_cuda``, and it moves them through host memory: gloo
runs on host copies, and an op's results are copied back to the GPU when it is waited on. (gloo's
own point-to-point hands a CUDA pointer to the socket and fails, "Bad address"; first GPU run,
NVIDIA H200.) No link is simulated there: GPU ranks are measured, not modelled.
"""
from __future__ import annotations

import math
import threading
import time

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d    # every *Options class (dist lacks some)

from workbook.link.cost_model import lanes
from workbook.link.op_records import STATE, OpRecord, _note_arrival
from workbook.link.program_order import gemms_run    # the op log's program-order structure

BACKEND_NAME = "gloo_link"
CUDA_BACKEND_NAME = "gloo_link_cuda"    # the same group, also taking CUDA tensors (gloo-cuda ranks)


class LinkWork(dist._Work):
    """A work whose ``wait()`` also waits out the modelled transfer time."""

    def __init__(self, inner, record: OpRecord | None, result=None, then=None):
        super().__init__()
        self._inner, self._record, self._result, self._then = inner, record, result, then

    def _finish(self) -> None:
        """Run the step that completes the op once gloo is done (a reduce-scatter's copy)."""
        if self._then is not None:
            then, self._then = self._then, None
            then()

    def wait(self, timeout=None):
        if self._record is None:
            self._inner.wait()
            self._finish()
            return True
        if not self._record.first_wait_ns:
            self._record.first_wait_ns = time.perf_counter_ns()
            self._record.gemms_at_wait = gemms_run()
        # the whole wait is blocked time on the compute thread: a late peer (the real gloo op)
        # and the modelled transfer alike, so the trace never counts it as compute
        with torch.profiler.record_function(f"link_wait:{self._record.op}"):
            if isinstance(self._inner, _ArrivalWatch):
                self._inner.join()
            else:
                self._inner.wait()
            self._finish()
            if not self._record.arrival_ns:
                self._record.arrival_ns = time.perf_counter_ns()
            delay = (self._record.end_ns - time.perf_counter_ns()) / 1e9
            if delay > 0:
                time.sleep(delay)
        return True

    def is_completed(self):
        if self._record is None or self._record.measured:
            return bool(self._inner.is_completed())
        return (
            self._record is not None and self._record.end_ns != 0
            and time.perf_counter_ns() >= self._record.end_ns)

    def is_success(self):
        return self._inner.is_success()

    def exception(self):
        return self._inner.exception()

    def result(self):
        return self._inner.result()

    def get_future(self):
        return self._inner.get_future()

    def source_rank(self):
        return self._inner.source_rank()

    def synchronize(self):
        return self.wait()


class _ArrivalWatch:
    """A send's or a receive's gloo work, waited on by a thread of its own from the moment it is
    posted, so that the link learns when it really completed (gloo's point-to-point works have no
    future): for a receive, when the data landed, and its modelled transfer is placed on the
    receive lane then (``start = max(arrival, lane free)``); for a send, when the peer took it
    (a real completion after the modelled end is a late peer, drawn as such). ``join()`` (the
    rank's ``wait()``) returns once the thread is done; gloo's work is waited on once only."""

    def __init__(self, inner, record: OpRecord, recv_lanes=()):
        self.work, self._record, self._error, self._lanes = inner, record, None, list(recv_lanes)
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name=f"link-{record.op}")
        self._thread.start()

    def _watch(self) -> None:
        try:
            self.work.wait()
        except BaseException as exc:           # noqa: BLE001 - raised again in the rank's wait()
            self._error = exc
        rec, now = self._record, time.perf_counter_ns()
        with STATE.lock:
            rec.arrival_ns = now
            if rec.op == "recv" and not rec.measured:   # a send keeps its place: it left when posted
                rec.start_ns = max(now, *(STATE.free_at_ns.get(lane, 0) for lane in self._lanes))
                rec.end_ns = rec.start_ns + rec.modelled_ns
                for lane in self._lanes:
                    STATE.free_at_ns[lane] = rec.end_ns

    def join(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error

    def __getattr__(self, name):
        return getattr(self.work, name)


def _nbytes(tensors) -> int:
    total = 0
    for t in tensors:
        if isinstance(t, (list, tuple)):
            total += _nbytes(t)
        elif isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size()
    return total


class _HostStaged:
    """A gloo work on host copies of GPU tensors: ``wait()`` waits for gloo, then copies each
    result back into the GPU tensor it stands for (the rest of the work's API is gloo's)."""

    def __init__(self, work, copy_back):
        self.work, self._copy_back = work, copy_back

    def wait(self, timeout=None):
        self.work.wait()
        for gpu_tensor, host in self._copy_back:
            gpu_tensor.copy_(host)
        self._copy_back = []
        return True

    def __getattr__(self, name):
        return getattr(self.work, name)


def needs_host_copy(tensor: torch.Tensor) -> bool:
    """Whether gloo must see a host copy of ``tensor`` (it lives on a GPU)."""
    return tensor.device.type != "cpu"


def _to_host(arg, copy_back: list | None):
    """``arg`` (a tensor, or lists of them) with every GPU tensor replaced by a host copy; the
    pairs (GPU tensor, host copy) are added to ``copy_back`` when it is a list (an output)."""
    if isinstance(arg, (list, tuple)):
        return type(arg)(_to_host(a, copy_back) for a in arg)
    if isinstance(arg, torch.Tensor) and needs_host_copy(arg):
        host = arg.detach().to("cpu", copy=True)
        if copy_back is not None:
            copy_back.append((arg, host))
        return host
    return arg


def _on_host(method, args: tuple, *rest):
    """gloo's ``method(*args, *rest)`` on host copies of any GPU tensors in ``args``; the first
    argument is the op's output (or its in-place buffer), copied back at ``wait()``."""
    copy_back: list = []
    host_args = tuple(_to_host(a, copy_back if i == 0 else None) for i, a in enumerate(args))
    work = method(*host_args, *rest)
    return _HostStaged(work, copy_back) if copy_back else work


class LinkedProcessGroup(dist.ProcessGroup):
    """A process group that runs every op on gloo and charges it to the simulated link.

    Sizes follow nccl-tests: all-gather counts the gathered output, reduce-scatter the full input,
    gather/scatter the n-rank buffer, everything else the buffer a rank passes in.
    """

    def __init__(self, store, rank: int, size: int, timeout, global_ranks=None):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._ranks = list(global_ranks or range(size))     # group rank -> global rank

    def getBackendName(self):            # noqa: N802  (name fixed by c10d)
        return BACKEND_NAME

    # -- the bookkeeping every op shares
    def _charge(self, op: str, inner, size_bytes: int, async_op: bool = True, then=None,
                peer: int | None = None, modelled_s: float | None = None, **fields):
        """Log ``op`` on the link and return its work; ``modelled_s`` (else the cost model's
        figure for ``size_bytes``) is its time, ``fields`` more ``OpRecord`` fields."""
        link = STATE.link
        if link is None and not STATE.measure:
            return LinkWork(inner, None, then=then)
        now = time.perf_counter_ns()
        ranks = self._ranks if peer is None else [self._ranks[self.rank()], self._ranks[peer]]
        if link is None:                 # GPU ranks on gloo: the op as it really runs, unmodelled
            rec = OpRecord(0, op, size_bytes, self.size(), async_op, now, 0, start_ns=now,
                           gemms_at_issue=gemms_run(), measured=True)
            held = []
        else:
            n = self.size()              # the ranks taking part: the group, or a p2p's two
            seconds = link.op_time(op, size_bytes, ranks) if modelled_s is None else modelled_s
            rec = OpRecord(0, op, size_bytes, n, async_op, now, int(seconds * 1e9),
                           gemms_at_issue=gemms_run())
            held = lanes(op, link.fabrics(op, ranks))
        rec.ranks = tuple(ranks)
        for name, value in fields.items():
            setattr(rec, name, value)
        if op in ("send", "recv"):
            # gloo's p2p works have no future: a thread watches each; a modelled receive is
            # placed on its lanes when the data lands (_ArrivalWatch), not when it is posted
            inner = _ArrivalWatch(inner, rec, held if op == "recv" else ())
        else:
            try:                         # note the moment gloo finishes (on gloo's thread)
                inner.get_future().then(lambda _f: _note_arrival(rec))
            except Exception:            # a work without a future: arrival is taken at wait()
                pass
        with STATE.lock:                 # a lane carries one op at a time, in issue order
            STATE.seq += 1
            rec.seq = STATE.seq
            if not rec.measured and op != "recv":
                rec.start_ns = max(rec.issued_ns, *(STATE.free_at_ns.get(lane, 0) for lane in held))
                rec.end_ns = rec.start_ns + rec.modelled_ns
                for lane in held:
                    STATE.free_at_ns[lane] = rec.end_ns
            STATE.log.append(rec)
        return LinkWork(inner, rec, then=then)

    def _collective(self, op: str, method: str, args: tuple, opts, options, size_bytes: int):
        """gloo's ``method(*args, opts)`` (``opts`` defaulting to ``options()``), charged to the
        link as ``op`` of ``size_bytes`` (nccl-tests' size: see the class docstring)."""
        return self._charge(op, _on_host(getattr(self._gloo, method), args, opts or options()),
                            size_bytes)

    # -- collectives
    def allreduce(self, tensors, opts=None):
        return self._collective("all_reduce", "allreduce", (tensors,), opts, c10d.AllreduceOptions,
                                _nbytes(tensors))

    def broadcast(self, tensors, opts=None):
        return self._collective("broadcast", "broadcast", (tensors,), opts, c10d.BroadcastOptions,
                                _nbytes(tensors))

    def reduce(self, tensors, opts=None):
        return self._collective("reduce", "reduce", (tensors,), opts, c10d.ReduceOptions,
                                _nbytes(tensors))

    def allgather(self, output_tensors, input_tensors, opts=None):
        return self._collective("all_gather", "allgather", (output_tensors, input_tensors), opts,
                                c10d.AllgatherOptions, _nbytes(output_tensors))

    def _allgather_base(self, output, input, opts=None):
        return self._collective("all_gather", "_allgather_base", (output, input), opts,
                                c10d.AllgatherOptions, _nbytes([output]))

    all_gather_single = _allgather_base                          # torch >= 2.6 routes here

    def gather(self, output_tensors, input_tensors, opts=None):
        return self._collective("gather", "gather", (output_tensors, input_tensors), opts,
                                c10d.GatherOptions, _nbytes(input_tensors) * self.size())

    def scatter(self, output_tensors, input_tensors, opts=None):
        return self._collective("scatter", "scatter", (output_tensors, input_tensors), opts,
                                c10d.ScatterOptions, _nbytes(output_tensors) * self.size())

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out, = output_tensors                                            # one tensor a rank
        pieces = [t.reshape(-1) for t in input_tensors[0]]               # n pieces, out's size
        return self._reduce_scatter_by_all_reduce(out, torch.cat(pieces), opts,
                                                  _nbytes(input_tensors))

    def _reduce_scatter_base(self, output, input, opts=None):
        return self._reduce_scatter_by_all_reduce(output, input.clone(), opts, _nbytes([input]))

    def _reduce_scatter_by_all_reduce(self, output, summed, opts, size_bytes: int):
        """Every reduce-scatter runs as gloo's all-reduce of ``summed`` (a copy of the whole
        input, ``[n * m]``), this rank's piece copied into ``output`` at ``wait()``. gloo's own
        reduce-scatter completes its future only when waited on, so a peer that arrived late
        could not be told from a rank that waited late (the trace would excuse a late wait as
        skew); the all-reduce's future fires when every peer is done. The cost charged is the
        reduce-scatter's."""
        ar = c10d.AllreduceOptions()
        ar.reduceOp = (opts or c10d.ReduceScatterOptions()).reduceOp
        summed = _to_host(summed, None)                                  # gloo works on the host
        inner = self._gloo.allreduce([summed], ar)
        piece = summed.view(self.size(), -1)[self.rank()]                # [m]
        return self._charge("reduce_scatter", inner, size_bytes,
                            then=lambda: output.view(-1).copy_(piece))

    reduce_scatter_single = _reduce_scatter_base                 # torch >= 2.6 routes here

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        row = input.element_size() * math.prod(input.shape[1:])     # bytes of one split unit
        sends = ([s * row for s in input_split_sizes] if input_split_sizes
                 else [_nbytes([input]) // self.size()] * self.size())
        return self._all_to_all("alltoall_base",
                                (output, input, output_split_sizes, input_split_sizes), opts,
                                sends, _nbytes([output]))

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._all_to_all("alltoall", (output_tensors, input_tensors), opts,
                                [_nbytes([t]) for t in input_tensors], _nbytes(output_tensors))

    def _all_to_all(self, method: str, args: tuple, opts, sends: list, recv_bytes: int):
        """An all-to-all, even or not: ``sends[d]`` bytes go to group rank ``d``. On a modelled
        link the ranks first swap their ``sends`` (a small gloo all-gather, not charged), so each
        prices the whole exchange by its busiest rank (``Link.all_to_all_time``) and logs the
        matrix; that swap waits for every peer to issue the all-to-all."""
        fields: dict = {"recv_bytes": recv_bytes}
        modelled = None
        if STATE.link is not None:
            n = self.size()
            rows = [torch.empty(n, dtype=torch.int64) for _ in range(n)]
            self._gloo.allgather([rows], [torch.tensor(sends, dtype=torch.int64)],
                                 c10d.AllgatherOptions()).wait()
            matrix = tuple(tuple(int(b) for b in r) for r in rows)
            modelled = STATE.link.all_to_all_time(matrix, self._ranks)
            fields["split_bytes"] = matrix
        work = _on_host(getattr(self._gloo, method), args, opts or c10d.AllToAllOptions())
        return self._charge("all_to_all", work, sum(sends), modelled_s=modelled, **fields)

    def barrier(self, opts=None):
        return self._collective("barrier", "barrier", (), opts, c10d.BarrierOptions, 0)

    # -- point to point
    def send(self, tensors, dst, tag=0):
        host = _to_host(tensors, None)
        return self._charge("send", self._gloo.send(host, dst, tag), _nbytes(tensors), peer=dst)

    def recv(self, tensors, src, tag=0):
        return self._charge("recv", _on_host(self._gloo.recv, (tensors,), src, tag),
                            _nbytes(tensors), peer=src)

    def recv_anysource(self, tensors, tag=0):
        return self._charge("recv", _on_host(self._gloo.recv_anysource, (tensors,), tag),
                            _nbytes(tensors))


def _create(options, _backend_options=None):
    """c10d's extended backend API: the group's store, rank, size and timeout, and its global
    ranks (which nodes an op spans)."""
    return LinkedProcessGroup(options.store, options.group_rank, options.group_size,
                              options.timeout, options.global_ranks_in_group)


def register(cuda: bool = False) -> str:
    """Make ``gloo_link`` (CPU tensors) or, with ``cuda``, ``gloo_link_cuda`` (CPU and CUDA
    tensors) a torch.distributed backend (idempotent); returns its name."""
    name, devices = (CUDA_BACKEND_NAME, ["cpu", "cuda"]) if cuda else (BACKEND_NAME, ["cpu"])
    if name.upper() not in dist.Backend.backend_list and name not in dist.Backend.backend_list:
        dist.Backend.register_backend(name, _create, extended_api=True, devices=devices)
    return name


def is_link_backend(name: str) -> bool:
    """Whether ``dist.get_backend()``'s ``name`` is this wrapper of gloo (either registration)."""
    return name in (BACKEND_NAME, CUDA_BACKEND_NAME)
