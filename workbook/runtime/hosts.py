"""Where a torchrun node runs: this machine, or a Linux network namespace that acts as a host.

A ``Host`` names what a node's agent needs: the address the other nodes reach it at, the
interface its ranks' gloo listens on, and the network namespace it runs in (None: this
machine, several "nodes" on 127.0.0.1, what ``workbook run --nnodes`` does).

``NetnsPair`` makes two hosts out of one machine (root only): two network namespaces, each
with its own network stack, joined by a virtual cable (a veth pair) with one address at each
end, on a /24 that no interface here uses: two machines as far as torchrun, c10d and gloo can
tell (the package's multi-node test). A process is put into a namespace by
``ip netns exec NS`` (``Host.prefix``); a thread of this process by ``enter_netns``
(``setns(2)``: the launcher's rendezvous store, ``workbook.runtime.rendezvous``).
"""
from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass


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


def send_signal(pid: int, sig: int) -> None:
    """``os.kill``, quiet when the process is gone already or not ours."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


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
                send_signal(pid, signal.SIGKILL)
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


def enter_netns(name: str) -> None:
    """Move the calling thread into network namespace ``name`` (``ip netns``'s, root only); the
    process's other threads stay where they are."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000):             # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), f"setns into {name}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)
