"""One training step of a tensor-parallel schedule, by name, through the ``domino`` lab's
``train_step``: what lesson 6, ``workbook bench domino`` and ``workbook bench tp_overlap`` (which
compares the TP overlaps with Domino on the same shapes) all run.

The variants: ``vanilla_tp`` (Megatron, synchronous all-reduces), ``no_comm`` (vanilla TP with
``comm=False``: the step without communication), ``domino_intra``, ``domino`` (arXiv 2409.15241),
and ``no_comm_domino``: Domino's own schedule with a registry whose ``start`` files a finished
handle instead of an all-reduce (on a CPU the chunks' smaller working set can be faster, so the
optimum is the faster of the two no-communication schedules).
"""
from __future__ import annotations


class _Done:
    """The handle of an all-reduce that was never started."""

    def wait(self, *args, **kwargs):
        return True

    def is_completed(self):
        return True


def silent_registry(lab):
    """A registry of ``lab`` whose ``start`` communicates nothing (Domino, no communication)."""
    class Silent(lab.HandleRegistry):
        def start(self, key, tensor):
            self.put(key, _Done())
    return Silent()


def training_step(lab, m, x, targets, variant: str, *, p: int = 4, step: int = 0,
                  lookahead: int = 1) -> None:
    """One training step of ``variant`` (see the module docstring), then zero the gradients."""
    silent = variant == "no_comm_domino"
    lab.train_step(m, x, targets, variant="domino" if silent else variant, p=p, step=step,
                   lookahead=lookahead, registry=silent_registry(lab) if silent else None)
    m.zero_grad()
