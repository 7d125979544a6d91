"""The SSH transport on real test hosts: config, host keys, quoting, files, errors."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tlaunch.errors import CommandError, HostKeyError, HostsError, SSHError
from tlaunch.ssh import Connection, connect_all, let_go_all, resolve_target, run_held
from tlaunch.testing.hosts import SSHTestHosts

pytestmark = pytest.mark.ssh


def test_connect_all_in_parallel_and_run(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    conns = connect_all(["th1", "th2", "th3"], ssh_config=ssh_hosts.ssh_config)
    elapsed = time.monotonic() - t0
    try:
        assert [conns[h].run(["hostname"]).stdout.strip() for h in ("th1", "th2", "th3")] == [
            "th1",
            "th2",
            "th3",
        ]
        assert conns["th1"].run(["sh", "-c", "echo $HOME"]).stdout.strip() == "/root"
        assert elapsed < 10
    finally:
        for c in conns.values():
            c.close()


def test_hostile_arguments_are_quoted_once(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    hostile = ["a'; touch /tmp/pwned; echo '", "$(touch /tmp/pwned2)", "two words", "new\nline", "`id`", "*"]
    with Connection(resolve_target("th1", ssh_hosts.ssh_config)) as conn:
        out = conn.run(["printf", "%s\\n", *hostile]).stdout
        assert out == "".join(f"{h}\n" for h in hostile)
        assert conn.run(["sh", "-c", "ls /tmp/pwned /tmp/pwned2 2>/dev/null | wc -l"]).stdout.strip() == "0"


def test_output_written_after_the_exit_status_is_not_lost(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    """sshd sends the exit status when its child exits; output still in flight must arrive.

    The shell exits at once while a background child of it still holds stdout:
    the exit status comes first, the output later, and run() returns both.
    """
    with Connection(resolve_target("th1", ssh_hosts.ssh_config)) as conn:
        done = conn.run(["sh", "-c", "(sleep 0.3; echo late; echo late-err >&2) & echo early"])
        assert (done.stdout, done.stderr) == ("early\nlate\n", "late-err\n")


def test_failing_command_carries_status_and_stderr(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    with Connection(resolve_target("th2", ssh_hosts.ssh_config)) as conn:
        with pytest.raises(CommandError) as info:
            conn.run(["sh", "-c", "echo out; echo oops >&2; exit 3"])
        err = info.value
        assert (err.host, err.exit_status, err.stdout, err.stderr) == ("th2", 3, "out\n", "oops\n")
        assert "exited with status 3" in str(err) and "oops" in str(err)
        assert conn.run(["false"], check=False).exit_status == 1
        assert conn.run(["cat"], stdin=b"via stdin").stdout == "via stdin"


def test_files_are_written_atomically_with_their_mode(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    with Connection(resolve_target("th3", ssh_hosts.ssh_config)) as conn:
        conn.run(["mkdir", "-p", "-m", "700", ".tlaunch/t"])
        data = os.urandom(3 << 20)
        conn.write_file(".tlaunch/t/bundle", data, mode=0o600)
        assert conn.read_file(".tlaunch/t/bundle") == data
        assert conn.run(["stat", "-c", "%a", ".tlaunch/t/bundle", ".tlaunch/t"]).stdout.split() == [
            "600",
            "700",
        ]
        assert conn.run(["sh", "-c", "ls .tlaunch/t | wc -l"]).stdout.strip() == "1"  # no .part left
    assert not os.path.exists(os.path.expanduser("~/.tlaunch/t/bundle"))  # not a shared filesystem


def test_unknown_and_changed_host_keys_are_refused(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    config = tmp_path / "config"
    config.write_text(Path(ssh_hosts.ssh_config).read_text().replace(ssh_hosts.known_hosts, str(empty)))
    with pytest.raises(HostKeyError, match=r"not in known_hosts.*ssh-keyscan.*accept_unknown_hosts=True"):
        Connection(resolve_target("th1", str(config)))
    with Connection(resolve_target("th1", str(config)), accept_unknown_hosts=True) as conn:
        assert conn.run(["hostname"]).stdout.strip() == "th1"
    # th2's key written down for th1's address: a changed key, always refused.
    lines = Path(ssh_hosts.known_hosts).read_text().splitlines()
    th2_key = lines[1].split(" ", 1)[1]
    empty.write_text(f"{ssh_hosts.hosts[0].address} {th2_key}\n")
    with pytest.raises(HostKeyError, match=r"differs from the one in known_hosts.*ssh-keygen -R"):
        Connection(resolve_target("th1", str(config)), accept_unknown_hosts=True)


def test_every_failing_host_is_reported_at_once(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    wrong_key = tmp_path / "id_wrong"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)], check=True)
    config = tmp_path / "config"
    config.write_text(
        Path(ssh_hosts.ssh_config).read_text()
        + f"\nHost badkey\n  HostName {ssh_hosts.hosts[0].address}\n  User root\n  IdentityFile {wrong_key}\n"
        f"  UserKnownHostsFile {ssh_hosts.known_hosts}\n"
    )
    with pytest.raises(HostsError) as info:
        connect_all(["th1", "th2:2222", "198.18.0.250", "badkey"], ssh_config=str(config), timeout=2)
    errors = info.value.errors
    assert set(errors) == {"th2:2222", "198.18.0.250", "badkey"}
    assert "cannot connect" in str(errors["th2:2222"])
    assert isinstance(errors["badkey"], SSHError) and "authentication as 'root' failed" in str(
        errors["badkey"]
    )
    assert "3 host(s) failed" in str(info.value)


def test_ssh_config_is_honoured(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    target = resolve_target("alice@th2:2200", ssh_hosts.ssh_config)
    assert (target.hostname, target.user, target.port) == (ssh_hosts.hosts[1].address, "alice", 2200)
    target = resolve_target("th2", ssh_hosts.ssh_config)
    assert (target.user, target.port, target.key_filenames) == ("root", 22, (ssh_hosts.client_key,))
    assert shutil.which("ssh") is not None


def test_known_hosts_read_once_give_each_host_what_paramiko_gives_it(tmp_path: Path) -> None:
    """Each connection gets its host's keys from files read once: the same keys, in the same order."""
    import paramiko

    from tlaunch.ssh.known_hosts import KnownHosts

    def key() -> str:
        path = tmp_path / f"k{len(list(tmp_path.iterdir()))}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
        return " ".join((path.with_suffix(".pub").read_text().split())[:2])

    k1, k2, k3 = key(), key(), key()
    hashed = paramiko.HostKeys.hash_host("hidden")
    first = tmp_path / "known_first"
    first.write_text(
        f"# a comment\n\nplain,10.0.0.1 {k1}\n{hashed} {k2}\n[plain]:2222 {k3}\n"
        f"plain {k2}\nbroken-line-without-key\nplain\t{k1}\n"
    )
    second = tmp_path / "known_second"
    second.write_text(f"plain {k3}\nother {k1}\n")
    known = KnownHosts()
    for name in ("plain", "10.0.0.1", "hidden", "[plain]:2222", "other", "absent"):
        paths = [str(first), str(second), str(tmp_path / "missing")]
        reference = paramiko.HostKeys()
        for p in paths:
            if os.path.exists(p):
                reference.load(p)
        want = reference.lookup(name)
        got = [(k.get_name(), k.asbytes()) for k in known.keys(paths, name)]
        expected = [] if want is None else [(t, want[t].asbytes()) for t in dict.fromkeys(want.keys())]
        # paramiko's lookup answers the first key of each type; ours lists every line, first first
        assert [g for i, g in enumerate(got) if g[0] not in [h[0] for h in got[:i]]] == expected, name
    # A key marked @revoked is never given (paramiko's own loader fails on the marker).
    first.write_text(f"plain,other {k1}\n@revoked {hashed},other {k1}\n@cert-authority * {k2}\nhidden {k3}\n")
    assert [k.get_base64() for k in known.keys([str(first)], "hidden")] == [k3.split()[1]]
    assert [k.get_base64() for k in known.keys([str(first)], "plain")] == [k1.split()[1]]
    assert known.keys([str(first)], "other") == []


def test_commands_run_when_the_launcher_holds_more_than_1024_descriptors(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    """select(2) refuses descriptors past 1024; a launcher of hundreds of hosts holds that many."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the hard limit of open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        with connect_all(["th1"], ssh_config=ssh_hosts.ssh_config)["th1"] as conn:
            assert conn.run(["sh", "-c", "sleep 0.3; echo done"]).stdout.strip() == "done"
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_identity_file_is_read_once_for_every_connection(
    ssh_hosts: SSHTestHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """paramiko reads an identity file anew per connection (an RSA key: ~0.1 s of CPU each);
    here it is read once, named in the config or found in ~/.ssh as paramiko would."""
    import paramiko

    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    rsa = home / ".ssh" / "id_rsa"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", str(rsa)], check=True)
    host = ssh_hosts.hosts[0]
    authorized = Path(host.home) / ".ssh" / "authorized_keys"
    before = authorized.read_text()
    authorized.write_text(before + (home / ".ssh" / "id_rsa.pub").read_text())
    named, found = tmp_path / "named", tmp_path / "found"
    common = f"  HostName {host.address}\n  User root\n  UserKnownHostsFile {ssh_hosts.known_hosts}\n"
    named.write_text(f"Host rsa\n{common}  IdentityFile {rsa}\n  IdentitiesOnly yes\n")
    found.write_text(f"Host rsa\n{common}")  # no IdentityFile: ~/.ssh/id_rsa, as paramiko looks
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    reads: list[str] = []
    from_path = paramiko.PKey.from_path

    def counted(path: str, password: str | None = None) -> paramiko.PKey:
        reads.append(str(path))
        return from_path(path, password)

    monkeypatch.setattr(paramiko.PKey, "from_path", staticmethod(counted))
    monkeypatch.setattr(paramiko.RSAKey, "from_private_key_file", None)  # paramiko's own reading: unused
    try:
        for config in (named, found):
            for _ in range(3):
                conn = Connection(resolve_target("rsa", str(config)))
                try:
                    assert conn.run(["echo", "in"]).stdout.strip() == "in"
                finally:
                    conn.close()
        assert reads == [str(rsa)]  # once for six connections, both ways of naming it
    finally:
        authorized.write_text(before)


def test_a_held_shell_runs_the_command_it_is_given_or_ends(ssh_hosts: SSHTestHosts) -> None:
    """``run_held``: the script's output, then its shell waits on the channel for a command."""
    conn = connect_all(["th1"], ssh_config=ssh_hosts.ssh_config)["th1"]
    try:

        def waiting() -> bool:
            return any("tlaunch-held-" in a for a in ssh_hosts.processes("th1").values())  # th1's own

        said, held = run_held(conn, 'echo "one $1"; echo "two $2" >&2', ["a", "b"])
        assert said.strip() == "one a" and held is not None and waiting()
        chan = held.exec(["sh", "-c", 'echo "$1 $$"; echo "err" >&2', "sh", "x y"])
        assert chan is not None
        out = b""
        while data := chan.recv(1 << 16):  # to its end: output may come after the exit status
            out += data
        assert out.decode().split("\n")[0].startswith("x y ") and "err" in out.decode()
        chan.close()
        assert not waiting()
        _, held = run_held(conn, "true", [])
        assert held is not None
        assert held.exec(["echo", "two\nlines"]) is None  # cannot travel as lines: the shell ends
        deadline = time.monotonic() + 5
        while waiting():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        _, held = run_held(conn, "true", [])
        assert held is not None
        held.close()
        held.close()
        deadline = time.monotonic() + 5
        while waiting():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        said, held = run_held(conn, "echo gone; exit 3", [])
        assert said.strip() == "gone" and held is None
    finally:
        conn.close()


def test_a_held_shell_runs_commands_with_their_stdin_and_waits_again(ssh_hosts: SSHTestHosts) -> None:
    """``Held.run``: each command gets exactly its bytes, whatever it reads of them, and the
    shell waits for the next; then one runs in its place."""
    import hashlib

    conn = connect_all(["th1"], ssh_config=ssh_hosts.ssh_config)["th1"]
    try:
        _, held = run_held(conn, "true", [])
        assert held is not None
        with pytest.raises(ValueError):
            held.run(["cat"], b"x")  # the host's head was not said to count
        assert held.run(["sh", "-c", "cat; echo done"]) == (0, "done\n")  # no stdin: no head needed
        held.counted_stdin = True  # the test hosts have GNU coreutils
        data = os.urandom(300_000) + b"\nexit 0\n3\necho\n"  # looks like commands, is not read as one
        status, said = held.run(["sh", "-c", "md5sum; echo err >&2; exit 4"], data)
        assert status == 4 and said.split()[0] == hashlib.md5(data).hexdigest() and "err" in said
        assert held.run(["head", "-c", "3"], b"abcdef") == (0, "abc")  # the rest is read, not run
        assert held.run(["printf", "%s|", "two words", "$HOME"]) == (0, "two words|$HOME|")
        # ``sh -c SCRIPT NAME ARGS...`` runs in a subshell of the held shell (no exec of sh):
        # "$@" is ARGS, an exec ends only that subshell, the rest it did not read (NULs and
        # lines that look like commands too) is drained, not run.
        script = 'head -c 2; printf "|%s" "$@"; exec true'
        rest = os.urandom(5000) + b"\x00\nexit 0\n1\nreboot\n"
        assert held.run(["sh", "-c", script, "sh", "a b", "c"], b"xy" + rest) == (0, "xy|a b|c")
        assert held.run(["sh", "-c", "exit 7", "sh"]) == (7, "")
        # Started, then waited for: the launcher goes on meanwhile; one at a time.
        held.send(["sh", "-c", 'cat; echo "$1"', "sh", "sent"], b"fed|")
        with pytest.raises(SSHError, match="started and not finished"):
            held.send(["true"])
        assert held.finish() == (0, "fed|sent\n")
        with pytest.raises(ValueError):
            held.run(["echo", "a\nb"])
        chan = held.exec(["echo", "last"])
        assert chan is not None
        out = b""
        while data := chan.recv(1 << 16):  # to its end: output may come after the exit status
            out += data
        assert out == b"last\n"
        chan.close()
        with pytest.raises(SSHError):
            held.run(["true"])  # used: it ran its last command
    finally:
        conn.close()


def test_a_held_shells_scratch_goes_as_it_ends_unless_kept(ssh_hosts: SSHTestHosts) -> None:
    """``run_held(..., scratch=PATH)``: the shell removes PATH as it ends (let go, or its
    connection dropped as a killed launcher's does), unless a command said to keep it."""
    conn = connect_all(["th1"], ssh_config=ssh_hosts.ssh_config)["th1"]
    write = ["sh", "-c", 'mkdir -p "$1" && echo secret > "$1/f"', "sh"]

    def exists(path: str) -> bool:
        return conn.run(["test", "-e", path], check=False).exit_status == 0

    try:
        for bad in ("", "/", ".", "./", "../x", "a/../../x", "/etc"):
            with pytest.raises(ValueError, match="below the home directory"):
                run_held(conn, "true", [], scratch=bad)
        _, held = run_held(conn, "true", [], scratch="scratch-test/a b")
        assert held is not None and held.run([*write, "scratch-test/a b"]) == (0, "")
        assert exists("scratch-test/a b")
        let_go_all({"th1": held})  # returns once the shell has ended: the path is gone
        assert not exists("scratch-test/a b") and exists("scratch-test")

        _, held = run_held(conn, "true", [], scratch="scratch-test/kept")
        assert held is not None
        held.run([*write, "scratch-test/kept"])
        assert held.run(["true"], keep_scratch=True) == (0, "")
        let_go_all({"th1": held})
        assert exists("scratch-test/kept/f")

        dropped = connect_all(["th1"], ssh_config=ssh_hosts.ssh_config)["th1"]
        _, held = run_held(dropped, "true", [], scratch="scratch-test/dropped")
        assert held is not None
        held.run([*write, "scratch-test/dropped"])
        dropped.transport.sock.shutdown(socket.SHUT_RDWR)  # as the socket of a process killed
        dropped.close()
        deadline = time.monotonic() + 10
        while exists("scratch-test/dropped"):
            assert time.monotonic() < deadline, "the shell left its scratch path"
            time.sleep(0.05)
    finally:
        conn.run(["rm", "-rf", "scratch-test"])
        conn.close()


def test_each_test_host_has_its_own_dev_shm(ssh_hosts: SSHTestHosts) -> None:
    """As on real machines, two hosts' processes cannot pass each other sealed memory files."""
    from tlaunch.testing.hosts import shm_dir

    conns = connect_all(["th1", "th2"], ssh_config=ssh_hosts.ssh_config)
    name = f"tlaunch-test-{os.getpid()}"
    try:
        conns["th1"].run(["touch", f"/dev/shm/{name}"])
        assert os.path.exists(os.path.join(shm_dir(ssh_hosts.hosts[0]), name))
        assert conns["th2"].run(["ls", "/dev/shm"]).stdout.split().count(name) == 0
        assert not os.path.exists(f"/dev/shm/{name}")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(shm_dir(ssh_hosts.hosts[0]), name))
        for c in conns.values():
            c.close()


def test_an_interrupt_ends_a_command_at_once_and_an_idle_wait_does_not_spin(ssh_hosts: SSHTestHosts) -> None:
    """A command waits on its channel and its connection's interrupt together: a Ctrl-C
    (``interrupted.set()``, as :func:`tlaunch.ssh.pmap` does) ends it at once, held or not,
    and a command that prints nothing costs no wake-ups while it runs."""
    import resource
    import threading

    conn = connect_all(["th1"], ssh_config=ssh_hosts.ssh_config)["th1"]
    try:
        _, held = run_held(conn, "true", [])
        assert held is not None
        held.counted_stdin = True
        runs = (lambda: conn.run(["sleep", "30"]), lambda: run_held(conn, "sleep 30", []))
        for run in (*runs, lambda: held.run(["sleep", "30"])):
            threading.Timer(0.5, conn.interrupted.set).start()
            t0 = time.monotonic()
            with pytest.raises(SSHError, match="interrupted"):
                run()
            assert time.monotonic() - t0 < 2.0
            conn.interrupted.clear()
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
        conn.run(["sleep", "5"])
        switches = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before
        print("voluntary context switches while waiting 5 s:", switches)
        assert switches < 16, switches  # a wake every 0.2 s alone was 25 (6 here now, 31 before)
    finally:
        conn.close()


def test_a_command_fed_on_stdin_ends_before_an_interrupt_returns(ssh_hosts: SSHTestHosts) -> None:
    """A command fed on stdin (the files a launch ships, unpacked by ``tar -x``) that a Ctrl-C
    cuts short gets its EOF and has ended when its call raises, held or not: the cleanup
    that follows cannot race it. (Its channel was merely closed: ``tar`` went on with what it
    had, and an aborted launch in CI left a run directory behind that it made after the cleanup.)"""
    import threading

    conn = connect_all(["th1"], ssh_config=ssh_hosts.ssh_config)["th1"]
    name = f"fed-{os.getpid()}"
    try:
        _, held = run_held(conn, "true", [])
        assert held is not None
        held.counted_stdin = True
        # It reads what it gets (held: its count; else to the EOF), then writes a file a while later.
        script = f'cat >/dev/null; sleep 2; echo "$1" >> {name}'
        runs: dict[str, Callable[[], object]] = {
            "exec": lambda: conn.run(["sh", "-c", script, "sh", "exec"], stdin=b"x" * 1000),
            "held": lambda: held.run(["sh", "-c", script, "sh", "held"], b"x" * 1000),
        }
        for how, run in runs.items():
            threading.Timer(0.3, conn.interrupted.set).start()  # while it sleeps
            with pytest.raises(SSHError, match="interrupted"):
                run()
            conn.interrupted.clear()
            assert conn.run(["cat", name]).stdout.split()[-1] == how  # written before the call returned
        conn.interrupted.set()  # before it starts: nothing of it runs, not even its input's end
        with pytest.raises(SSHError, match="interrupted"):
            conn.run(["sh", "-c", script, "sh", "never"], stdin=b"x")
        conn.interrupted.clear()
        time.sleep(2.5)
        assert conn.run(["cat", name]).stdout.split() == ["exec", "held"]
    finally:
        conn.interrupted.clear()
        conn.run(["rm", "-f", name], check=False)
        conn.close()


def test_a_second_interrupt_while_pmap_waits_leaves_its_connections_usable() -> None:
    """A second Ctrl-C while :func:`~tlaunch.ssh.pmap` waits for its workers (a command fed on
    stdin is waited for) propagates, and the connections' interrupt is cleared all the same:
    the cleanup that follows runs its commands on them (an interrupted connection starts none)."""
    import signal
    import threading
    from types import SimpleNamespace

    from tlaunch.ssh import pmap
    from tlaunch.ssh.interrupt import Interrupt

    conns: dict[str, Any] = {"a": SimpleNamespace(interrupted=Interrupt())}
    release = threading.Event()

    def deaf(item: str) -> str:  # deaf to the interrupt for a while, as a command waited for is
        release.wait(5)
        return item

    main = threading.main_thread().ident
    assert main is not None and threading.current_thread() is threading.main_thread()
    timers = [threading.Timer(t, signal.pthread_kill, (main, signal.SIGINT)) for t in (0.2, 0.6)]
    try:
        for t in timers:
            t.start()
        with pytest.raises(KeyboardInterrupt):
            pmap(deaf, ["a"], conns)
        assert not conns["a"].interrupted.is_set()
    finally:
        release.set()
        for t in timers:
            t.cancel()
            t.join()
        conns["a"].interrupted.close()


def test_a_pty_command_cut_short_leaves_nothing(ssh_hosts: SSHTestHosts, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A pty command cut short (Ctrl-C: a setup command in preflight) has its whole process
    group killed, by the pid it printed first: the pty's hangup alone leaves a command that
    ignores SIGHUP running. A Ctrl-C right after the start waits for that pid; once
    interrupted, no command starts at all. (The kill once read ``kill -TERM -- -PGID``, which
    Debian's dash refuses: only the hangup ended such commands.)"""
    import threading

    import paramiko

    conn = connect_all(["th2"], ssh_config=ssh_hosts.ssh_config)["th2"]
    marker = f"sleep 47.{time.monotonic_ns() % 10**6}"
    real_exec, real_ready = paramiko.Channel.exec_command, paramiko.Channel.recv_ready
    unseen: set[paramiko.Channel] = set()

    def exec_then_interrupt(chan: paramiko.Channel, command: str) -> None:
        real_exec(chan, command)
        if "at-once" in command:
            conn.interrupted.set()
            unseen.add(chan)

    def not_yet(chan: paramiko.Channel) -> bool:  # its pid has not come back at the first look
        if chan in unseen:
            unseen.discard(chan)
            return False
        return real_ready(chan)

    def gone() -> None:
        deadline = time.monotonic() + 10
        while any(marker in a for a in ssh_hosts.processes("th2").values()):
            assert time.monotonic() < deadline, f"{marker!r} left running"
            time.sleep(0.1)

    try:
        threading.Timer(1.0, conn.interrupted.set).start()
        with pytest.raises(SSHError, match="interrupted"):
            conn.run(["sh", "-c", f"trap '' HUP; {marker}; true"], pty=True)  # running, deaf to the hangup
        conn.interrupted.clear()
        gone()
        monkeypatch.setattr(paramiko.Channel, "exec_command", exec_then_interrupt)
        monkeypatch.setattr(paramiko.Channel, "recv_ready", not_yet)
        with pytest.raises(SSHError, match="interrupted"):
            conn.run(["sh", "-c", f": at-once; trap '' HUP; {marker}; true"], pty=True)
        with pytest.raises(SSHError, match="interrupted"):
            conn.run(["sh", "-c", f"touch started; {marker}"], pty=True)  # never starts
        conn.interrupted.clear()
        gone()
        assert conn.run(["ls", "started"], check=False).exit_status != 0
    finally:
        conn.close()
