"""WRONG ON PURPOSE (pp_schedules_receives_in_own_order): the executor posts each receive when
its own action comes up, in this rank's order, not in the order the peer sends. With chunks, a
peer's messages arrive in the peer's action order, so a gradient lands in an activation's buffer
(or the next micro-batch's): the numbers are wrong."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "pp_schedules")


def post_receive(self, k):
    if k is None or k not in self.arrival or k in self.receives:
        return
    peer, buffer = self.receive_for(k)                         # WRONG: earlier messages of the
    self.receives[k] = (buffer, dist.irecv(buffer, peer))      # same peer not posted first  # noqa: F821
    self.posted[peer] = self.posted.get(peer, 0) + 1


OverlappedChunkedExecutor.post_receive = post_receive                          # noqa: F821
