"""The c10d rendezvous store of a several-node job, kept in a process of its own.

torchrun's c10d rendezvous needs one key-value store (a ``TCPStore``) that every node's agent
reaches at ``--rdzv-endpoint``. By default one agent serves it (``is_host=1``), and that is a
race at the end of every job: after the agents' exit barrier each one closes the rendezvous
(writes to the store that it is leaving), and the serving agent may finish first and exit, taking
the store with it while another agent is still writing ("has failed to shutdown the
rendezvous ... Failed to recv"). On a loaded machine the agents finish in either order.

So ``workbook.runtime.multinode`` serves the store from this process instead, started before the
agents (all ``is_host=0``) and stopped after the last of them::

    python -m workbook.runtime.rendezvous_store PORT     # prints "ready PORT" once it listens

It stops on SIGTERM or when its standard input closes, so a launcher that dies (even by SIGKILL)
takes the store with it: nothing is left listening.
"""
from __future__ import annotations

import signal
import sys
import threading
from datetime import timedelta

READY = "ready"


def serve(port: int) -> None:
    """Serve a TCPStore on every address of this host at ``port`` until stdin closes or SIGTERM."""
    from torch.distributed import TCPStore

    store = TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=60))
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    print(f"{READY} {store.port}", flush=True)
    while not done.wait(0.5):        # wake now and then: a signal handler runs between waits
        pass


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit() or not 0 < int(args[0]) < 65536:
        print("usage: python -m workbook.runtime.rendezvous_store PORT (1..65535)", file=sys.stderr)
        return 2
    try:
        serve(int(args[0]))
    except RuntimeError as e:        # the port is taken, most often
        print(f"rendezvous store: cannot serve port {args[0]}: {e}".splitlines()[0],
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
