"""An SSH run's life from outside: detach, ps, logs -f, attach, stop; restarts; config options."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tlaunch import lp_ssh
from tlaunch.ssh import connect_all

pytestmark = pytest.mark.ssh


class Ticker:
    """Prints a tick every 0.2 s until the program stops."""

    def run(self) -> None:
        n = 0
        while not lp_ssh.stop_event().wait(0.2):
            print(f"tick {n} on {lp_ssh.get_context().host}", flush=True)
            n += 1


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.main", *args],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _launch_detached(tmp_path: Path, ssh_config: str) -> str:
    """Launch a ticker program from a separate process that detaches and exits; returns the run id."""
    script = tmp_path / "launcher.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from tlaunch import lp_ssh
            from test_ssh_lifecycle import Ticker

            p = lp_ssh.Program("ticks")
            p.add_node(lp_ssh.PyClassNode(Ticker).to_host("th1"), label="ticker")
            p.add_node(lp_ssh.PyClassNode(Ticker).to_host("th2"), label="ticker")
            run = lp_ssh.launch(p, detach=True, ssh_config={ssh_config!r})
            print("RUN", run.run_id, flush=True)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.path.dirname(__file__)])}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("RUN "))


def _attach_and_detach(run_id: str, node: str) -> str:
    """``tlaunch attach`` in a pseudo-terminal: read the pane, then detach with C-b d."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.execvpe(
            sys.executable, [sys.executable, "-m", "tlaunch.cli.main", "attach", run_id, node], os.environ
        )
    seen = b""
    deadline = time.monotonic() + 20
    try:
        while b"tick" not in seen and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    seen += os.read(fd, 65536)
                except OSError:
                    break
        os.write(fd, b"\x02")  # tmux prefix, then d: detach; the run goes on
        time.sleep(0.3)
        os.write(fd, b"d")
        end = time.monotonic() + 10
        while time.monotonic() < end:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.waitstatus_to_exitcode(status) == 0, seen
                break
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    seen += os.read(fd, 65536)
                except OSError:
                    pass
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"tlaunch attach did not return after detaching: {seen!r}")
    finally:
        os.close(fd)
    return seen.decode("utf-8", "replace")


def test_detach_ps_logs_attach_stop_from_other_processes(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run_id = _launch_detached(tmp_path, ssh_hosts.ssh_config)
    follower: subprocess.Popen[str] | None = None
    try:
        # The launcher is gone; the run is not.
        deadline = time.monotonic() + 20
        while (ps := cli("ps", run_id)).stdout.count("│ running") < 2:
            assert time.monotonic() < deadline, ps.stdout + ps.stderr
            time.sleep(0.2)
        assert "ticker/0" in ps.stdout and "th2" in ps.stdout
        follower = subprocess.Popen(
            [sys.executable, "-m", "tlaunch.cli.main", "logs", run_id, "ticker/1", "-f"],
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        screen = _attach_and_detach(run_id, "ticker/0")
        assert "tick" in screen and "on th1" in screen
        assert cli("ps", run_id).stdout.count("│ running") == 2  # detaching the tmux client stopped nothing
        stopped = cli("stop", run_id)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        out, _ = follower.communicate(timeout=30)  # logs -f ends by itself with the run
        assert follower.returncode == 0, out
        lines = [line for line in out.splitlines() if "tick" in line]
        assert lines and all(line.startswith("[th2 ticker_1] tick ") for line in lines), out
        assert "ended" in cli("ps", run_id).stdout
        assert ssh_hosts.leftovers(run_id) == {}
    finally:
        if ssh_hosts.leftovers(run_id):
            cli("stop", run_id)
        if follower is not None and follower.poll() is None:  # (it ends with the run, unless it failed)
            follower.kill()
            follower.communicate()


def test_a_detached_ssh_run_is_followed_and_stopped_through_tlaunch_control(
    ssh_hosts, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The calls the CLI and the job server make, from Python: find, snapshot, logs(follow=True), stop."""
    import threading

    from tlaunch import control
    from tlaunch.control import RunState

    run_id = _launch_detached(tmp_path, ssh_hosts.ssh_config)
    follower: threading.Thread | None = None
    try:
        run = control.find_run(run_id)
        assert run.backend == "ssh"
        deadline = time.monotonic() + 20
        while [n.state for n in run.snapshot().nodes] != ["running", "running"]:
            assert time.monotonic() < deadline, run.snapshot()
            time.sleep(0.2)
        snap = run.snapshot()
        assert snap.state is RunState.RUNNING and set(snap.hosts) == {"th1", "th2"}
        assert {(n.key, n.host) for n in snap.nodes} == {("ticker/0", "th1"), ("ticker/1", "th2")}
        seen: list[str] = []
        follower = threading.Thread(
            target=lambda: seen.extend(str(x) for x in run.logs("ticker/1", follow=True))
        )
        follower.start()
        while not seen:
            assert time.monotonic() < deadline + 10, "no line followed"
            time.sleep(0.1)
        run.stop()
        follower.join(30)
        assert not follower.is_alive(), "logs(follow=True) did not end with the run"
        assert seen and all(line.startswith("[th2 ticker_1] tick ") for line in seen), seen
        assert run.snapshot().state is RunState.STOPPED
        assert ssh_hosts.leftovers(run_id) == {}
    finally:
        if ssh_hosts.leftovers(run_id):
            cli("stop", run_id)
        if follower is not None:  # it follows until the run ends: never beyond this test
            follower.join(30)


class Flaky:
    """Fails (exit 3) on its first ``failures`` starts on a host, then succeeds."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def run(self) -> None:
        path = Path.home() / f"flaky-{lp_ssh.get_context().run_id}"
        starts = int(path.read_text()) if path.exists() else 0
        path.write_text(str(starts + 1))
        if starts < self.failures:
            raise RuntimeError(f"flaky start {starts}")
        print(f"succeeded after {starts} failures", flush=True)


def test_restarts_then_success(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    program = lp_ssh.Program("flaky")
    program.add_node(lp_ssh.PyClassNode(Flaky, 2).to_host("th2"), label="flaky")
    run = lp_ssh.launch(
        program, ssh_config=ssh_hosts.ssh_config, max_restarts={"flaky": 2}, restart_backoff=0.1
    )
    rec = run.status()["flaky/0"]
    assert (rec["state"], rec["restarts"], rec["exit_code"]) == ("done", 2, 0)
    assert ssh_hosts.leftovers(run.run_id) == {}


def test_failure_after_restarts_names_node_host_and_traceback(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    program = lp_ssh.Program("flaky")
    program.add_node(lp_ssh.PyClassNode(Flaky, 5).to_host("th3"), label="flaky")
    program.add_node(lp_ssh.PyClassNode(Ticker).to_host("th1"), label="ticker")
    t0 = time.monotonic()
    run = lp_ssh.launch(
        program, wait=False, ssh_config=ssh_hosts.ssh_config, max_restarts=1, restart_backoff=0.1
    )
    with pytest.raises(lp_ssh.RunFailedError) as info:
        run.wait(30)
    err = info.value
    assert err.node == "flaky/0" and err.host == "th3" and err.exit_code == 1
    assert "RuntimeError: flaky start 1" in (err.remote_traceback or "")
    assert "after 1 restarts" in str(err)
    assert time.monotonic() - t0 < 30
    assert ssh_hosts.leftovers(run.run_id) == {}


class EnvReporter:
    def run(self) -> None:
        import helper_module  # shipped in working_dir

        print("cwd-file:", Path("data.txt").read_text().strip(), flush=True)
        print("helper:", helper_module.VALUE, flush=True)
        print("secret:", os.environ.get("TL_TEST_SECRET"), flush=True)
        print("explicit:", os.environ.get("TL_EXPLICIT"), flush=True)
        print("setup-ran:", (Path.home() / "setup-marker").exists(), flush=True)
        lp_ssh.stop()


def test_working_dir_setup_and_env(ssh_hosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    work = tmp_path / "work"
    (work / ".git").mkdir(parents=True)
    (work / ".git" / "big").write_bytes(b"x" * 1000)
    (work / "data.txt").write_text("shipped data\n")
    (work / "helper_module.py").write_text("VALUE = 42\n")
    monkeypatch.setenv("TL_TEST_SECRET", "s3cr3t-value")
    program = lp_ssh.Program("workdir")
    program.add_node(lp_ssh.PyClassNode(EnvReporter).to_host("th2"), label="reporter")
    run = lp_ssh.launch(
        program,
        ssh_config=ssh_hosts.ssh_config,
        working_dir=str(work),
        setup=["touch setup-marker"],
        env={"TL_EXPLICIT": "yes"},
        env_patterns=["TL_TEST_*"],
    )
    conn = connect_all(["th2"], ssh_config=ssh_hosts.ssh_config)["th2"]
    try:
        log = conn.read_file(f".tlaunch/runs/{run.run_id}/logs/reporter_0.log").decode()
        assert "cwd-file: shipped data" in log and "helper: 42" in log
        assert "secret: s3cr3t-value" in log and "explicit: yes" in log and "setup-ran: True" in log
    finally:
        conn.close()
    assert ssh_hosts.leftovers(run.run_id) == {}


def test_keep_bundles_leaves_them_private_on_the_hosts(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.txt").write_text("shipped data\n")
    program = lp_ssh.Program("keep")
    program.add_node(lp_ssh.PyNode(print, "hello").to_host("th2"), label="a")
    program.add_node(lp_ssh.PyNode(print, "there").to_host("th3"), label="b")
    run = lp_ssh.launch(program, ssh_config=ssh_hosts.ssh_config, keep_bundles=True, working_dir=str(work))
    conns = connect_all(["th2", "th3"], ssh_config=ssh_hosts.ssh_config)
    run_dir = f".tlaunch/runs/{run.run_id}"
    try:
        head = conns["th2"].run(["stat", "-c", "%a %n", f"{run_dir}/head.pkl", f"{run_dir}/0.node"]).stdout
        assert head.split() == ["600", f"{run_dir}/head.pkl", "600", f"{run_dir}/0.node"]
        assert conns["th3"].run(["stat", "-c", "%a", f"{run_dir}/1.node"]).stdout.strip() == "600"
        assert conns["th3"].read_file(f"{run_dir}/work/data.txt") == b"shipped data\n"
        # Only the kept files are left: no process, no tmux session.
        left = ssh_hosts.leftovers(run.run_id)
        assert sorted(left) == ["th2", "th3"]
        kept = (".node", "head.pkl", "/work", "/modules")  # the launcher's own modules travel too
        assert all(p.endswith(kept) for paths in left.values() for p in paths), left
    finally:
        for conn in conns.values():
            conn.run(["rm", "-rf", run_dir])
            conn.close()
    assert ssh_hosts.leftovers(run.run_id) == {}


def test_working_dir_over_limit_is_refused(tmp_path: Path) -> None:
    (tmp_path / "big.bin").write_bytes(os.urandom(2 * 2**20))
    program = lp_ssh.Program("big")
    program.add_node(lp_ssh.PyNode(print).to_host("th1"), label="a")
    with pytest.raises(lp_ssh.LaunchError, match=r"over the limit of 1 MiB.*working_dir_limit_mib"):
        lp_ssh.launch(program, working_dir=str(tmp_path), working_dir_limit_mib=1)


def test_unknown_option_is_named() -> None:
    program = lp_ssh.Program("opts")
    program.add_node(lp_ssh.PyNode(print).to_host("th1"), label="a")
    with pytest.raises(lp_ssh.LaunchError, match=r"unknown launch options \['max_restart'\]"):
        lp_ssh.launch(program, max_restart=2)
    with pytest.raises(lp_ssh.LaunchError, match=r"max_restarts names \['nope'\]"):
        lp_ssh.launch(program, max_restarts={"nope": 1})


def test_proxyjump(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """th2 reached through th1: th2 sees the connection coming from th1's address."""
    th1, th2 = ssh_hosts.hosts[0], ssh_hosts.hosts[1]
    config = tmp_path / "ssh_config"
    config.write_text(
        Path(ssh_hosts.ssh_config).read_text()
        + f"\nHost th2-via-th1\n  HostName {th2.address}\n  User root\n  ProxyJump th1\n"
        f"  IdentityFile {ssh_hosts.client_key}\n  UserKnownHostsFile {ssh_hosts.known_hosts}\n"
    )
    conn = connect_all(["th2-via-th1"], ssh_config=str(config))["th2-via-th1"]
    try:
        out = conn.run(["sh", "-c", "hostname; echo $SSH_CONNECTION"]).stdout.split()
    finally:
        conn.close()
    assert out[0] == "th2" and out[1] == th1.address and out[3] == th2.address


def test_launcher_sigkill_stops_the_run(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "launcher.py"
    script.write_text(
        textwrap.dedent(
            """
            from tlaunch import lp_ssh
            from test_ssh_lifecycle import Ticker

            p = lp_ssh.Program("orphan")
            p.add_node(lp_ssh.PyClassNode(Ticker).to_host("th2"), label="ticker")
            p.add_node(lp_ssh.PyClassNode(Ticker).to_host("th3"), label="ticker")
            run = lp_ssh.launch(p, wait=False, ssh_config={ssh_config!r}, coordinator_timeout=3, stop_grace=1)
            print("RUN", run.run_id, flush=True)
            import time
            time.sleep(600)
            """.replace("{ssh_config!r}", repr(ssh_hosts.ssh_config))
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.path.dirname(__file__)])}
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        run_id = line.split()[1]
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    t0 = time.monotonic()
    left = ssh_hosts.wait_no_leftovers(run_id, 20)
    assert left == {}, left
    assert time.monotonic() - t0 < 3 + 1 + 5  # lease timeout + grace + slack
    head = connect_all(["th2"], ssh_config=ssh_hosts.ssh_config)["th2"]
    try:
        final = json.loads(head.read_file(f".tlaunch/runs/{run_id}/final.json"))
    finally:
        head.close()
    assert "launcher stopped answering" in final["stop_reason"]


def test_ctrl_backslash_detaches_a_waiting_launcher(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tlaunch.launcher import runs_dir

    script = tmp_path / "launcher.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            from tlaunch import lp_ssh
            from test_ssh_lifecycle import Ticker

            p = lp_ssh.Program("quit")
            p.add_node(lp_ssh.PyClassNode(Ticker).to_host("th3"), label="ticker")
            run = lp_ssh.launch(p, ssh_config=sys.argv[1], terminal="output_to_files")
            print("RETURNED", run.run_id, run.detached, flush=True)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.path.dirname(__file__)])}
    proc = subprocess.Popen(
        [sys.executable, str(script), ssh_hosts.ssh_config], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        while not (os.path.isdir(runs_dir()) and os.listdir(runs_dir())):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        (run_id,) = os.listdir(runs_dir())
        while cli("ps", run_id).stdout.count("│ running") < 1:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGQUIT)  # Ctrl-\ in the launcher's terminal
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and f"RETURNED {run_id} True" in out
    time.sleep(1.0)
    assert cli("ps", run_id).stdout.count("│ running") == 1  # the run outlived its launcher
    assert cli("stop", run_id).returncode == 0
    assert ssh_hosts.leftovers(run_id) == {}


def test_teardown_removes_the_rendezvous_a_killed_server_left(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    """A server of the run killed between offering its Unix-socket rendezvous and its
    client's connect cannot remove the name: the host's cleanup does."""
    from tlaunch.backends.ssh.hostside import clean_host
    from tlaunch.procs import MARKER
    from tlaunch.testing.hosts import shm_dir

    run_id = "rendezvous-left"
    shm = shm_dir(ssh_hosts.hosts[0])  # th1's own /dev/shm, as this machine sees it
    conn = connect_all(["th1"], ssh_config=ssh_hosts.ssh_config)["th1"]
    try:
        name = "/dev/shm/tlaunch-$$-" + "ab" * 16
        script = f"touch {name}; echo $$; exec sleep 600"  # a server, as far as /dev/shm shows
        chan = conn.stream(["env", f"{MARKER}={run_id}", "sh", "-c", script])
        pid = chan.recv(64).decode().strip()
        assert pid.isdigit() and os.path.exists(f"{shm}/tlaunch-{pid}-{'ab' * 16}")
        other = f"{shm}/tlaunch-{pid}0-{'cd' * 16}"  # another pid's name: not the run's to remove
        Path(other).write_bytes(b"")
        try:
            assert clean_host(conn, run_id, [pid], None, remove_all=True, keep_bundles=False) == ""
            assert not os.path.exists(f"{shm}/tlaunch-{pid}-{'ab' * 16}")
            assert os.path.exists(other)
        finally:
            Path(other).unlink(missing_ok=True)
            chan.close()
    finally:
        conn.close()


def _within(seconds: float, done: Callable[[], bool]) -> None:
    """Wait until ``done()``, failing the test after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_the_cleanup_is_the_log_tails_last_command_and_its_last_lines_come_first(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    """The host's cleanup travels on its log tail's channel (no exec of its own): what the run
    printed just before still comes through, then the tail is gone; with no tail running, an
    exec does the same."""
    from tlaunch.backends.ssh.hostside import clean_host
    from tlaunch.procs import MARKER
    from tlaunch.ssh.tail import RemoteTail

    run_id = "cleanup-by-tail"
    conn = connect_all(["th1"], ssh_config=ssh_hosts.ssh_config)["th1"]
    log = "/tmp/cleanup-by-tail.log"

    def tails_left() -> list[str]:  # th1's own: another session's th1 has the same log path
        return [a for a in ssh_hosts.processes("th1").values() if a.startswith("tail ") and log in a]

    try:
        for how in ("by tail", "no tail", "tail killed"):
            by_tail = how == "by tail"
            chan = conn.stream(["env", f"{MARKER}={run_id}", "sh", "-c", "echo $$; exec sleep 600"])
            pid = chan.recv(64).decode().strip()
            lines: list[str] = []
            tail = RemoteTail(conn, [log], lambda path, line: lines.append(line), from_start=False)
            tail.start()
            conn.run(["sh", "-c", f"sleep 0.3; echo last words >> {log}"])
            real_run = conn.run
            if by_tail:
                conn.run = lambda *a, **k: (_ for _ in ()).throw(AssertionError("an exec"))  # type: ignore[method-assign]
            elif how == "no tail":
                tail.stop(drain=0.5)  # not running: the cleanup is an exec
            else:  # gone on the host (its shell too), and noticed here: an exec too
                conn.run(["kill", "-s", "KILL", "--", f"-{tail.wait_pid(5.0)}"])
                # Not before it is noticed: a write racing the host's close of the channel can
                # reach sshd after the channel is freed, and OpenSSH then drops the whole
                # connection (paramiko sends outside the channel's lock, paramiko#1115).
                _within(10, lambda: tail.running_group() is None)
            try:
                said = clean_host(conn, run_id, [pid], None, True, False, drain=0.4, tail=tail)
            finally:
                conn.run = real_run  # type: ignore[method-assign]
            assert said == ""
            assert "last words" in lines or how == "tail killed"
            assert conn.run(["sh", "-c", f"kill -0 {pid} 2>/dev/null || echo gone"]).stdout.strip() == "gone"
            assert tails_left() == []
            chan.close()
    finally:
        conn.run(["rm", "-f", log], check=False)
        conn.close()


def test_a_log_tail_names_each_files_lines_and_one_files_come_without_a_header(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    """With two files, each line is its file's (tail's ``==> name <==`` headers); with one, no
    header travels, and a line that looks like one is a line of that file."""
    from tlaunch.ssh.tail import RemoteTail

    conn = connect_all(["th1"], ssh_config=ssh_hosts.ssh_config)["th1"]
    a, b = "/tmp/tail-names-a.log", "/tmp/tail-names-b.log"
    try:
        for paths in ([a], [a, b]):
            conn.run(["rm", "-f", a, b])
            seen: list[tuple[str, str]] = []
            tail = RemoteTail(conn, paths, lambda path, line: seen.append((path, line)), from_start=False)
            tail.start()
            # One file: a line like a header is its line; two: what tail -v says is ambiguous.
            looks = f"echo '==> {b} <==' >> {a}; " if len(paths) == 1 else ""
            script = f"sleep 0.3; echo one >> {a}; {looks}echo '' >> {a}; echo two >> {a}"
            if len(paths) == 2:
                script += f"; sleep 0.5; echo three >> {b}"
            conn.run(["sh", "-c", script])
            want = [(a, "one"), *([(a, f"==> {b} <==")] if looks else []), (a, ""), (a, "two")]
            if len(paths) == 2:
                want.append((b, "three"))
            _within(5, lambda want=want: seen == want)
            tail.stop(drain=0.3)
            assert seen == want
    finally:
        conn.run(["rm", "-f", a, b], check=False)
        conn.close()


def test_a_line_written_in_pieces_arrives_whole_though_tail_read_another_file_between(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    """A node that writes a line in two writes (``print`` of several values, unbuffered) while
    another file grows: tail reads the first piece, names the other file, then comes back for
    the rest. The line arrives whole, as its file has it (the job server's log follow once
    showed ``trainer got`` and ``[0, 10] ...`` as two lines); so does a piece cut by the stop."""
    from tlaunch.ssh.tail import RemoteTail

    conn = connect_all(["th1"], ssh_config=ssh_hosts.ssh_config)["th1"]
    a, b = "/tmp/tail-pieces-a.log", "/tmp/tail-pieces-b.log"
    try:
        conn.run(["rm", "-f", a, b])
        seen: list[tuple[str, str]] = []
        tail = RemoteTail(conn, [a, b], lambda path, line: seen.append((path, line)), from_start=False)
        tail.start()
        script = (
            f"sleep 0.3; printf 'trainer got' >> {a}; sleep 0.5; echo other >> {b}; sleep 0.5; "
            f"printf ' [0, 10]\\n\\nnext' >> {a}; sleep 0.5; printf ' line\\nunended' >> {a}"
        )
        conn.run(["sh", "-c", script])
        want = [(b, "other"), (a, "trainer got [0, 10]"), (a, ""), (a, "next line")]
        _within(5, lambda: seen == want)
        tail.stop(drain=0.3)
        assert seen == [*want, (a, "unended")]  # the last piece, cut by the stop's mark, still comes
    finally:
        conn.run(["rm", "-f", a, b], check=False)
        conn.close()


def test_a_log_tail_is_ended_by_its_own_shell_and_an_ended_one_is_not_signalled(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    """Stopping a running tail takes no exec (its shell ends its own process group), and one
    that already ended is not signalled at all: its group's number may be another's by then.
    A tail whose tmux session ended ends by itself, its shell still waiting for the last word."""
    from tlaunch.ssh.tail import RemoteTail

    conn = connect_all(["th1"], ssh_config=ssh_hosts.ssh_config)["th1"]
    log, session = "/tmp/tail-stops-itself.log", "tail-stops-itself"
    real_run = conn.run

    def tails_left() -> list[str]:  # th1's own: another session's th1 has the same log path
        return [a for a in ssh_hosts.processes("th1").values() if a.startswith("tail ") and log in a]

    try:
        for case in ("running", "ended", "its session ended"):
            lines: list[str] = []
            if case == "its session ended":
                real_run(["tmux", "new-session", "-d", "-s", session, "sleep 600"])
            tail = RemoteTail(
                conn,
                [log],
                lambda path, line: lines.append(line),
                from_start=False,
                session=session if case == "its session ended" else None,
            )
            tail.start()
            real_run(["sh", "-c", f"sleep 0.3; echo a line >> {log}"])
            if case == "ended":  # its group killed from outside; the reader sees the channel end
                real_run(["kill", "-s", "KILL", "--", f"-{tail.wait_pid(5.0)}"])
                _within(10, lambda: tail.running_group() is None)
            elif case == "its session ended":
                _within(5, lambda: "a line" in lines)
                real_run(["tmux", "kill-session", "-t", f"={session}"])
                _within(5, lambda: tails_left() == [])
                assert tail.running_group() is not None  # its shell waits for the last word
            conn.run = lambda *a, **k: (_ for _ in ()).throw(AssertionError("an exec"))  # type: ignore[method-assign]
            try:
                tail.stop(drain=0.5)
            finally:
                conn.run = real_run  # type: ignore[method-assign]
            assert "a line" in lines
            assert tails_left() == []
            assert tail.running_group() is None
    finally:
        real_run(["tmux", "kill-session", "-t", f"={session}"], check=False)
        real_run(["rm", "-f", log], check=False)
        conn.close()
