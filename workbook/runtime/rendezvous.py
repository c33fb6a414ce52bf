"""The rendezvous store of a job of several torchrun nodes, served by the launcher.

torchrun's agents meet at a **c10d rendezvous**: a small key-value store (a ``TCPStore``) at
``--rdzv-endpoint HOST:PORT`` that every agent joins, where they number the nodes and, once the
job is over, wait for each other in an exit barrier. By default the first agent on HOST serves
it; then the store leaves with that agent, and an agent that closes the rendezvous after it
finds nothing there and prints a traceback of its own (``DistNetworkError``; run 4 of the
test command, ``docs/test-suite.md``: on a loaded machine the agents leave in either order).
So here no agent serves it (``is_host=0`` in ``--rdzv-conf``, see
``workbook.runtime.multinode.torchrun_command``): the launcher does, in a thread of its own
(``RendezvousStore``), started after the agents (their clients retry until it answers) and
stopped after the last of them has left.

On a network-namespace host (``workbook.runtime.hosts.NetnsPair``) the thread enters the
namespace first, so that the store listens on that host's address.
"""
from __future__ import annotations

import threading

from workbook.runtime.hosts import Host, enter_netns


class RendezvousStore:
    """The job's rendezvous store (a ``TCPStore`` on every address of ``host`` at ``port``), served
    by a thread of this process, the launcher: it outlives every agent (an agent that closes the
    rendezvous last still finds it) and leaves with the launcher, however that ends. On a
    network-namespace host the thread enters the namespace first (``setns``: a thread's own,
    the process stays where it is)."""

    def __init__(self, host: Host, port: int, wait: float = 60.0):
        import torch.distributed                   # noqa: F401 - here, not in the thread: imports stay serial
        self.host, self.port, self.said = host, port, []
        self._up, self._done = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name=f"rendezvous-store-{port}")
        self._thread.start()
        if not self._up.wait(wait) or self.said:
            self.stop()
            raise OSError(self.said[0] if self.said else
                          f"rendezvous store: it did not start in {wait:g} s")

    def _serve(self) -> None:
        try:
            if self.host.netns:
                enter_netns(self.host.netns)
            from datetime import timedelta

            from torch.distributed import TCPStore
            store = TCPStore("0.0.0.0", self.port, is_master=True, wait_for_workers=False,
                             timeout=timedelta(seconds=60))
        except (OSError, RuntimeError) as exc:     # the port is taken, most often
            self.said.append(f"rendezvous store: cannot serve port {self.port}: "
                             f"{exc}".splitlines()[0])
            self._up.set()
            return
        self._up.set()
        self._done.wait()
        del store                                  # the server stops, the port closes

    def stop(self) -> None:
        """Stop serving; return once the port is closed (or, stuck starting, after 10 s: the
        thread is a daemon, it ends with this process)."""
        self._done.set()
        self._thread.join(timeout=10)
