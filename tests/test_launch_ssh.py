"""Programs launched over SSH on the namespace test hosts."""

from __future__ import annotations

import logging
import re

import pytest

from tlaunch import lp_ssh
from tlaunch.ssh import connect_all

pytestmark = pytest.mark.ssh


class Worker:
    """The seed README's worker (with its stray ``i`` replaced by the worker id)."""

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id

    def run(self) -> None:
        logging.info("Worker %d on %s", self.worker_id, lp_ssh.get_context().host)
        lp_ssh.stop()


class Producer:
    def work(self, x: int) -> tuple[int, str]:
        return x * 2, lp_ssh.get_context().host

    def echo(self, x: object) -> object:
        return x


def test_seed_worker_example(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    program = lp_ssh.Program("worker")
    current_num = 0
    for host in ["th1", "th2"]:
        for _ in range(2):
            ssh_node = lp_ssh.SSHNode(Worker, current_num).to_host(host)
            current_num += 1
            program.add_node(ssh_node, label=host + "_worker")
    run = lp_ssh.launch(program, terminal="ssh_tmux_session", ssh_config=ssh_hosts.ssh_config)
    states = {k: v["state"] for k, v in run.status().items()}
    assert "done" in states.values() and set(states.values()) <= {"done", "stopped"}
    assert {v["host"] for v in run.status().values()} == {"th1", "th2"}
    assert ssh_hosts.leftovers(run.run_id) == {}


def test_rpc_across_three_hosts(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    program = lp_ssh.Program("producers")
    with program.group("producer"):
        handles = [program.add_node(lp_ssh.CourierNode(Producer).to_host(f"th{i}")) for i in (1, 2, 3)]
    with lp_ssh.launch(program, wait=False, ssh_config=ssh_hosts.ssh_config) as run:
        assert run.wait_ready(["producer"], timeout=60)  # one long poll, answered once all serve
        assert all(rec["address"] for rec in run.status().values()), run.status()
        futures = [h.dereference().futures.work(i) for i, h in enumerate(handles)]
        assert [f.result(30) for f in futures] == [(0, "th1"), (2, "th2"), (4, "th3")]
    assert ssh_hosts.leftovers(run.run_id) == {}


def test_a_call_to_a_node_on_another_host_does_not_greet(ssh_hosts, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The greeting, a round trip, asks a server that may be on this host for sealed memory
    files; the launcher's connection to a node on another host skips it, and a large array
    still arrives whole (over TLS)."""
    import numpy as np

    from tlaunch.rpc import framing, wire

    kinds: list[int] = []
    real = framing.Connection.send

    def send(self: framing.Connection, kind: int, req_id: int, buffers: list[object]) -> None:
        kinds.append(kind)
        real(self, kind, req_id, buffers)  # type: ignore[arg-type]

    monkeypatch.setattr(framing.Connection, "send", send)
    program = lp_ssh.Program("far")
    handle = program.add_node(lp_ssh.CourierNode(Producer).to_host("th1"), label="producer")
    with lp_ssh.launch(program, wait=False, ssh_config=ssh_hosts.ssh_config) as run:
        big = np.arange(1 << 18, dtype=np.int64)  # 2 MiB: sealed memory files between processes of one host
        assert np.array_equal(handle.dereference().echo(big), big)
    assert wire.REQUEST in kinds and wire.HELLO not in kinds
    assert ssh_hosts.leftovers(run.run_id) == {}


def test_preflight_reports_every_host(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    program = lp_ssh.Program("pre")
    program.add_node(lp_ssh.PyNode(print).to_host("th1"), label="a")
    program.add_node(lp_ssh.PyNode(print).to_host("th2"), label="b")
    with pytest.raises(lp_ssh.TLaunchError) as info:
        lp_ssh.launch(program, ssh_config=ssh_hosts.ssh_config, python="/nonexistent/python3")
    assert "th1" in str(info.value) and "th2" in str(info.value)
    assert "cannot import tlaunch" in str(info.value)


class Talker:
    def __init__(self, word: str) -> None:
        self.word = word

    def run(self) -> None:
        print(f"says {self.word}", flush=True)
        lp_ssh.wait_for_stop()


def test_ps_logs_stop_over_ssh(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys
    import time

    program = lp_ssh.Program("talkers")
    program.add_node(lp_ssh.PyClassNode(Talker, "hello").to_host("th1"), label="talker")
    program.add_node(lp_ssh.PyClassNode(Talker, "world").to_host("th2"), label="talker")
    run = lp_ssh.launch(program, wait=False, ssh_config=ssh_hosts.ssh_config)
    try:

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "tlaunch.cli.main", *args],
                env=dict(os.environ),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )

        deadline = time.monotonic() + 20
        while "world" not in (out := cli("logs", run.run_id).stdout):
            assert time.monotonic() < deadline, out
            time.sleep(0.2)
        assert "[th1 talker_0] says hello" in out and "[th2 talker_1] says world" in out
        nodes = cli("ps", run.run_id).stdout
        assert "talker/0" in nodes and "th2" in nodes and "running" in nodes
        stopper = subprocess.Popen(
            [sys.executable, "-m", "tlaunch.cli.main", "stop", run.run_id],
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            assert run.wait(30)
            assert stopper.wait(30) == 0, stopper.communicate()[0]
        finally:
            if stopper.poll() is None:
                stopper.kill()
            stopper.communicate()  # (closes its pipe)
    finally:
        run.stop()
    assert ssh_hosts.leftovers(run.run_id) == {}


def _report(out: str) -> None:
    ctx = lp_ssh.get_context()
    print(f"label={ctx.label!r} index={ctx.index}", flush=True)


def test_hostile_labels_execute_nothing(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    hostile = ["a'; touch pwned; echo '", "two words", "$(touch pwned2)", "`touch pwned3`"]
    program = lp_ssh.Program("hostile $(id)")
    for label in hostile:
        program.add_node(lp_ssh.PyNode(_report, "x").to_host("th1"), label=label)
    run = lp_ssh.launch(program, ssh_config=ssh_hosts.ssh_config)
    status = run.status()
    assert [status[f"{label}/0"]["state"] for label in hostile] == ["done"] * 4
    conns = connect_all(["th1"], ssh_config=ssh_hosts.ssh_config)
    try:
        check = conns["th1"].run(["sh", "-c", "ls ~/pwned* /tmp/pwned* 2>/dev/null | wc -l"])
        assert check.stdout.strip() == "0"
        logs = conns["th1"].run(["sh", "-c", f"cat ~/.tlaunch/runs/{run.run_id}/logs/*.log"]).stdout
        for label in hostile:
            assert f"label={label!r} index=0" in logs
    finally:
        conns["th1"].close()
    assert ssh_hosts.leftovers(run.run_id) == {}


def test_demo_runs_on_test_hosts(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.main", "demo", "--hosts", "2", "--producers", "4"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[th1 consumer/0] producer/1 on th2: work(1) = 1" in out.stdout
    assert "[th1 consumer/0] producer/3 on th2: work(3) = 9" in out.stdout


def test_seed_worker_example_verbatim(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    """The seed README's program as written, only host names changed, run as a script.

    It runs on both hosts; its ``Worker.run`` reads a name ``i`` that the seed never
    defines, so the run fails with that NameError, named with node, host and traceback.
    """
    import os
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "seed", "worker.py")
    env = {**os.environ, "TLAUNCH_SSH_CONFIG": ssh_hosts.ssh_config}
    out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    err = out.stderr
    assert re.search(r"RunFailedError: node 'th[12]_worker/\d' on host 'th[12]'", err), err
    assert "NameError: name 'i' is not defined" in err
    assert "logging.info('Worker {}:{}'.format(self.worker_id, i))" in err  # the remote traceback
    from tlaunch.launcher import runs_dir

    (run_id,) = os.listdir(runs_dir())
    assert ssh_hosts.leftovers(run_id) == {}


SSH_FLAGS = """
import socket
from absl import app, flags
{IMPORT}

NUM = flags.DEFINE_integer("num", 1, "a flag of the user's program")
FLAGS = flags.FLAGS


class Reader:
    def run(self):
        print(f"num={FLAGS.num} on {lp.get_context().host} lp={FLAGS.lp_launch_type}", flush=True)


def main(_):
    p = lp.Program("flags")
    with p.group("reader"):
        for host in ("th1", "th2"):
            p.add_node(lp.PyClassNode(Reader).to_host(host))
    lp.launch(p, launch_type="ssh")


if __name__ == "__main__":
    app.run(main)
"""


@pytest.mark.parametrize("route", ["import", "alias"])
def test_launchers_flags_reach_nodes_on_other_hosts(ssh_hosts, tmp_path, route: str) -> None:  # type: ignore[no-untyped-def]
    """A Launchpad program's absl flags, as parsed by the launcher, hold in nodes on other hosts."""
    import os
    import subprocess
    import sys

    imports = {"import": "from tlaunch import lp_ssh as lp", "alias": "import launchpad as lp"}
    script = tmp_path / "flags_ssh.py"
    script.write_text(SSH_FLAGS.replace("{IMPORT}", imports[route]))
    alias = ["-m", "tlaunch.compat"] if route == "alias" else []
    env = {**os.environ, "TLAUNCH_SSH_CONFIG": ssh_hosts.ssh_config}
    out = subprocess.run(
        [sys.executable, *alias, str(script), "--num=7"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for i, host in enumerate(("th1", "th2")):
        assert f"[{host} reader/{i}] num=7 on {host} lp=" in out.stdout, out.stdout


def test_hosts_whose_head_reads_ahead_start_by_exec(ssh_hosts, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A host whose ``head -c`` is not GNU's (BusyBox's reads ahead) cannot take the start on
    its held preflight shell's stdin: it gets an exec of its own, and the run is the same."""
    from tlaunch.backends.ssh import preflight
    from tlaunch.ssh import Connection

    assert 'hd="head 0"' in preflight.PREFLIGHT
    monkeypatch.setattr(preflight, "PREFLIGHT", preflight.PREFLIGHT.replace('hd="head 0"', 'hd="head 1"'))
    # What the hosts remember is not read (nor written: the folder does not exist), so head is asked.
    monkeypatch.setattr(preflight, "probe_cache", lambda python, path: ".tlaunch/none/probe")
    started: list[str] = []
    real_run = Connection.run

    def run(self: Connection, argv: list[str], *args: object, **kwargs: object) -> object:
        if any("tar -x" in a for a in argv):
            started.append(self.host)
        return real_run(self, argv, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Connection, "run", run)
    program = lp_ssh.Program("by-exec")
    with program.group("producer"):
        handles = [program.add_node(lp_ssh.CourierNode(Producer).to_host(f"th{i}")) for i in (1, 2)]
    with lp_ssh.launch(program, wait=False, ssh_config=ssh_hosts.ssh_config) as run_:
        assert [h.dereference().work(i) for i, h in enumerate(handles)] == [(0, "th1"), (2, "th2")]
    assert sorted(started) == ["th1", "th2"]
    assert ssh_hosts.leftovers(run_.run_id) == {}


def test_the_wait_for_the_heads_address_wakes_on_its_line(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    """The launcher's wait on the head's host for ``coordinator.addr`` sleeps on the FIFO the
    head writes a line to once the file is written, not on a poll of the file: it answers at
    that line, says within a second that the head's session ended, leaves no process behind,
    and where the FIFO is missing polls the file as it did before."""
    import os
    import threading
    import time
    from pathlib import Path

    from tlaunch.backends.ssh.hostside import head_address
    from tlaunch.errors import LaunchError
    from tlaunch.runtime.head import WAKE, _wake
    from tlaunch.ssh import connect_all

    conn = connect_all(["th1"], ssh_config=ssh_hosts.ssh_config)["th1"]
    run_dir, session = ".tlaunch/runs/wake-test", "tlaunch-wake-test"
    here = Path(ssh_hosts.hosts[0].home) / run_dir  # th1's home, seen from here
    addr, wake = here / "coordinator.addr", here / WAKE
    said = '{"address": "198.18.0.9:5", "pid": 1}'

    def waiting() -> tuple[threading.Thread, dict[str, object]]:
        got: dict[str, object] = {}

        def wait() -> None:
            try:
                got["said"] = head_address(conn, run_dir, session)
            except LaunchError as exc:
                got["error"] = exc
            got["at"] = time.monotonic()

        thread = threading.Thread(target=wait)
        thread.start()
        return thread, got

    def sleeps() -> list[str]:  # th1's own (its ps lists every process of this machine)
        return [args for args in ssh_hosts.processes("th1").values() if args.startswith("sleep 0.")]

    try:
        (here / "logs").mkdir(parents=True)
        conn.run(["tmux", "new-session", "-d", "-s", session, "sleep 600"])
        os.mkfifo(wake, 0o600)
        thread, got = waiting()
        time.sleep(1.0)
        addr.write_text(said)  # as the head does, but no line yet: the wait goes on
        time.sleep(1.5)
        assert thread.is_alive(), got
        written = time.monotonic()
        _wake(str(wake))  # the head's line
        thread.join(10)
        assert got["said"] == said, got
        assert float(got["at"]) - written < 5.0  # type: ignore[arg-type]
        assert sleeps() == []

        addr.unlink()  # the session ends before the head wrote anything
        thread, got = waiting()
        time.sleep(1.0)
        conn.run(["tmux", "kill-session", "-t", f"={session}"])
        ended = time.monotonic()
        thread.join(10)
        assert isinstance(got.get("error"), LaunchError), got
        assert float(got["at"]) - ended < 3.0  # type: ignore[arg-type]
        assert sleeps() == []

        wake.unlink()  # no FIFO (a tar that cannot make one): the file is polled
        conn.run(["tmux", "new-session", "-d", "-s", session, "sleep 600"])
        thread, got = waiting()
        time.sleep(0.5)
        addr.write_text(said)
        thread.join(10)
        assert got["said"] == said, got
    finally:
        conn.run(["tmux", "kill-session", "-t", f"={session}"], check=False)
        conn.run(["rm", "-rf", run_dir], check=False)
        conn.close()


def test_the_head_writes_its_line_only_to_a_fifo_someone_reads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``_wake``: nothing there, a FIFO nobody reads, or a plain file: no error, nothing
    written; a FIFO with a reader: one line."""
    import os

    from tlaunch.runtime.head import _wake

    _wake(str(tmp_path / "none"))
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    _wake(str(plain))
    assert plain.read_bytes() == b""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    _wake(str(fifo))  # no reader: ENXIO, ignored
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        _wake(str(fifo))
        assert os.read(fd, 16) == b"\n"
    finally:
        os.close(fd)
