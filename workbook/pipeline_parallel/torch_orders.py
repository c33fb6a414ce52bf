"""The order in which ``torch.distributed.pipelining`` runs a schedule: a peer to grade against.

PyTorch ships the schedules of lab ``pp_schedules`` (``ScheduleInterleaved1F1B``,
``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``) and lab 10's ``Schedule1F1B``.
Reading the order they run, rather than writing the textbook order out by hand, gives the grader
and the package's tests an independent reference.

How the order is read: torch's own runtime loop runs, and records. For each rank we build the
real schedule class on stand-in stages (``RecordingStage``: a stage index, the group's size and
rank, and no sends or receives), then call ``_step_microbatches``, the loop ``step()`` runs. The
multi-stage schedules walk their lowered order and hand each compute action to the function
registered for its kind with ``register_custom_function`` (torch's hook for custom actions),
which writes it down; ``Schedule1F1B`` runs a hand-written loop that calls the stage's
``forward_one_chunk`` / ``backward_one_chunk``, which the stand-in writes down. Only the stages'
set-up (the point-to-point handshake and shape inference, which need a process group and have no
bearing on the order) is skipped. No process group, no subprocess.

These are torch's internals (``_step_microbatches``, ``_initialize_stage(s)``), read as of torch
2.13; ``torch_order`` returns ``"unavailable: ..."`` rather than guessing where they change.

Torch calls the input-gradient backward ``I`` and the full backward ``B``; the workbook writes
``B`` for both (``virtual_stages``: a schedule with W's splits every backward), so both map to B.
"""
from __future__ import annotations

from workbook.pipeline_parallel.pipeline_parallel import B, F
from workbook.pipeline_parallel.virtual_stages import (INTERLEAVED, V_SHAPE, W, rank_and_chunk,
                                                       stage_index)

#: The torch class that runs each of lab ``pp_schedules``' schedules, and its placement.
TORCH_CLASS = {"interleaved_1f1b": ("ScheduleInterleaved1F1B", INTERLEAVED),
               "zb_h1": ("ScheduleInterleavedZeroBubble", INTERLEAVED),
               "zbv": ("ScheduleZBVZeroBubble", V_SHAPE),
               "1f1b": ("Schedule1F1B", INTERLEAVED)}
_KIND = {"F": F, "I": B, "B": B, "W": W}


class RecordingStage:
    """Stands in for rank ``rank``'s ``PipelineStage`` of stage ``stage``: no layers, no
    transfers (every list of send or receive ops is empty); ``log`` gets each forward and
    backward ``Schedule1F1B``'s loop asks of it, as ``(stage, kind, micro_batch)``."""

    def __init__(self, stage: int, num_stages: int, rank: int, p: int, log: list):
        self.stage_index, self.num_stages = stage, num_stages
        self.group_rank, self.group_size = rank, p
        self.is_first, self.is_last = stage == 0, stage == num_stages - 1
        self.submod, self.log = None, log

    def get_fwd_recv_ops(self, i):
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def forward_one_chunk(self, i, *args, **kwargs):
        import torch
        self.log.append((self.stage_index, "F", i))
        return torch.zeros(())

    def backward_one_chunk(self, i, **kwargs):
        self.log.append((self.stage_index, "B", i))

    def perform_reduce_grad(self, *args):
        pass


def torch_runtime_order(cls_name: str, p: int, v: int, m: int, placement: str):
    """Per rank, the ``(stage, kind, micro_batch)`` compute actions torch's runtime runs for
    ``cls_name`` on ``p`` ranks of ``v`` stages each and ``m`` micro-batches, in order (torch's
    kind letters); or ``"refused: ..."`` (the first line of torch's error) for a shape torch
    refuses, or ``"unavailable: ..."`` where this torch has not the class or internals read."""
    try:
        from torch.distributed.pipelining import schedules as S
        cls = getattr(S, cls_name)
    except (ImportError, AttributeError) as exc:
        return f"unavailable: {type(exc).__name__}: {exc}"
    orders = []
    for r in range(p):
        log: list = []
        try:
            if cls_name == "Schedule1F1B":
                sched = cls(RecordingStage(r, p, r, p, log), m, loss_fn=lambda y, t: y)
                sched._initialize_stage = lambda *args, **kwargs: None
                sched._step_microbatches(target_mbs=[None] * m)
            else:
                stages = [RecordingStage(stage_index(r, c, p, placement), p * v, r, p, log)
                          for c in range(v)]
                sched = cls(stages, m, loss_fn=lambda y, t: y)
                sched._initialize_stages = lambda *args, **kwargs: None
                for kind in (S.F, S.I, S.B, S.W):
                    sched.register_custom_function(kind, lambda a, ctx: log.append(
                        (a.stage_index, a.computation_type.value, a.microbatch_index)))
                for kind in (S.UNSHARD, S.RESHARD, S.REDUCE_GRAD):        # FSDP's, DP's: none
                    sched.register_custom_function(kind, lambda a, ctx: None)
                sched._step_microbatches()
        except ValueError as exc:
            return "refused: " + str(exc).splitlines()[0]
        except (AttributeError, TypeError) as exc:               # torch's internals moved
            return f"unavailable: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        orders.append(log)
    return orders


def as_chunk_actions(order, p: int, placement: str):
    """``torch_runtime_order``'s result as the workbook's ``(kind, micro_batch, chunk)`` lists,
    one per rank, each action checked to sit on the rank ``placement`` gives its stage; a
    ``"refused: ..."`` or ``"unavailable: ..."`` string is passed through."""
    if isinstance(order, str):
        return order
    out = []
    for r, acts in enumerate(order):
        out.append([])
        for s, kind, i in acts:
            owner, chunk = rank_and_chunk(s, p, placement)
            if owner != r:
                raise AssertionError(f"torch runs stage {s} on rank {r}; the {placement} "
                                     f"placement puts it on rank {owner}")
            out[-1].append((_KIND[kind], i, chunk))
    return out


def torch_order(schedule: str, p: int, v: int, m: int):
    """Torch's order for lab ``pp_schedules``' ``schedule`` (a ``TORCH_CLASS`` key) as the
    workbook's per-rank action lists, or a ``"refused: ..."`` / ``"unavailable: ..."`` string."""
    cls_name, placement = TORCH_CLASS[schedule]
    return as_chunk_actions(torch_runtime_order(cls_name, p, v, m, placement), p, placement)


def first_difference(ours, theirs, names: tuple = ("ours", "torch's")) -> str | None:
    """Where two sets of per-rank orders part, as ``rank r, action k: ours X, torch's Y`` (the
    two words: ``names``); None when they are equal."""
    for r, (x, y) in enumerate(zip(ours, theirs)):
        for k in range(max(len(x), len(y))):
            mine, tor = (x[k] if k < len(x) else None), (y[k] if k < len(y) else None)
            if mine != tor:
                return f"rank {r}, action {k}: {names[0]} {mine}, {names[1]} {tor}"
    if len(ours) != len(theirs):
        return f"{len(ours)} ranks against {len(theirs)}"
    return None
