"""A node forked from its supervisor is the node an exec would have started, but for its command line."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tlaunch.runtime.forked import can_fork

PROGRAM = """
    import gc, os, sys, threading
    from tlaunch import lp_ssh as lp

    class Who:
        def info(self):
            with open("/proc/self/comm") as f:
                comm = f.read().strip()
            with open("/proc/self/cmdline", "rb") as f:
                cmd = f.read().split(b"\\0")
            return dict(
                argv=sys.argv, path=sys.path[:3], cwd=os.getcwd(), env=os.environ.get("FOO"),
                unbuffered=os.environ.get("PYTHONUNBUFFERED"), main=sys.modules["__main__"].__name__,
                own_group=os.getpgid(0) == os.getpid(), own_session=os.getsid(0) == os.getpid(),
                comm=comm, supervisor_cmd=b"tlaunch.runtime.supervisor" in cmd,
                stdin_empty=sys.stdin.read() == "",
                # Started without collections (tlaunch.runtime), then they came back and what
                # was loaded was frozen, before the node's own code.
                gc=(gc.isenabled(), gc.get_freeze_count() > 0),
            )

    class Asker:
        def __init__(self, who):
            self.who = who

        def run(self):
            print("the node's output", flush=True)
            with open(OUT, "w") as f:
                f.write(repr(self.who.info()))
            lp.stop()

    OUT = os.environ["OUT"]
    if __name__ == "__main__":
        p = lp.Program("forked")
        who = p.add_node(lp.CourierNode(Who), label="who")
        p.add_node(lp.PyClassNode(Asker, who), label="asker")
        lp.launch(p, launch_type="local_mp", terminal="tmux_session", env={"FOO": "bar", **EXTRA})
"""


def _node_info(tmp_path: Path, extra: dict[str, str]) -> dict[str, object]:
    out = tmp_path / f"info-{len(extra)}.txt"
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM).replace("**EXTRA", f"**{extra!r}"))
    env = {**os.environ, "OUT": str(out)}
    subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, timeout=60, check=True)
    info = ast.literal_eval(out.read_text())
    assert isinstance(info, dict)
    return info


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="forking nodes needs Linux's pidfd_open")
def test_a_forked_node_sees_what_an_execd_one_sees(tmp_path: Path) -> None:
    forked = _node_info(tmp_path, {})
    execd = _node_info(tmp_path, {"TLAUNCH_FORK_NODES": "0"})
    assert forked.pop("comm") == "tlaunch-node" and forked.pop("supervisor_cmd") is True
    assert execd.pop("comm") != "tlaunch-node" and execd.pop("supervisor_cmd") is False
    assert isinstance(forked["argv"], list) and isinstance(execd["argv"], list)
    assert forked["argv"][:3] == execd["argv"][:3]  # the node_main path, "-", the key (then the run id)
    forked.pop("argv"), execd.pop("argv")
    assert forked == execd
    assert forked["own_group"] and forked["own_session"] and forked["env"] == "bar"
    assert forked["gc"] == (True, True)


def test_an_environment_read_at_a_process_start_execs() -> None:
    env = dict(os.environ)
    assert can_fork({**env, "FOO": "bar", "PYTHONPATH": "/x"}) == can_fork(env)
    for name in ("LD_PRELOAD", "LD_LIBRARY_PATH", "MALLOC_ARENA_MAX", "PYTHONHASHSEED", "LC_ALL"):
        assert not can_fork({**env, name: "changed-for-the-node"}), name
    assert not can_fork({**env, "TLAUNCH_FORK_NODES": "0"})


def test_a_process_with_threads_never_forks() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert not can_fork(dict(os.environ))
    finally:
        stop.set()
        thread.join()


HARNESS = """
    import subprocess, sys, time
    from tlaunch.runtime.forked import fork_node

    def main(argv):
        data = sys.stdin.buffer.read()
        print("child", argv, len(data), flush=True)
        time.sleep(float(argv[0]))
        return 7

    node = fork_node(["prog", "0.5"], {"PATH": "/usr/bin:/bin"}, [], main)
    node.stdin.write(b"x" * 100000)
    node.stdin.close()
    try:
        node.wait(0.05)
        print("no timeout")
    except TimeoutError:
        print("timed out")
    print(node.stdout.read().decode().strip())
    print("code", node.wait(), node.poll())
"""


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="forking nodes needs Linux's pidfd_open")
def test_a_forked_node_is_waited_for_with_a_timeout_and_gives_its_code() -> None:
    argv = [sys.executable, "-c", textwrap.dedent(HARNESS)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout.splitlines()
    assert out == ["timed out", "child ['0.5'] 100000", "code 7 7"]


HANDOFF = """
    import json, os, sys
    from tlaunch.rpc import RPCClient, RPCServer, RunKeys
    from tlaunch.rpc.client import fixed_resolver
    from tlaunch.runtime.forked import fork_node

    class Service:
        def add(self, a, b):
            return a + b

    keys = RunKeys.generate()
    server = RPCServer(Service(), keys, tls_client=True)
    # As a coordinator's client: no shared memory (with it, each connection's Unix socket is kept too).
    client = RPCClient("svc", keys, fixed_resolver(server.address), shared_memory=False, tls_server=True)
    port = int(server.address.rpartition(":")[2])

    def accepted():
        # The server's end of each TCP connection to it, established, in this network namespace.
        n = 0
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                for line in f.readlines()[1:]:
                    local, state = line.split()[1], line.split()[3]
                    n += int(local.rsplit(":", 1)[1], 16) == port and state == "01"
        return n

    def main(argv):
        fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
        print("child", client.add(2, 3), accepted(), json.dumps(fds), flush=True)
        return 0

    print("parent", client.add(1, 2), accepted(), flush=True)
    keep = client.idle_descriptors()
    node = fork_node(["prog"], dict(os.environ), [], main, keep)
    client.hand_off()
    node.stdin.close()
    print(node.stdout.read().decode().strip(), flush=True)
    print("kept", json.dumps(keep), flush=True)
    print("code", node.wait(), flush=True)
    print("again", client.add(3, 4), flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="forking nodes needs Linux's pidfd_open")
def test_a_forked_node_goes_on_with_its_supervisors_connection() -> None:
    """What a supervisor does for its forked node: the child calls on the connection the parent
    opened (no handshake of its own: the server still has one connection), with it as its only
    descriptor past 2; the parent gave it up without a word, and its next call opens another."""
    argv = [sys.executable, "-c", textwrap.dedent(HANDOFF)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    assert out[0] == "parent 3 1", out
    assert out[1].startswith("child 5 1 "), out  # one connection still: the child's call used it
    fds = json.loads(out[1].split(" ", 3)[3])
    kept = json.loads(out[2].removeprefix("kept "))
    others = [fd for fd in fds if fd > 2 and fd not in kept]
    assert len(kept) == 1 and set(kept) <= set(fds) and len(others) == 1, (fds, kept)  # and the listing's own
    assert out[3:] == ["code 0", "again 7"], out
