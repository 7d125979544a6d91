"""Faults on one machine: Ctrl-C twice (a real terminal, a real Jupyter kernel), stale handles,
the root cause with a peer that does not cooperate, runs of idle or dead launchers.

Every case ends with nothing of its runs left running.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from faults_helpers import record

from tlaunch import lp_ssh as lp
from tlaunch.testing import pid_alive

pytestmark = pytest.mark.faults

HERE = os.path.dirname(os.path.abspath(__file__))

PROGRAM = """
import os, sys, time
from programs import write_pid
from tlaunch import lp_ssh as lp

OUT = sys.argv[1]

class Stubborn:
    '''Never looks at the stop: only signals end it.'''
    def run(self):
        ctx = lp.get_context()
        name = os.path.join(OUT, f"{ctx.label}_{ctx.index}")
        lp.register_stop_handler(lambda: open(name + ".stopped", "w").close())
        write_pid(name + ".pid")
        while True:
            time.sleep(0.1)

p = lp.Program("stubborn")
with p.group("stubborn"):
    for _ in range(2):
        p.add_node(lp.PyClassNode(Stubborn))
"""


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), HERE]), "PYTHONUNBUFFERED": "1"}


def _pids(out: Path, n: int, timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(list(out.glob("*.pid"))) < n:
        assert time.monotonic() < deadline, "the nodes did not start"
        time.sleep(0.05)
    time.sleep(0.1)
    return [int(f.read_text()) for f in out.glob("*.pid")]


def _gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _kill_all(pids: list[int]) -> None:
    for p in pids:
        if pid_alive(p):
            os.kill(p, signal.SIGKILL)


class Terminal:
    """A program in a real pseudo-terminal: Ctrl-C there reaches its foreground process group."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # pragma: no cover - the child
            os.execvpe(argv[0], argv, env)
        self.output = b""
        self.code: int | None = None

    def read(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if select.select([self.fd], [], [], 0.05)[0]:
                try:
                    self.output += os.read(self.fd, 65536)
                except OSError:
                    return

    def ctrl_c(self) -> None:
        os.write(self.fd, b"\x03")

    def wait(self, timeout: float) -> int | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.code = os.waitstatus_to_exitcode(status)
                self.read(0.2)
                return self.code
            self.read(0.05)
        return None

    def close(self) -> None:
        if self.code is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.fd)


def test_ctrl_c_twice_in_a_terminal_kills_at_once(tmp_path: Path) -> None:
    """The first Ctrl-C stops gracefully (30 s of grace); the second kills everything at once."""
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM + "lp.launch(p, stop_grace=30)\n")
    term = Terminal([sys.executable, str(script), str(out)], _env(tmp_path))
    pids: list[int] = []
    try:
        pids = _pids(out, 2)
        term.ctrl_c()
        term.read(0.7)  # the graceful stop is under way: it would wait 30 s for these nodes
        t0 = time.monotonic()
        term.ctrl_c()
        assert term.wait(10) is not None, term.output.decode(errors="replace")
        assert _gone(pids, 2.0)
        elapsed = time.monotonic() - t0
    finally:
        term.close()
        _kill_all(pids)
    text = term.output.decode(errors="replace")
    assert "interrupted again: killing run" in text and "KeyboardInterrupt" in text, text
    assert elapsed < 5
    record("Ctrl-C twice (local_mp, terminal)", None, elapsed, {})


def _notebook(
    cells: list[str], tmp_path: Path, during_first: Callable[[Callable[[], None]], None] | None = None
) -> list[str]:
    """Run ``cells`` in a real IPython kernel (nbclient).

    ``during_first(interrupt)`` runs in a thread while the first cell executes.
    Returns each cell's text output (streams and errors).
    """
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True)
    env = {**_env(tmp_path), "JUPYTER_PLATFORM_DIRS": "1"}
    outputs = []
    with client.setup_kernel(env=env, cwd=str(tmp_path)):
        for i, cell in enumerate(nb.cells):
            helper = None
            if i == 0 and during_first is not None:
                kernel = client.km.provisioner.pid  # what Jupyter's interrupt does: SIGINT to the kernel

                def interrupt(pid: int = kernel) -> None:
                    os.kill(pid, signal.SIGINT)

                helper = threading.Thread(target=during_first, args=(interrupt,), daemon=True)
                helper.start()
            client.execute_cell(cell, i)
            if helper is not None:
                helper.join(30)
            text = ""
            for o in cell.outputs:  # streams, and what rich displays in a kernel (its text form)
                text += (
                    o.get("text", "")
                    + o.get("data", {}).get("text/plain", "")
                    + (f"{o['ename']}: {o['evalue']}" if o.get("output_type") == "error" else "")
                )
            outputs.append(text)
    return outputs


def test_ctrl_c_twice_in_a_notebook_leaves_nothing(tmp_path: Path) -> None:
    """In a kernel that lives on, two interrupts during the teardown must still kill every node."""
    out = tmp_path / "out"
    out.mkdir()
    first = textwrap.dedent(PROGRAM).replace("OUT = sys.argv[1]", f"OUT = {str(out)!r}")
    first += "lp.launch(p, stop_grace=30)\n"
    check = (
        "import time\nfrom tlaunch.testing import pid_alive\n"
        f"pids = [int(f.read_text()) for f in __import__('pathlib').Path({str(out)!r}).glob('*.pid')]\n"
        "deadline = time.monotonic() + 3\n"
        "while any(pid_alive(p) for p in pids) and time.monotonic() < deadline: time.sleep(0.05)\n"
        "print('alive', [p for p in pids if pid_alive(p)], len(pids))\n"
    )

    def twice(interrupt: Callable[[], None]) -> None:
        _pids(out, 2)  # the nodes run
        interrupt()  # the graceful stop begins: it would give them 30 s
        time.sleep(0.7)
        interrupt()

    outputs = _notebook([first, check], tmp_path, twice)
    pids = [int(f.read_text()) for f in out.glob("*.pid")]
    try:
        assert "KeyboardInterrupt" in outputs[0], outputs
        assert "alive [] 2" in outputs[1], outputs
    finally:
        _kill_all(pids)


COUNTER = """
from tlaunch import lp_ssh as lp

class Counter:
    def __init__(self, base):
        self.base = base

    def get(self):
        return self.base + 1

def make(base):
    p = lp.Program("counter")
    h = p.add_node(lp.CourierNode(Counter, base), label="counter")
    return p, h
"""


def test_a_handle_reaches_its_own_programs_run_in_a_notebook(tmp_path: Path) -> None:
    """Re-running a cell makes a new program; the old handle still reaches the old run, or says it ended."""
    cells = [
        COUNTER,
        "p, h = make(10)\nrun1 = lp.launch(p, wait=False)\nold = h\nprint(old.dereference().get())",
        "p, h = make(1000)\nrun2 = lp.launch(p, wait=False)\n"
        "print(h.dereference().get(), old.dereference().get())",
        "run1.stop()\ntry:\n    old.dereference()\nexcept lp.ProgramError as e:\n    print('refused:', e)",
        "run2.stop()\nprint(run1.done, run2.done)",
    ]
    outputs = _notebook(cells, tmp_path)
    assert outputs[1].strip() == "11", outputs
    assert outputs[2].strip() == "1001 11", outputs
    assert "refused: Handle.dereference() needs a running program" in outputs[3], outputs
    assert outputs[4].strip() == "True True", outputs


class Counter:
    def __init__(self, base: int) -> None:
        self.base = base

    def get(self) -> int:
        return self.base + 1


def test_two_runs_at_once_each_handle_reaches_its_own() -> None:
    def make(base: int) -> tuple[lp.Program, lp.Handle]:
        p = lp.Program("counter")
        return p, p.add_node(lp.CourierNode(Counter, base), label="counter")

    p1, h1 = make(10)
    p2, h2 = make(1000)
    with lp.launch(p1, wait=False), lp.launch(p2, wait=False):
        assert (h1.dereference().get(), h2.dereference().get()) == (11, 1001)
    with pytest.raises(lp.ProgramError, match="not running in this process"):
        h1.dereference()


def test_the_root_cause_comes_first_when_a_peer_sleeps(tmp_path: Path) -> None:
    """SIGKILL of a node while another sleeps: the cause on the terminal at once, launch raises in ~1 s."""
    script = tmp_path / "prog.py"
    script.write_text(
        textwrap.dedent("""
        import os, time
        from tlaunch import lp_ssh as lp

        def victim():
            print("PID", os.getpid(), flush=True)
            time.sleep(1000)

        p = lp.Program("rootcause")
        p.add_node(lp.PyNode(victim), label="victim")
        p.add_node(lp.PyNode(time.sleep, 1000), label="sleeper")
        try:
            lp.launch(p)
        except lp.RunFailedError:
            print("RAISED", flush=True)
        """)
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(tmp_path),
    )
    assert proc.stdout is not None
    seen: dict[str, float] = {}
    t0 = 0.0
    try:
        for line in proc.stdout:
            if "PID" in line and not t0:
                time.sleep(0.3)
                t0 = time.monotonic()
                os.kill(int(line.split("PID")[1].split()[0]), signal.SIGKILL)
            elif t0 and "victim/0" in line and "SIGKILL" in line:
                seen.setdefault("report", time.monotonic() - t0)
            elif line.startswith("RAISED"):
                seen["raised"] = time.monotonic() - t0
    finally:
        try:
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
    assert seen.get("report", 99) < 0.5 and seen.get("raised", 99) < 2.0, seen
    record("root cause, sleeping peer (local_mp)", seen["report"], seen["raised"], {})


@pytest.fixture
def idle_launcher(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, list[int], Path]]:
    """A launcher that launched with wait=False and then idles, as a notebook does."""
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "prog.py"
    script.write_text(
        PROGRAM + "run = lp.launch(p, wait=False, stop_grace=1)\nprint('RUN', run.run_id, flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out)], stdout=subprocess.PIPE, env=_env(tmp_path)
    )
    assert proc.stdout is not None
    pids: list[int] = []
    try:
        run_id = proc.stdout.readline().decode().split()[1]
        pids = _pids(out, 2)
        yield proc, run_id, pids, tmp_path
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        _kill_all(pids)


def cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.main", *args], capture_output=True, text=True, timeout=timeout
    )


def test_tlaunch_stop_of_an_idle_launchers_run(idle_launcher) -> None:  # type: ignore[no-untyped-def]
    proc, run_id, pids, _ = idle_launcher
    t0 = time.monotonic()
    stopped = cli("stop", run_id)
    elapsed = time.monotonic() - t0
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert elapsed < 10 and _gone(pids, 2.0)
    shown = cli("ps", run_id).stdout
    assert f"run {run_id}" in shown and ": ended" in shown
    assert "running" not in shown and "serving" not in shown, shown
    assert proc.poll() is None  # the launcher itself goes on idling


def test_a_run_whose_launcher_died_is_ended_at_once(idle_launcher) -> None:  # type: ignore[no-untyped-def]
    """A kernel restart: the launcher is gone, its nodes with it; ps says so, quickly."""
    proc, run_id, pids, _ = idle_launcher
    proc.kill()
    proc.wait()
    assert _gone(pids, 3.0)  # they die with their launcher
    t0 = time.monotonic()
    listing = cli("ps")
    assert time.monotonic() - t0 < 2.5, "ps took as long as a timeout"
    line = next(line for line in listing.stdout.splitlines() if run_id in line)
    assert "ended" in line, listing.stdout
    assert "its launcher is gone" in cli("ps", run_id).stdout
    assert "already ended" in cli("stop", run_id).stdout


def test_logs_follow_then_ctrl_c_exits_quietly(idle_launcher) -> None:  # type: ignore[no-untyped-def]
    _, run_id, _, _ = idle_launcher
    follower = subprocess.Popen(
        [sys.executable, "-m", "tlaunch.cli.main", "logs", run_id, "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        time.sleep(1.5)
        follower.send_signal(signal.SIGINT)
        out, _ = follower.communicate(timeout=10)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 130 and "Traceback" not in out, out


def test_a_node_ends_itself_after_a_stop_whatever_its_launcher_does(idle_launcher) -> None:  # type: ignore[no-untyped-def]
    """The stop reaches the nodes, then the launcher freezes (Ctrl-Z): they end within grace + 1 s."""
    proc, run_id, pids, _ = idle_launcher  # stop_grace=1
    from tlaunch.control import find_record
    from tlaunch.runtime.records import coordinator_client

    run_dir, rec = find_record(run_id)
    client = coordinator_client(run_dir, rec)
    try:
        client.stop("the test stops the run")
    finally:
        client.close()
    out = idle_launcher[3] / "out"
    deadline = time.monotonic() + 10
    while len(list(out.glob("*.stopped"))) < 2:  # the stop has reached both nodes
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGSTOP)  # nothing the launcher would do happens now
    t0 = time.monotonic()
    try:
        assert _gone(pids, 4.0), "nodes outlived the stop's grace with their launcher frozen"
        elapsed = time.monotonic() - t0
    finally:
        proc.send_signal(signal.SIGCONT)
    assert elapsed < 1 + 1 + 1.0
    record("launcher frozen after a stop: nodes end themselves", None, elapsed, {})
