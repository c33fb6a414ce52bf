"""Several torchrun nodes, for real (``workbook/runtime/multinode.py``; the hosts:
``workbook/runtime/hosts.py``; the launcher's rendezvous store: ``workbook/runtime/rendezvous.py``).

Two hosts are two Linux network namespaces joined by a veth pair (addresses inside them only;
nothing else is contacted). One torchrun agent per host (``--nnodes=2 --nproc_per_node=2``,
c10d rendezvous at host 0, its store served by the launcher, this process) runs:

* the probe: every rank says where it ran (ranks 0-1 in one namespace, 2-3 in the other, gloo
  on each host's own address); then rank 3 raises and every rank holds rank 3's own error, rank
  0 says it; then, in a fresh process group, every rank all-reduces in a loop and host 1 is
  killed: host 0 ends within its check's timeout, naming the silent ranks (the path of a job
  that hangs: exit 2);
* the tp self-check, on a simulated multi-node link (dgx-h100-ib), its figures traced: every
  check passes across the two hosts (the path of a job that passes: exit 0), rank 0 alone
  speaks, and four rank traces merge into one.

After each run no process is left in either namespace, and the namespaces are deleted at the
end whatever happens. These tests need root (they skip, saying why, where namespaces are not
allowed). ``workbook run --nnodes 2 --nproc-per-node 2`` (two nodes on 127.0.0.1) needs
nothing and is checked too, on a stub (the command's own path: its verdict, its output; the
path of a job that fails: exit 1, both agents exit 1).

Three torchrun jobs in all; each job costs 15-35 s of two agents and four ranks starting (a
collectives self-check on two hosts, a passing ``workbook run`` on two local nodes and the
probe's failing rank on a job of its own were jobs of their own: their checks are in the tp
job, the stub's job and the hang job).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from workbook.runtime.hosts import NetnsPair
from workbook.runtime.multinode import job_exit_code, run_nodes

from processes import left_running

ROOT = Path(__file__).resolve().parents[2]
RUN_S = 100                              # a run's hard limit: run_nodes stops it past that


def _netns_unavailable() -> str | None:
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "creating network namespaces (ip netns add) needs root"
    if not shutil.which("ip"):
        return "needs the ip command (iproute2)"
    return None


@pytest.fixture(scope="module")
def pair():
    reason = _netns_unavailable()
    if reason:
        pytest.skip(reason)
    pair = NetnsPair()
    try:
        pair.__enter__()
    except OSError as exc:
        if "Operation not permitted" in str(exc) or "Permission denied" in str(exc):
            pytest.skip(f"this machine does not allow network namespaces: {exc}")
        raise
    try:
        yield pair
    finally:
        pair.close()
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not set(pair.names) & set(listed.split()), listed


def _run(pair, command: list[str], **kw):
    nodes = run_nodes(command, pair.hosts, 2, timeout=RUN_S, env={"PYTHONPATH": str(ROOT)}, **kw)
    left = pair.pids(0) + pair.pids(1)
    ps = subprocess.run(["ps", "-o", "pid,stat,args", "-p", ",".join(map(str, left or [0]))],
                        capture_output=True, text=True).stdout
    assert not left, f"processes left in the namespaces:\n{ps}"
    return nodes


def _probe_records(out: str) -> list[dict]:
    """Rank 0's ``PROBE [...]`` line (another process's warning may share its start)."""
    found = re.search(r"PROBE (\[\{.*\}\])$", out, re.M)
    assert found, out
    return json.loads(found.group(1))


def _netns_id(name: str) -> str:
    return f"net:[{os.stat(f'/run/netns/{name}').st_ino}]"     # what /proc/PID/ns/net names


def test_tp_self_check_on_a_multinode_link_traced_on_two_hosts(pair, tmp_path):
    """The tp self-check on two hosts, on a simulated multi-node link: every check passes, the
    job's status is 0, rank 0 alone speaks; its figures traced: four rank traces (two per host)
    merge into one."""
    from workbook.trace.merge import merge
    traces = tmp_path / "traces"
    nodes = _run(pair, [str(ROOT / "solutions" / "tp.py"), "--link", "dgx-h100-ib",
                        "--trace-dir", str(traces)])
    out = nodes[0].output
    assert [n.returncode for n in nodes] == [0, 0], out + nodes[1].output
    assert job_exit_code(nodes) == 0                       # what `workbook run --nnodes` returns
    assert re.search(r"tp: (\d+) of \1 checks passed.*exit 0", out), out
    assert "tp figures: one TP block on 4 ranks" in out and "dgx-h100-ib" in out, out
    assert "PASSED" not in nodes[1].output and "checks passed" not in nodes[1].output  # rank 0 speaks
    assert sorted(p.name for p in traces.glob("rank*.trace.json*")) == \
        [f"rank{r}.trace.json" for r in range(4)]
    assert json.loads((traces / "run.json").read_text())["world_size"] == 4
    assert f"trace report: {traces / 'report.html'}" in out and (traces / "report.html").stat().st_size
    events = json.loads(merge(traces, tmp_path / "merged.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {r: f"rank {r}" for r in range(4)}, names
    assert {e["pid"] for e in events if e.get("ph") == "X"} == {0, 1, 2, 3}   # each rank's spans


def test_ranks_on_two_hosts_a_ranks_error_then_a_host_killed(pair):
    """The probe on two hosts: where every rank ran; rank 3's error held by every rank (rank 0
    says it); then every rank all-reduces in a loop and host 1 dies (every process in its
    namespace killed): host 0's ranks end at the watchdog (4 s), rank 0 names ranks 2 and 3,
    exit status 2."""
    started, killed = threading.Event(), []

    def kill_host_1():
        if started.wait(RUN_S):
            time.sleep(0.5)                                  # inside the all-reduce loop
            pair.kill(1)
            killed.append(time.monotonic())

    killer = threading.Thread(target=kill_host_1, daemon=True)
    killer.start()
    nodes = _run(pair, ["-m", "workbook.grading.multinode_probe", "--fail-rank", "3", "--hold",
                        "--timeout", "4"],
                 echo=lambda i, line: "PROBE HOLDING" in line and started.set())
    ended = time.monotonic()
    killer.join(timeout=15)
    out = nodes[0].output
    records = _probe_records(out + nodes[1].output)
    assert [int(r["rank"]) for r in records] == [0, 1, 2, 3]
    for rank, r in enumerate(records):
        host = pair.hosts[rank // 2]
        assert (int(r["local_rank"]), int(r["group_rank"]), int(r["local_world_size"])) == \
            (rank % 2, rank // 2, 2), r
        assert r["netns"] == _netns_id(host.netns), r                # ranks 0-1 host 0, 2-3 host 1
        assert r["gloo_ifname"] == host.ifname and r["gloo_addr"] == host.address, r
        assert r["master_addr"] == pair.hosts[0].address, r          # node 0's agent: the store
        assert r["all_reduce"] == 1 + 2 + 3 + 4, r                   # gloo crossed the cable
        assert r["link_ranks_per_node"] == 2, r                      # the link knows the nodes
        assert r["link_fabrics"] == ["node", "network"], r           # hierarchical all-reduce
    assert records[0]["netns"] != records[2]["netns"] != os.readlink("/proc/self/ns/net")
    # then rank 3 raised: every rank holds its error, rank 0 (on the other host) says it
    assert "PROBE FAILED RuntimeError: rank 3 fails on purpose" in out, out
    assert "(raised on rank 3 of 4)" in out, out
    # then host 1 died in the all-reduce loop: host 0 ends at the watchdog, naming ranks 2, 3
    assert killed, out
    assert ended - killed[0] < 4 + 5 + 15, f"host 0 took {ended - killed[0]:.0f} s"
    assert nodes[1].returncode == -9, nodes[1].returncode           # host 1 was killed
    assert "HANG" in out and "ranks 2, 3 did not answer" in out, out
    assert "rank 0: " in out and "rank 2: " in out, out                # every rank's line
    assert job_exit_code(nodes) == 2, out


# --------------------------------------------------------------------------- workbook run (no root)
def test_workbook_run_on_two_local_nodes(tmp_path):
    """``workbook run LAB --nnodes 2 --nproc-per-node 2`` on a stub: exit 1 (the job's verdict,
    not torchrun's 1), both agents end with 1, the verdict without the agents' tracebacks, and
    no process is left (the rendezvous store is the command's own thread: it ends with it).
    (A passing job's status 0 is ``job_exit_code``'s, asserted by the tp job on two hosts: the
    command returns it as it is.)"""
    (tmp_path / "stub").mkdir()
    shutil.copy(ROOT / "labs" / "collectives.py", tmp_path / "stub")
    proc = subprocess.run(
        [sys.executable, "-m", "workbook.cli", "run", "collectives", "--impl",
         str(tmp_path / "stub"), "--nnodes", "2", "--nproc-per-node", "2"], cwd=ROOT,
        capture_output=True, text=True, timeout=RUN_S)
    code, out = proc.returncode, proc.stdout + proc.stderr
    assert code == 1, out
    assert "not implemented yet" in out and "job of 2 nodes: exit 1" in out, out
    assert "local rank 0 exited with 1" in out and "Traceback" not in out, out
    assert "(torchrun agents' exit status: node 0 1, node 1 1)" in out, out   # both end with 1
    assert not left_running(str(tmp_path)), left_running(str(tmp_path))


def test_the_rendezvous_store_serves_until_its_launcher_stops_it():
    """The store is the launcher's (a thread of it), so it outlives every agent: an agent that
    closes the rendezvous last still finds it (run 4's failure: the serving agent had left
    first). Stopped, it no longer listens; a port that is taken is said in one line."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    from workbook.runtime.hosts import Host, free_port
    from workbook.runtime.rendezvous import RendezvousStore
    port = free_port()
    store = RendezvousStore(Host("here"), port)
    client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    client.set("left", "node 0")
    assert client.get("left") == b"node 0"
    del client
    store.stop()
    assert not store._thread.is_alive()
    with pytest.raises(ConnectionRefusedError):                       # the port is closed
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with pytest.raises(OSError, match="cannot serve port"):         # a port that is taken
        with socket.socket() as taken:
            taken.bind(("0.0.0.0", 0)), taken.listen()
            RendezvousStore(Host("here"), taken.getsockname()[1])


@pytest.mark.parametrize("options, message", [
    (["--nnodes", "2"], "--nnodes 2 needs --nproc-per-node"),
    (["--nnodes", "2", "--nproc", "3"], "3 ranks do not split into 2 nodes"),
    (["--nnodes", "0", "--nproc-per-node", "2"], "--nnodes must be a whole number, at least 1, got 0"),
    (["--nnodes", "2", "--nproc-per-node", "0"], "--nproc-per-node must be a whole number, at least 1"),
    (["--nnodes", "2", "--nproc-per-node", "2", "--nproc", "3"],
     "--nproc 3 disagrees with --nnodes 2 x --nproc-per-node 2 = 4 ranks"),
    (["--nnodes", "2", "--nproc-per-node", "2", "--impl", "/no/such/folder"], "--impl must be"),
])
def test_bad_node_options_get_one_line_and_exit_2(options, message, capsys):
    from workbook.cli import main
    assert main(["run", "collectives", *options]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
