"""Local launches: every launch type and terminal, failures, stop, Ctrl-C, leftovers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from programs import Looper, Producer, Stubborn, consumer_producers

from tlaunch import lp_ssh as lp
from tlaunch.errors import LaunchError, PicklingError, RunFailedError
from tlaunch.testing import assert_no_leftovers, pid_alive

CASES = [
    ("local_mp", "current_terminal"),
    ("local_mp", "output_to_files"),
    ("local_mp", "tmux_session"),
    ("local_mt", None),
    ("test_mt", None),
    (lp.LaunchType.LOCAL_MULTI_PROCESSING, None),
]


@pytest.mark.parametrize(("launch_type", "terminal"), CASES)
def test_consumer_producers(tmp_path: Path, launch_type: str, terminal: str | None) -> None:
    out = tmp_path / "results"
    # local_mt and the test types return at once unless told to wait (Launchpad's default).
    run = lp.launch(consumer_producers(str(out), n=4), launch_type=launch_type, terminal=terminal, wait=True)
    assert out.read_text() == repr([0, 2, 4, 6])
    status = run.status()
    assert status["consumer/0"]["state"] == "done"
    assert {status[f"producer/{i}"]["state"] for i in range(4)} <= {"stopped", "done"}
    assert_no_leftovers(run)
    if launch_type == "local_mp" and terminal != "current_terminal":
        logs = sorted(os.listdir(run.log_dir))
        assert logs == ["consumer_0.log"] + [f"producer_{i}.log" for i in range(4)]


def test_current_terminal_prefixes_output(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(
        textwrap.dedent("""
        from tlaunch import lp_ssh as lp

        def hello(i):
            print(f"hello from {i}")

        if __name__ == "__main__":
            p = lp.Program("hello")
            with p.group("greeter"):
                for i in range(2):
                    p.add_node(lp.PyNode(hello, i))
            lp.launch(p)
    """)
    )
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert out.returncode == 0, out.stderr
    assert "[greeter/0] hello from 0" in out.stdout
    assert "[greeter/1] hello from 1" in out.stdout


@pytest.mark.parametrize("launch_type", ["local_mp", "test_mt"])
def test_raising_node_fails_the_run(launch_type: str) -> None:
    def explode() -> None:
        raise ValueError("node exploded")

    p = lp.Program("fail")
    p.add_node(lp.PyNode(explode), label="bad")
    p.add_node(lp.CourierNode(Producer), label="server")
    with pytest.raises(RunFailedError) as info:
        lp.launch(p, launch_type=launch_type, terminal=None, wait=True)
    err = info.value
    assert err.node == "bad/0"
    assert err.host == "localhost"
    assert err.exit_code == 1
    assert "ValueError: node exploded" in (err.remote_traceback or "")
    assert "in explode" in str(err)
    if launch_type == "test_mt":
        assert isinstance(err.__cause__, ValueError)


class Exploding:
    def __init__(self) -> None:
        time.sleep(0.2)
        raise ValueError("node exploded")


@pytest.mark.parametrize("launch_type", ["local_mp", "test_mt"])
def test_waiting_until_every_node_is_up(launch_type: str) -> None:
    """``Run.wait_ready``: servers registered, a node that runs (or is done already) counts;
    a group's name that is not one is refused with the groups there are; a node that fails
    first is raised."""

    def brief() -> None:
        time.sleep(0.2)

    p = lp.Program("ready")
    p.add_node(lp.CourierNode(Producer), label="server")
    p.add_node(lp.CourierNode(Producer), label="server")
    p.add_node(lp.PyNode(brief), label="brief")
    with lp.launch(p, launch_type=launch_type, terminal=None, wait=False) as run:
        with pytest.raises(LaunchError, match=r"no groups \['nope'\]; its groups: \['brief', 'server'\]"):
            run.wait_ready(["nope"])
        assert run.wait_ready(timeout=60)
        status = run.status()
        assert status["server/0"]["address"] and status["server/1"]["address"], status
        assert status["brief/0"]["state"] in ("running", "done"), status
        assert run.wait_ready("server", timeout=0)
    assert_no_leftovers(run)

    p = lp.Program("never-ready")
    p.add_node(lp.CourierNode(Producer), label="server")
    p.add_node(lp.CourierNode(Exploding), label="bad")  # its server never comes up
    run = lp.launch(p, launch_type=launch_type, terminal=None, wait=False)
    try:
        with pytest.raises(RunFailedError, match="node exploded"):
            run.wait_ready(timeout=60)
    finally:
        run.stop()
    assert_no_leftovers(run)


def test_handles_in_the_launcher_and_big_arrays() -> None:
    p = lp.Program("bulk")
    h = p.add_node(lp.CourierNode(Producer), label="server")
    with lp.launch(p, wait=False) as run:
        client = h.dereference()
        a = np.random.default_rng(1).integers(0, 255, size=256 << 20, dtype=np.uint8)  # 256 MiB
        b = client.echo(a)
        assert b.shape == a.shape and np.array_equal(a, b)
        del a, b
        assert client.whoami() == ("server", 0, run.run_id)
        with pytest.raises(lp.RemoteError, match="KeyError") as info:
            client.fail()
        assert "no such item" in info.value.remote_traceback
        assert run.status()["server/0"]["state"] == "serving"
        assert not run.wait(timeout=0.2)  # a server alone never finishes
    assert_no_leftovers(run)


def test_the_launchers_handles_connect_as_their_nodes_register() -> None:
    """Handles dereferenced in the launcher connect as soon as their nodes register (the
    coordinator, in the launcher's process, tells it): calling one node after another finds
    the later ones connected, not one TLS handshake after another. Once the launcher has
    asked for one, the nodes that register next are connected to whether it asked or not
    (a few: the next test), so a handle dereferenced late finds its connection made."""
    p = lp.Program("ahead")
    handles = [p.add_node(lp.CourierNode(Producer), label=f"p{i}") for i in range(3)]
    with lp.launch(p, wait=False) as run:
        early = [h.dereference() for h in handles[:2]]
        deadline = time.monotonic() + 30
        while not all(rec["address"] for rec in run.status().values()):
            assert time.monotonic() < deadline, run.status()
            time.sleep(0.01)
        late = handles[2].dereference()
        while not all(c._pool.idle for c in [*early, late]):  # opened by the launcher, no call made
            assert time.monotonic() < deadline, "no connection opened ahead"
            time.sleep(0.01)
        assert [c.work(i) for i, c in enumerate([*early, late])] == [0, 2, 4]
        assert all(len(c._pool.idle) == 1 for c in [*early, late])  # each call took the one connection
    assert_no_leftovers(run)


def test_the_launcher_connects_ahead_to_a_few_nodes_not_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes the launcher has not asked for are connected to as they register, once it has
    asked for one, up to ``AHEAD_UNASKED`` of them: a launcher that calls one node of many
    pays a few connections, not one a node. The others connect at their first call."""
    from tlaunch.runtime import node_runtime

    monkeypatch.setattr(node_runtime, "AHEAD_UNASKED", 2)
    p = lp.Program("unasked")
    handles = [p.add_node(lp.CourierNode(Producer), label=f"p{i}") for i in range(5)]
    with lp.launch(p, wait=False) as run:
        first = handles[0].dereference()
        deadline = time.monotonic() + 30
        while not all(rec["address"] for rec in run.status().values()):
            assert time.monotonic() < deadline, run.status()
            time.sleep(0.01)
        later = [h.dereference() for h in handles[1:]]
        while not first._pool.idle or sum(bool(c._pool.idle) for c in later) < 2:
            assert time.monotonic() < deadline, "no connection opened ahead"
            time.sleep(0.01)
        time.sleep(0.2)
        assert sum(bool(c._pool.idle) for c in later) == 2
        assert [c.work(i) for i, c in enumerate([first, *later])] == [0, 2, 4, 6, 8]
        assert all(len(c._pool.idle) == 1 for c in [first, *later])
    assert_no_leftovers(run)


def test_stop_tears_down_stubborn_nodes(tmp_path: Path) -> None:
    p = lp.Program("stubborn")
    p.add_node(lp.PyClassNode(Stubborn, str(tmp_path)), label="stubborn")
    p.add_node(lp.PyClassNode(Looper, str(tmp_path)), label="looper")
    run = lp.launch(p, wait=False, stop_grace=0.5)
    pid_file = tmp_path / "stubborn.pid"
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and (tmp_path / "looper_0.pid").exists()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    t0 = time.monotonic()
    run.stop()
    assert time.monotonic() - t0 < 5
    assert not pid_alive(int(pid_file.read_text()))
    assert run.status()["looper/0"]["state"] in ("done", "stopped")
    assert_no_leftovers(run)
    run.stop()  # idempotent


def test_stop_handlers_context_and_colocation(tmp_path: Path) -> None:
    out = tmp_path / "out"

    class Node:
        def __init__(self, peer: object) -> None:
            self.peer = peer

        def run(self) -> None:
            seen: list[str] = []
            lp.register_stop_handler(lambda: seen.append("stopped"))
            ctx = lp.get_context()
            value = self.peer.work(21)  # type: ignore[attr-defined]
            lp.stop()
            assert lp.wait_for_stop(5)
            assert lp.stop_event().is_set()
            out.write_text(f"{ctx.label}/{ctx.index} {value} {seen}")

    p = lp.Program("coloc")
    srv = lp.CourierNode(Producer)
    handle = srv.create_handle()
    p.add_node(lp.MultiThreadingColocation([srv, lp.PyClassNode(Node, handle)]), label="pair")
    run = lp.launch(p, launch_type="local_mp")
    assert out.read_text() == "pair/0 42 ['stopped']"
    assert_no_leftovers(run)


class TempUser:
    """Leaves a temporary file behind: ends normally, or killed by SIGKILL (no clean-up of its own)."""

    def __init__(self, out: str, kill: bool) -> None:
        self.out, self.kill = out, kill

    def run(self) -> None:
        import tempfile

        fd, path = tempfile.mkstemp()
        os.write(fd, b"scratch")
        folder = tempfile.gettempdir()
        with open(os.path.join(self.out, f"{lp.get_context().label}.tmp"), "w") as f:
            f.write(f"{folder} {os.environ['TMPDIR']} {oct(os.stat(folder).st_mode & 0o777)} {path}")
        if self.kill:
            time.sleep(0.5)  # the other node writes its file too
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(30)


@pytest.mark.parametrize("terminal", ["current_terminal", "tmux_session"])  # a thread, a supervisor
def test_each_node_has_a_tmpdir_of_its_own_that_goes_with_it(tmp_path: Path, terminal: str) -> None:
    import tempfile

    p = lp.Program("temps")
    p.add_node(lp.PyClassNode(TempUser, str(tmp_path), False), label="quiet")
    p.add_node(lp.PyClassNode(TempUser, str(tmp_path), True), label="killed")
    with pytest.raises(RunFailedError):
        lp.launch(p, launch_type="local_mp", terminal=terminal, stop_grace=0.5)
    seen = {f.stem: f.read_text().split() for f in tmp_path.glob("*.tmp")}
    assert sorted(seen) == ["killed", "quiet"]
    folders = {label: folder for label, (folder, env, mode, path) in seen.items()}
    assert folders["killed"] != folders["quiet"]
    for folder, env, mode, path in seen.values():
        assert folder == env and os.path.dirname(folder) == tempfile.gettempdir(), (folder, env)
        assert mode == "0o700" and path.startswith(folder + os.sep)
        assert not os.path.exists(folder), f"{folder} outlived its node"


def test_unpicklable_node_is_named_before_anything_starts() -> None:
    class Holder:
        def __init__(self, lock: object) -> None:
            self.lock = lock

    p = lp.Program("unpicklable")
    p.add_node(lp.PyClassNode(Holder, {"inner": threading.Lock()}), label="holder")
    before = (
        set(os.listdir(os.path.join(os.environ["TLAUNCH_HOME"])))
        if os.path.isdir(os.environ["TLAUNCH_HOME"])
        else set()
    )
    with pytest.raises(PicklingError, match=r"holder/0.*_args\[0\]\['inner'\]"):
        lp.launch(p)
    after = (
        set(os.listdir(os.environ["TLAUNCH_HOME"])) if os.path.isdir(os.environ["TLAUNCH_HOME"]) else set()
    )
    assert after == before


def test_bad_launch_options() -> None:
    p = lp.Program("opts")
    p.add_node(lp.PyNode(print), label="x")
    with pytest.raises(LaunchError, match="launch_type 'nope' is not one of"):
        lp.launch(p, launch_type="nope")
    with pytest.raises(LaunchError, match="terminal 'xterm' is not one of"):
        lp.launch(p, terminal="xterm")
    with pytest.raises(LaunchError, match="needs node processes"):
        lp.launch(p, launch_type="local_mt", terminal="tmux_session")
    p2 = lp.Program("remote")
    p2.add_node(lp.PyNode(print).to_host("th1"), label="x")
    with pytest.raises(LaunchError, match="runs every node on this machine"):
        lp.launch(p2, launch_type="local_mp")


@contextlib.contextmanager
def launcher_script(
    tmp_path: Path, body: str, pid_files: int, stdout: int = subprocess.DEVNULL
) -> Iterator[tuple[subprocess.Popen[bytes], list[int], dict[str, str]]]:
    """Run ``body`` (a launcher's main, with ``lp`` and ``tmp_path`` in scope) in its own process.

    Yields once ``pid_files`` nodes have written their pid; a launcher still running
    afterwards (a failed assertion) gets Ctrl-C, so no run is left behind.
    """
    script = tmp_path / "prog.py"
    script.write_text(
        "from programs import Looper, Producer, Stubborn\n"
        "from tlaunch import lp_ssh as lp\n"
        f"tmp_path = {str(tmp_path)!r}\n"
        "if __name__ == '__main__':\n" + textwrap.indent(textwrap.dedent(body), "    ")
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.path.dirname(__file__)])}
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=stdout, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("*.pid"))) < pid_files:
            assert time.monotonic() < deadline and proc.poll() is None, "the nodes did not start"
            time.sleep(0.05)
        yield proc, [int(f.read_text()) for f in tmp_path.glob("*.pid")], env
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:  # deaf to Ctrl-C: its nodes end with it
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_ctrl_c_stops_everything(tmp_path: Path) -> None:
    body = """
        p = lp.Program("ctrlc")
        with p.group("looper"):
            for _ in range(3):
                p.add_node(lp.PyClassNode(Looper, tmp_path))
        p.add_node(lp.CourierNode(Producer), label="server")
        lp.launch(p)
    """
    with launcher_script(tmp_path, body, pid_files=3, stdout=subprocess.PIPE) as (proc, pids, _):
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
        assert proc.returncode != 0
        assert b"KeyboardInterrupt" in output
    time.sleep(0.2)
    assert not [p for p in pids if pid_alive(p)]
    # the server node too: every child of the launcher is gone (its run's: its id names them)
    (run_id,) = os.listdir(os.path.join(os.environ["TLAUNCH_HOME"], "runs"))
    children = subprocess.run(["pgrep", "-f", f"node_main.*{run_id}"], capture_output=True, text=True).stdout
    assert children.strip() == ""


def test_launcher_killed_leaves_no_orphans(tmp_path: Path) -> None:
    """SIGKILL the launcher: nodes, even one that ignores the stop, end by themselves."""
    body = """
        p = lp.Program("orphans")
        p.add_node(lp.PyClassNode(Looper, tmp_path), label="looper")
        p.add_node(lp.PyClassNode(Stubborn, tmp_path), label="stubborn")
        lp.launch(p, coordinator_timeout=1.0, stop_grace=0.5)
    """
    with launcher_script(tmp_path, body, pid_files=2) as (proc, pids, _):
        proc.kill()
        proc.wait(10)
        t0 = time.monotonic()
        while [p for p in pids if pid_alive(p)] and time.monotonic() - t0 < 20:
            time.sleep(0.1)
        assert not [p for p in pids if pid_alive(p)], "nodes outlived their launcher"
        assert time.monotonic() - t0 < 10  # coordinator_timeout 1 s + slices + stop_grace 0.5 s


def test_ps_logs_stop_from_a_second_process(tmp_path: Path) -> None:
    body = """
        p = lp.Program("watched")
        with p.group("looper"):
            for _ in range(2):
                p.add_node(lp.PyClassNode(Looper, tmp_path))
        p.add_node(lp.CourierNode(Producer), label="server")
        lp.launch(p, terminal="output_to_files")
    """
    with launcher_script(tmp_path, body, pid_files=2) as (launcher, pids, env):

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "tlaunch.cli.main", *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )

        listing = cli("ps")
        assert listing.returncode == 0 and "watched" in listing.stdout and "running" in listing.stdout
        run_id = next(line.split()[1] for line in listing.stdout.splitlines() if "watched-" in line)
        nodes = cli("ps", run_id)
        assert "looper/1" in nodes.stdout and "server/0" in nodes.stdout and "serving" in nodes.stdout
        assert cli("logs", run_id, "server/0").returncode == 0
        assert "no run 'nope'" in cli("stop", "nope").stderr
        stopped = cli("stop", run_id[:-2])  # a unique prefix is enough
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert launcher.wait(30) == 0
        assert not [p for p in pids if pid_alive(p)]
        assert "ended" in cli("ps").stdout


def test_demo_runs_locally() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.main", "demo", "--local", "--producers", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[consumer/0] producer/2 on localhost: work(2) = 4" in out.stdout
