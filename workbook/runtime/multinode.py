"""A job of several torchrun nodes: ``workbook run LAB --nnodes 2 --nproc-per-node 2``.

On a cluster each node runs one ``torchrun`` agent, and the agents find each other through a
**c10d rendezvous**: a small key-value store (a TCPStore) at ``--rdzv-endpoint HOST:PORT``
that every agent joins (by default one agent serves it; here the launcher does, which
outlives the agents: ``workbook.runtime.rendezvous`` says why), the nodes are numbered
(``GROUP_RANK``, in the order of their addresses), and each agent starts ``--nproc-per-node``
ranks. torchrun tells each rank where it is:

    RANK               0 .. WORLD_SIZE-1 over the whole job (node g holds g*P .. g*P+P-1)
    LOCAL_RANK         0 .. LOCAL_WORLD_SIZE-1 on this node
    GROUP_RANK         this node's number
    MASTER_ADDR/PORT   the store the ranks share: node 0's agent serves it, at its --local-addr

Two addresses matter, and a machine not set up for several nodes gets both wrong:

* ``--local-addr``: the address an agent announces; node 0's becomes every rank's
  ``MASTER_ADDR``. Without it torchrun takes the machine's host name, which often resolves to
  127.0.0.1 (always, inside a network namespace): an address no other node can reach.
* ``GLOO_SOCKET_IFNAME``: the network interface gloo's ranks listen on. gloo otherwise binds
  to what the host name resolves to, with the same trap.

``run_nodes`` starts one agent per ``Host`` (``workbook.runtime.hosts``: this machine, several
"nodes" on 127.0.0.1, which is what ``workbook run --nnodes`` does; or a Linux network
namespace of a ``NetnsPair``, two of them joined by a virtual cable, as two machines are: the
package's multi-node test, root only), waits for all of them and leaves no process behind;
``run_lab`` is ``workbook run --nnodes``: a lab's self-check as such a job, its verdict in a
few lines. ``torchrun ... -m workbook.grading.multinode_probe`` has every rank say where it ran.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from workbook.runtime.hosts import Host, free_port, send_signal
from workbook.runtime.rendezvous import RendezvousStore

EXIT_WITHIN_S = 20.0    # after a hang report (or the last verdict), every rank of a job is gone by then
LEAVING_S = 2.0     # once one agent failed, an agent whose ranks have all left is stopped then


# --------------------------------------------------------------------------- running the nodes
@dataclass
class Node:
    """One node's torchrun agent: its process, its output lines, and the tag that every process
    of the node carries in its environment (``WORKBOOK_NODE``: how ``_stop`` finds the ranks,
    which torchrun starts in sessions of their own and which outlive a killed agent)."""
    host: Host
    proc: subprocess.Popen
    tag: str
    lines: list[str] = field(default_factory=list)

    returncode = property(lambda self: self.proc.returncode)
    output = property(lambda self: "".join(self.lines))


def torchrun_command(i: int, hosts: list[Host], nproc_per_node: int, port: int, run_id: str,
                     command: list[str]) -> list[str]:
    """Node ``i``'s torchrun line. No agent serves the rendezvous store (``is_host=0``): the
    launcher does (``RendezvousStore``, on host 0)."""
    return [*hosts[i].prefix(), sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={len(hosts)}", f"--nproc-per-node={nproc_per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={hosts[0].address}:{port}",
            f"--rdzv-id={run_id}", "--rdzv-conf=is_host=0,join_timeout=60",
            f"--local-addr={hosts[i].address}", "--max-restarts=0", *command]


def run_nodes(command: list[str], hosts: list[Host], nproc_per_node: int, *,
              timeout: float | None = None, grace: float = 30.0, env: dict | None = None,
              echo=None, port: int | None = None) -> list[Node]:
    """Start one torchrun agent per host, each running ``command`` (a script and its arguments,
    or ``-m module ...``) on ``nproc_per_node`` ranks, and wait for all of them.

    Once an agent failed, an agent whose ranks have all left is stopped ``LEAVING_S`` after they
    left (time to report their status; it may then wait for its peers in torchrun's exit
    barrier); one whose ranks still run has ``grace`` seconds to let them report (a rank's
    watchdog ends it within its check's timeout + 20 s). After ``timeout`` seconds all are
    stopped. ``echo(i, line)`` sees node i's lines as they
    come. When this returns, no process of the job is left."""
    port = port or free_port()
    run_id = f"wb{os.getpid()}-{port}"
    base = {"OMP_NUM_THREADS": "1", **os.environ, **(env or {})}
    nodes, readers, store = [], [], None
    try:
        for i, host in enumerate(hosts):
            tag = f"{run_id}/{i}"
            proc = subprocess.Popen(
                torchrun_command(i, hosts, nproc_per_node, port, run_id, command),
                env=dict(base, GLOO_SOCKET_IFNAME=host.ifname, WORKBOOK_NODE=tag),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, errors="replace", start_new_session=True)
            nodes.append(Node(host, proc, tag))
            readers.append(threading.Thread(target=_read, args=(i, nodes[-1], echo), daemon=True))
            readers[-1].start()
        store = RendezvousStore(hosts[0], port)      # the agents wait for it (their clients retry)
        start, failed_at, alone_since = time.monotonic(), None, {}
        while any(n.proc.poll() is None for n in nodes):
            now = time.monotonic()
            if failed_at is None and any(n.returncode not in (None, 0) for n in nodes):
                failed_at = now
            for i, n in enumerate(nodes):
                if n.returncode is not None:
                    continue
                if failed_at is not None and len(_pids(n.tag)) <= 1:
                    alone_since.setdefault(i, now)       # its ranks have all left: the agent is alone
                if timeout is not None and now - start > timeout or failed_at is not None and (
                        now - failed_at > grace or now - alone_since.get(i, now) > LEAVING_S):
                    _stop(n)
            time.sleep(0.2)
    finally:
        for n in nodes:                              # whatever happened: nothing survives
            _stop(n)
        if store:
            store.stop()                             # the last to leave: after every agent
        for t in readers:
            t.join(timeout=5)
    return nodes


def _read(i: int, node: Node, echo) -> None:
    for line in node.proc.stdout:
        node.lines.append(line)
        if echo:
            echo(i, line)


def _pids(tag: str) -> list[int]:
    """The live processes whose environment holds ``WORKBOOK_NODE=tag``."""
    needle, found = f"\0WORKBOOK_NODE={tag}\0".encode(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in b"\0" + f.read() + b"\0":
                    found.append(int(pid))
        except OSError:                              # gone, or not ours to read
            pass
    return found


def _stop(node: Node) -> None:
    """SIGTERM the node's processes (torchrun passes it on to its ranks), SIGKILL what is left
    after 3 s; return once each has exited (a zombie, or gone)."""
    seen: set[int] = set()
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        deadline = time.monotonic() + wait
        for pid in _pids(node.tag):
            seen.add(pid)
            send_signal(pid, sig)
        while time.monotonic() < deadline and (node.proc.poll() is None or _pids(node.tag)
                                               or not all(map(_exited, seen))):
            time.sleep(0.05)
    node.proc.wait()


def _exited(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


ROOT_CAUSE = re.compile(r"rank\s*:\s*0 \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def job_exit_code(nodes: list[Node]) -> int:
    """The job's status: 0 when every agent succeeded, else the one rank 0 chose (1 a check
    failed, 2 a hang), read from its agent's failure report; 1 when it is not there."""
    if all(n.returncode == 0 for n in nodes):
        return 0
    found = [int(c) for n in nodes for c in ROOT_CAUSE.findall(n.output) if int(c) in (1, 2)]
    return found[0] if found else 1


# --------------------------------------------------------------------------- a lab's self-check
def node_split(nnodes: int | None, per_node: int | None, nproc: int | None) -> tuple:
    """``(nodes, ranks per node)`` from ``workbook run``'s options, or ValueError (one line)."""
    for flag, value in (("--nnodes", nnodes), ("--nproc-per-node", per_node), ("--nproc", nproc)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be at least 1 (got {value})")
    nnodes = nnodes or 1
    if per_node is None and (nproc is None or nproc % nnodes):
        raise ValueError(f"--nnodes {nnodes} needs --nproc-per-node (the ranks on each node)"
                         + (f": {nproc} ranks do not split into {nnodes} nodes" if nproc else ""))
    per_node = per_node or nproc // nnodes
    if nproc not in (None, nnodes * per_node):
        raise ValueError(f"--nproc {nproc} disagrees with --nnodes {nnodes} x --nproc-per-node "
                         f"{per_node} = {nnodes * per_node} ranks")
    return nnodes, per_node


def run_lab(lab_file, nnodes: int, nproc_per_node: int, *, timeout: float, link: str = "none",
            trace_dir: str | None = None, write=print) -> int:
    """The lab file's self-check as a job of ``nnodes`` torchrun nodes on 127.0.0.1 (a port
    the OS picks); returns its exit status (0 passed, 1 a check failed or is not implemented
    yet, 2 a hang)."""
    command = [str(lab_file), "--timeout", f"{timeout:g}", "--link", link]
    command += ["--trace-dir", os.path.abspath(trace_dir)] if trace_dir else []
    port = free_port()
    nodes_ = f"{nnodes} node{'s' * (nnodes > 1)}"
    write(f"{nodes_} of {nproc_per_node} ranks on 127.0.0.1 (one torchrun agent each), c10d "
          f"rendezvous at 127.0.0.1:{port}; a rank's node: GROUP_RANK, LOCAL_RANK")
    nodes = run_nodes(command, [Host(f"node {i}") for i in range(nnodes)], nproc_per_node,
                      port=port, echo=_AgentReports(write), grace=timeout + EXIT_WITHIN_S + 10)
    code = job_exit_code(nodes)
    agents = ", ".join(f"node {i} {n.returncode}" for i, n in enumerate(nodes))
    write(f"job of {nodes_}: exit {code} (torchrun agents' exit status: {agents})")
    return code


class _AgentReports:
    """Passes the ranks' lines on; a torchrun agent's failure report (its traceback and its
    ChildFailedError table, which rank 0's verdict already says in words) becomes one line."""

    FAILED = re.compile(r"api\.py:\d+\] failed \(exitcode: (-?\d+)\) local_rank: (\d+)")

    def __init__(self, write):
        self.write, self.rules_left = write, {}

    def __call__(self, i: int, line: str) -> None:
        found = self.FAILED.search(line)
        if found:
            self.write(f"node {i}: its torchrun agent reports local rank {found.group(2)} "
                       f"exited with {found.group(1)}")
            self.rules_left[i] = 3                   # the report ends at its third ==== rule
        elif self.rules_left.get(i):
            self.rules_left[i] -= line.startswith("=====")
        else:
            self.write(line.rstrip("\n"))
