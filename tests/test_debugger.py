"""The debugger on this machine: a node's pause as its run's state shows it, a session through
:mod:`tlaunch.control.debug` (what ``tlaunch debug`` uses), ``q`` and a lost session letting the
node go on, and the pdb's own behaviour over a connection (``interact``, breakpoints kept)."""

from __future__ import annotations

import contextlib
import os
import re
import ssl
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from tlaunch import control
from tlaunch.control import debug
from tlaunch.errors import DebugError


@pytest.fixture(autouse=True)
def _no_launcher_left() -> Iterator[None]:
    yield
    while Launcher.started:
        Launcher.started.pop().kill()


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
    """``python SCRIPT`` in a new process; its output gathered by a thread. Every one started is
    killed at the test's end if it is still there (a failed test leaves no launcher, nor its nodes)."""

    started: ClassVar[list[Launcher]] = []

    def __init__(self, script: str) -> None:
        import subprocess

        self.proc = subprocess.Popen(
            [sys.executable, script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        Launcher.started.append(self)
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

    def kill(self) -> None:
        """Stop it now if it still runs (SIGTERM: it stops its run; its nodes die with it)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)

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
    other = snap.node("other/0").state  # the run is not stopped yet (other/0 may still be starting)
    assert not snap.ended and other not in ("done", "failed", "stopped"), other
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


NOTEBOOK_CELL = """
from tlaunch import lp_ssh as lp

def learner():
    seen = "in a notebook"
    breakpoint()
    print("learner goes on", flush=True)

p = lp.Program("nb")
p.add_node(lp.PyNode(learner), label="learner")
run = lp.launch(p, launch_type="local_mp")
print("ended", run.snapshot().state)
"""


def test_a_breakpoint_in_a_notebooks_node_says_the_command_in_the_cell(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The launching cell shows where the node waits and the command that attaches; attached from
    elsewhere (as a terminal would), the cell finishes."""
    sys.path.insert(0, os.path.dirname(__file__))
    from test_faults_local import _notebook

    attached: list[str] = []

    def attach(_interrupt: object) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = debug.paused_everywhere()
            if found:
                sock = debug.connect(control.find_run(found[0].run_id), "learner/0").sock
                _read_until(sock, "(Pdb) ")
                sock.sendall(b"p seen\n")
                attached.append(_read_until(sock, "(Pdb) "))
                sock.sendall(b"c\n")
                _read_until(sock, "detached")
                sock.close()
                return
            time.sleep(0.2)

    (out,) = _notebook([NOTEBOOK_CELL], tmp_path, during_first=attach)
    out = re.sub(r"\x1b\[[0-9;]*m", "", out)  # the prefixes' colours
    assert "[learner/0] waiting for a debugger: tlaunch debug nb-" in out, out
    assert "learner/0 (breakpoint at" in out and "ended SUCCEEDED" in out, out
    assert attached and "'in a notebook'" in attached[0], attached


THREADS = """
from tlaunch import lp_ssh as lp

def learner():
    secret = 40 + 2
    breakpoint()
    print("learner goes on with", secret, flush=True)

p = lp.Program("thr")
p.add_node(lp.PyNode(learner), label="learner")
run = lp.launch(p, launch_type="local_mt", wait=True)
print("program ended:", run.snapshot().state, flush=True)
"""


def test_a_node_thread_pauses_in_the_launchers_terminal(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Threads: the run is the launching process's alone, so its terminal is the node's pdb."""
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(sys.executable, [_program(tmp_path, THREADS)], encoding="utf-8", timeout=60)
    try:
        child.expect(r"tlaunch: learner/0 paused \(breakpoint at prog.py:7\): this terminal is its pdb")
        child.expect(r"\(Pdb\) ")
        child.sendline("p secret")
        child.expect(r"\r\n42\r\n")
        child.expect(r"\(Pdb\) ")
        child.sendline("c")
        child.expect("learner goes on with 42")
        child.expect("program ended: SUCCEEDED")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)


def test_the_ranks_sitecustomize_runs_the_interpreters_own_after_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """tlaunch's ``sitecustomize`` (on ranks' ``PYTHONPATH`` under post-mortem) shadows none of yours."""
    import subprocess

    import tlaunch.runtime.debugger as debugger_pkg

    site = os.path.join(os.path.dirname(debugger_pkg.__file__), "site")
    (tmp_path / "sitecustomize.py").write_text("print('yours ran', flush=True)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([site, str(tmp_path)]), "RANK": "0"}
    env["TLAUNCH_DEBUG"] = "post-mortem"
    code = "import sys; print(sys.excepthook.__name__, sys.modules['sitecustomize'].__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    # Without a node's ticket there is nothing to pause for: the hook stays Python's own.
    assert out.stdout.splitlines() == ["yours ran", f"excepthook {os.path.join(site, 'sitecustomize.py')}"]


def _shown(message: dict[str, Any]) -> str:
    """What a kernel's output message shows as text (a stream, or what rich displays)."""
    content = message["content"]
    if message["msg_type"] == "stream":
        return str(content["text"])
    if message["msg_type"] in ("display_data", "execute_result"):
        return str(content.get("data", {}).get("text/plain", "")) + "\n"
    return ""


def test_a_breakpoint_in_a_notebooks_node_opens_pdb_in_the_cell(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A frontend that answers input() (a notebook in Jupyter): the launching cell is the node's pdb,
    each prompt an input request of the kernel; ``c`` lets the node go on and the cell finishes."""
    import queue

    jupyter_client = pytest.importorskip("jupyter_client")
    sys.path.insert(0, os.path.dirname(__file__))
    from test_faults_local import _env

    env = {**_env(tmp_path), "JUPYTER_PLATFORM_DIRS": "1"}
    manager, client = jupyter_client.manager.start_new_kernel(
        kernel_name="python3", cwd=str(tmp_path), env=env
    )
    answers, prompts, out = iter(["p seen", "c"]), [], []
    try:
        cell = client.execute(NOTEBOOK_CELL, allow_stdin=True)
        deadline = time.monotonic() + 90
        while True:
            assert time.monotonic() < deadline, "".join(out)
            with contextlib.suppress(queue.Empty):
                request = client.get_stdin_msg(timeout=0.05)
                if request["msg_type"] == "input_request":
                    prompts.append(request["content"]["prompt"])
                    client.input(next(answers))
            with contextlib.suppress(queue.Empty):
                message = client.get_iopub_msg(timeout=0.05)
                out.append(_shown(message))
            with contextlib.suppress(queue.Empty):
                reply = client.get_shell_msg(timeout=0.05)
                if reply["parent_header"].get("msg_id") == cell:
                    assert reply["content"]["status"] == "ok", reply["content"]
                    break
        while True:  # what the cell printed last
            try:
                message = client.get_iopub_msg(timeout=1.0)
            except queue.Empty:
                break
            out.append(_shown(message))
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    text = re.sub(r"\x1b\[[0-9;]*m", "", "".join(out))
    assert prompts == ["(Pdb) ", "(Pdb) "], (prompts, text)
    assert "[learner/0] waiting for a debugger: tlaunch debug nb-" in text, text
    assert "this cell is the pdb of learner/0" in text and "'in a notebook'" in text, text
    assert "learner goes on" in text and "ended SUCCEEDED" in text, text
