"""A job of several torchrun nodes: ``workbook run LAB --nnodes 2 --nproc-per-node 2``.

On a cluster each node runs one ``torchrun`` agent, and the agents find each other through a
**c10d rendezvous**: a small key-value store (a TCPStore) at ``--rdzv-endpoint HOST:PORT``
that every agent joins (by default one agent serves it; here the launcher does, which
outlives the agents: ``Store`` says why), the nodes are numbered (``GROUP_RANK``,
in the order of their addresses), and each agent starts ``--nproc-per-node`` ranks. torchrun
tells each rank where it is:

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

``run_nodes`` starts one agent per ``Host``. A host is this machine (several "nodes" on
127.0.0.1: what ``workbook run --nnodes`` does) or a Linux network namespace: ``NetnsPair``
makes two, joined by a virtual cable (a veth pair), so that each node has its own network
stack and address, as two machines have (the package's multi-node test; root only).
``torchrun ... -m workbook.grading.multinode_probe`` has every rank say where it ran.
"""
from __future__ import annotations

import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

EXIT_WITHIN_S = 20.0    # after a hang report (or the last verdict), every rank of a job is gone by then
LEAVING_S = 2.0     # once one agent failed, an agent whose ranks have all left is stopped then


@dataclass
class Host:
    """Where one node's agent runs: ``address`` is how the other nodes reach it, ``ifname`` the
    interface its ranks' gloo uses, ``netns`` its network namespace (None: this machine)."""
    name: str
    address: str = "127.0.0.1"
    ifname: str = "lo"
    netns: str | None = None

    def prefix(self) -> list[str]:
        """What runs a command on this host: nothing here, ``ip netns exec NS`` in a namespace."""
        return ["ip", "netns", "exec", self.netns] if self.netns else []


def free_port() -> int:
    """A TCP port no one listens on, picked by the OS (a fresh namespace has every port free)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- two namespaces
def _ip(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode:
        raise OSError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


class NetnsPair:
    """Two network namespaces joined by a veth pair: two "hosts" on one machine (root only).

    ``with NetnsPair() as hosts`` gives two ``Host``s, 10.A.B.1 and 10.A.B.2 on a /24 that no
    interface here uses. On leaving, whatever happened, every process inside is killed and both
    namespaces are deleted (the cable goes with them)."""

    _count = itertools.count()

    def __init__(self):
        tag = f"{os.getpid()}{next(self._count)}"
        self.names = [f"wb-{tag}-{i}" for i in range(2)]
        links = [f"wb{tag}{c}"[-15:] for c in "ab"]          # interface names: 15 characters
        subnet = _unused_subnet()
        self.hosts = [Host(ns, f"{subnet}.{i + 1}", link, ns)
                      for i, (ns, link) in enumerate(zip(self.names, links))]

    def __enter__(self) -> list[Host]:
        try:
            for ns in self.names:
                _ip("netns", "add", ns)
            a, b = self.hosts
            _ip("link", "add", a.ifname, "type", "veth", "peer", "name", b.ifname)
            for h in self.hosts:
                _ip("link", "set", h.ifname, "netns", h.netns)
                _ip("-n", h.netns, "addr", "add", f"{h.address}/24", "dev", h.ifname)
                _ip("-n", h.netns, "link", "set", h.ifname, "up")
                _ip("-n", h.netns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self.hosts

    def __exit__(self, *exc) -> None:
        self.close()

    def pids(self, i: int) -> list[int]:
        """Every process running in namespace ``i``."""
        return [int(p) for p in _ip("netns", "pids", self.names[i], check=False).split()]

    def kill(self, i: int) -> None:
        """SIGKILL every process in namespace ``i`` (a host that dies), until none is left."""
        deadline = time.monotonic() + 10
        while (pids := self.pids(i)) and time.monotonic() < deadline:
            for pid in pids:
                _signal(pid, signal.SIGKILL)
            time.sleep(0.05)

    def close(self) -> None:
        listed = _ip("netns", "list", check=False).split()
        for i, ns in enumerate(self.names):
            if ns in listed:
                self.kill(i)
                _ip("netns", "del", ns, check=False)
        _ip("link", "del", self.hosts[0].ifname, check=False)   # left only by a half set-up


def _unused_subnet() -> str:
    """10.A.B (a /24) from this process's id, moved on while an interface here is in it."""
    used = _ip("-4", "addr", check=False)
    for k in range(256):
        n = (os.getpid() + 7919 * k) % 38400
        if f" 10.{100 + n // 256}.{n % 256}." not in used:
            return f"10.{100 + n // 256}.{n % 256}"
    raise OSError("no free 10.x.y.0/24 subnet")


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
    launcher does (``Store``, on host 0)."""
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

    Once an agent failed, an agent whose ranks have all left is stopped after ``LEAVING_S`` (it
    may wait for its peers in torchrun's exit barrier); one whose ranks still run has ``grace``
    seconds to let them report (a rank's watchdog ends it within its check's timeout + 20 s).
    After ``timeout`` seconds all are stopped. ``echo(i, line)`` sees node i's lines as they
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
        store = Store(hosts[0], port)                # the agents wait for it (their clients retry)
        start, failed_at = time.monotonic(), None
        while any(n.proc.poll() is None for n in nodes):
            now = time.monotonic()
            if failed_at is None and any(n.returncode not in (None, 0) for n in nodes):
                failed_at = now
            for n in nodes:
                if n.returncode is None and (
                        timeout is not None and now - start > timeout or failed_at is not None
                        and now - failed_at > (grace if len(_pids(n.tag)) > 1 else LEAVING_S)):
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


class Store:
    """The job's rendezvous store (a ``TCPStore`` on every address of ``host`` at ``port``), served
    by a thread of this process, the launcher: it outlives every agent (an agent that closes the
    rendezvous last still finds it; run 4's failure, when the serving agent had left first) and
    leaves with the launcher, however that ends. On a network-namespace host the thread enters
    the namespace first (``setns``: a thread's own, the process stays where it is)."""

    def __init__(self, host: Host, port: int, wait: float = 60.0):
        import torch.distributed                   # here, not in the thread: imports stay serial
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
                _enter_netns(self.host.netns)
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


def _enter_netns(name: str) -> None:
    """Move the calling thread into network namespace ``name`` (``ip netns``'s, root only)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000):             # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), f"setns into {name}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


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
            _signal(pid, sig)
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


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


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
