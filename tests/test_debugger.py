"""The debugger on this machine: a node's pause as its run's state shows it, a session through
:mod:`tlaunch.control.debug` (what ``tlaunch debug`` uses), ``q`` and a lost session letting the
node go on, and the pdb's own behaviour over a connection (``interact``, breakpoints kept)."""

from __future__ import annotations

import os
import ssl
import sys
import textwrap
import threading
import time

import pytest

from tlaunch import control
from tlaunch.control import debug
from tlaunch.errors import DebugError


def _read_until(sock: ssl.SSLSocket, marker: str, timeout: float = 30.0) -> str:
    sock.settimeout(timeout)
    got = ""
    while marker not in got:
        chunk = sock.recv(4096).decode()
        if not chunk:
            break
        got += chunk
    return got


def _program(tmp_path, body: str) -> str:  # type: ignore[no-untyped-def]
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(body))
    return str(script)


class Launcher:
    """``python SCRIPT`` in a new process; its output gathered by a thread."""

    def __init__(self, script: str) -> None:
        import subprocess

        self.proc = subprocess.Popen(
            [sys.executable, script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self.paused = threading.Event()
        self.run_id = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        assert self.paused.wait(60), f"no pause announced: {self.lines}"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                self.lines.append(line)
                if "waiting for a debugger: tlaunch debug" in line and not self.run_id:
                    self.run_id = line.split("tlaunch debug ")[1].split()[0]
                    self.paused.set()

    def wait(self) -> str:
        """Its exit code is 0; what it printed."""
        assert self.proc.wait(30) == 0
        self._reader.join(10)
        return "".join(self.lines)


PROGRAM = """
from tlaunch import lp_ssh as lp


def work():
    values = [1, 2, 3]
    total = 0
    for v in values:
        total += v
    breakpoint()
    print("total is", total, flush=True)
    total *= 10
    print("now", total, flush=True)


if __name__ == "__main__":
    program = lp.Program("dbg")
    program.add_node(lp.PyNode(work), label="worker")
    run = lp.launch(program, launch_type="local_mp")
    print("program ended:", run.snapshot().state, flush=True)
"""


def test_a_session_steps_sets_a_breakpoint_and_quits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    launcher = Launcher(_program(tmp_path, PROGRAM))
    handle = control.find_run(launcher.run_id)
    (found,) = debug.paused(handle)
    assert (found.node, found.pause.at, found.pause.kind, found.pause.function) == (
        "worker/0", "prog.py:11", "breakpoint", "work"
    )  # fmt: skip
    assert found.pause.pid == handle.snapshot().node("worker/0").pid and not found.pause.attached
    session = debug.connect(handle, "worker/0")
    sock = session.sock
    assert session.greeting.startswith("tlaunch: attached to worker/0 on localhost")
    assert "(Pdb) " in _read_until(sock, "(Pdb) ")
    assert debug.paused(handle)[0].pause.attached
    sock.sendall(b"p total, values\n")
    assert "(6, [1, 2, 3])" in _read_until(sock, "(Pdb) ")
    sock.sendall(b"b 13\n")  # a breakpoint: `c` keeps the session for it
    assert "Breakpoint 1" in _read_until(sock, "(Pdb) ")
    sock.sendall(b"c\n")
    assert "prog.py(13)work()" in _read_until(sock, "(Pdb) ")
    sock.sendall(b"interact\n")
    _read_until(sock, ">>> ")
    sock.sendall(b"print(total * 2)\n")
    assert "120" in _read_until(sock, ">>> ")
    sock.sendall(b"\x04\n")  # not an EOF of the stream: a line the console rejects
    _read_until(sock, ">>> ")
    sock.close()  # the debugger leaves: the console reads its end, then pdb does: the node goes on
    out = launcher.wait()
    assert "now 60" in out and "program ended: SUCCEEDED" in out, out
    assert "left (lost)" in out, out


def test_quit_lets_the_node_go_on_and_clears_the_pause(tmp_path) -> None:  # type: ignore[no-untyped-def]
    launcher = Launcher(_program(tmp_path, PROGRAM))
    handle = control.find_run(launcher.run_id)
    sock = debug.connect(handle, "worker/0").sock
    _read_until(sock, "(Pdb) ")
    sock.sendall(b"b 13\n")
    _read_until(sock, "(Pdb) ")
    sock.sendall(b"q\n")  # quits the debugger, not the node; its breakpoint goes too
    assert "the node goes on; detached" in _read_until(sock, "detached")
    sock.close()
    deadline = time.monotonic() + 10
    while debug.paused(handle) and not handle.snapshot().ended and time.monotonic() < deadline:
        time.sleep(0.1)
    out = launcher.wait()
    assert "now 60" in out and "program ended: SUCCEEDED" in out, out
    with pytest.raises(DebugError, match="not waiting in a debugger"):
        debug.connect(handle, "worker/0")


def test_breakpoint_outside_a_node_is_the_terminals_pdb(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tlaunch.runtime import debugger

    called = []
    monkeypatch.setattr(sys, "__breakpointhook__", lambda *a, **k: called.append(a))
    debugger.breakpointhook()
    assert called == [()]
    monkeypatch.setenv("PYTHONBREAKPOINT", "0")
    hook = sys.breakpointhook
    debugger.install()  # the user's PYTHONBREAKPOINT stands
    assert sys.breakpointhook is hook
    assert os.environ["PYTHONBREAKPOINT"] == "0"


POST_MORTEM = """
import os
from tlaunch import lp_ssh as lp


def learner():
    step = 3
    ratio = 1 / (step - 3)


def other():
    lp.wait_for_stop()


if __name__ == "__main__":
    program = lp.Program("pm")
    program.add_node(lp.PyNode(learner), label="learner")
    program.add_node(lp.PyNode(other), label="other")
    try:
        lp.launch(program, launch_type="local_mp")  # TLAUNCH_DEBUG=post-mortem
    except lp.RunFailedError as exc:
        print("launch raised:", str(exc).splitlines()[0], flush=True)
"""


def test_post_mortem_holds_a_raising_node_at_its_frame(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TLAUNCH_DEBUG", "post-mortem")
    launcher = Launcher(_program(tmp_path, POST_MORTEM))
    assert "(post-mortem at prog.py:8: ZeroDivisionError: division by zero)" in "".join(launcher.lines)
    handle = control.find_run(launcher.run_id)
    snap = handle.snapshot()
    assert not snap.ended and snap.node("other/0").state in (
        "starting",
        "running",
    )  # the run is not stopped yet
    assert snap.node("learner/0").paused.exception == "ZeroDivisionError: division by zero"
    sock = debug.connect(handle, "learner/0").sock
    frame = _read_until(sock, "(Pdb) ")
    assert "prog.py(8)learner()" in frame and "-> ratio = 1 / (step - 3)" in frame, frame
    sock.sendall(b"p step\n")
    assert "3" in _read_until(sock, "(Pdb) ")
    sock.sendall(b"c\n")
    _read_until(sock, "detached")
    sock.close()
    out = launcher.wait()
    assert (
        "launch raised: node 'learner/0' on host 'localhost' exited with code 1; held for a post-mortem: "
        "a debugger was attached for" in out
    ), out
    assert handle.snapshot().failure.reason.startswith("exited with code 1; held for a post-mortem")


def test_a_post_mortem_nobody_attaches_to_ends_in_its_time(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TLAUNCH_DEBUG", "post-mortem")
    monkeypatch.setenv("TLAUNCH_DEBUG_TIMEOUT", "1")
    out = Launcher(_program(tmp_path, POST_MORTEM)).wait()
    assert "held for a post-mortem: no debugger came within 1 s" in out, out


def test_a_bad_debug_mode_is_refused_before_anything_starts(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tlaunch import lp_ssh as lp

    program = lp.Program("bad")
    program.add_node(lp.PyNode(print), label="x")
    with pytest.raises(
        lp.LaunchError, match=r"debug='post_mortem' is not a debug mode: use one of \['post-mortem'\]"
    ):
        lp.launch(program, launch_type="local_mt", debug="post_mortem")
    monkeypatch.setenv("TLAUNCH_DEBUG", "yes")
    with pytest.raises(lp.LaunchError, match=r"\$TLAUNCH_DEBUG='yes' is not a debug mode"):
        lp.launch(program, launch_type="local_mt")
