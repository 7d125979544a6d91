"""``tlaunch.control``: a run found again by id from another process, followed, stopped, waited for.

Every run here is real: a launcher process of its own (as a notebook or a
script is), its nodes real processes, its record read back from
``$TLAUNCH_HOME``. The SSH, SLURM and LPJob forms of the same calls are in
``test_ssh_lifecycle.py``, ``test_slurm.py`` and the Kubernetes tests.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tlaunch import control
from tlaunch import lp_ssh as lp
from tlaunch.control import RunHandle, RunNotFoundError, RunState

PROGRAM = textwrap.dedent(
    """
    import sys, time
    from tlaunch import lp_ssh as lp

    def talk(n):
        for i in range(n):
            print("hello", i, flush=True)
            time.sleep(0.2)

    def fail():
        time.sleep(0.5)
        raise ValueError("bad input 42")

    mode = sys.argv[1]
    p = lp.Program("chatty")
    p.add_node(lp.PyNode(talk, 8), label="talker")
    if mode == "fail":
        p.add_node(lp.PyNode(fail), label="failer")
    if mode == "idle":
        p.add_node(lp.PyNode(time.sleep, 600), label="sleeper")
    run = lp.launch(p, launch_type="local_mp", wait=False, stop_grace=1)
    print("RUN", run.run_id, flush=True)
    try:
        run.wait()
    except ValueError:
        pass
    time.sleep(600 if mode == "idle" else 0)
    """
)


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[object]:
    """Starts ``PROGRAM`` in a launcher process of its own; yields ``start(mode) -> (proc, run_id)``."""
    procs: list[subprocess.Popen[str]] = []
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)

    def start(mode: str) -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("RUN "), line
        return proc, line.split()[1]

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # its launcher tears the run down
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_local_run_is_followed_to_its_end_from_another_process(launcher) -> None:  # type: ignore[no-untyped-def]
    proc, run_id = launcher("ok")
    run = control.find_run(run_id)
    assert isinstance(run, RunHandle) and run.run_id == run_id and run.backend == "local_mp"
    lines = list(run.logs(follow=True))  # returns once the run has ended
    said = [line.text for line in lines if line.node == "talker/0"]
    assert said == [f"hello {i}" for i in range(8)], lines
    assert str(lines[0]) == "[talker_0] hello 0"  # as `tlaunch logs` prints it
    snap = run.snapshot()
    assert snap.state is RunState.SUCCEEDED and snap.ended and snap.failure is None, snap
    assert [(n.key, n.state) for n in snap.nodes] == [("talker/0", "done")]
    assert proc.wait(20) == 0


def test_a_prefix_of_the_id_finds_the_run_and_a_wrong_one_says_what_there_is(launcher) -> None:  # type: ignore[no-untyped-def]
    _, run_id = launcher("ok")
    assert control.find_run(run_id[:-3]).run_id == run_id
    assert any(r.run_id == run_id for r in control.list_runs())
    with pytest.raises(RunNotFoundError, match=f"no run 'nope' in .*known runs: .*{run_id}"):
        control.find_run("nope")
    with pytest.raises(LookupError):  # RunNotFoundError is a LookupError too
        control.find_run("nope")


def test_stop_from_another_process_ends_the_run_stopped(launcher) -> None:  # type: ignore[no-untyped-def]
    proc, run_id = launcher("idle")
    run = control.find_run(run_id)
    deadline = time.monotonic() + 20
    while run.snapshot().state is not RunState.RUNNING:
        assert time.monotonic() < deadline, run.snapshot()
        time.sleep(0.1)
    assert {n.key for n in run.snapshot().nodes} == {"talker/0", "sleeper/0"}
    run.stop()
    snap = run.snapshot()
    assert snap.state is RunState.STOPPED, snap
    assert "tlaunch stop" in (snap.reason or ""), snap.reason
    run.stop()  # idempotent
    assert proc.poll() is None  # the launcher goes on idling: only its run ended


def test_a_failed_run_carries_its_root_cause(launcher) -> None:  # type: ignore[no-untyped-def]
    proc, run_id = launcher("fail")
    run = control.find_run(run_id)
    final = run.wait(timeout=60)
    snap = run.snapshot()
    assert final == snap or getattr(final, "state", None) is RunState.FAILED
    assert snap.state is RunState.FAILED and snap.failure is not None
    assert snap.failure.node == "failer/0" and snap.failure.exception == "ValueError: bad input 42"
    assert isinstance(snap.failure.error(), ValueError)
    assert proc.wait(20) == 0


def _fails() -> None:
    raise ValueError("bad input 42")


def test_join_is_one_contract_whoever_holds_the_handle(launcher) -> None:  # type: ignore[no-untyped-def]
    """The same kind of failed run, joined from its launcher (``launch()``'s Run) and through the run
    store (``control.find_run``): both raise its root cause (a RunFailedError that is a ValueError too);
    a run that goes on raises TimeoutError, and a run that succeeded returns its final snapshot."""
    _, run_id = launcher("fail")
    with pytest.raises(ValueError, match="bad input 42") as caught:
        control.find_run(run_id).join(timeout=60)
    assert caught.value.node == "failer/0"  # type: ignore[attr-defined]
    p = lp.Program("joined")
    p.add_node(lp.PyNode(_fails), label="failer")
    run = lp.launch(p, launch_type="local_mp", terminal="output_to_files", wait=False)
    try:
        with pytest.raises(ValueError, match="bad input 42") as own:
            run.join(timeout=60)
        with pytest.raises(ValueError, match="bad input 42") as found:
            control.find_run(run.run_id).join(timeout=10)
        assert own.value.node == found.value.node == "failer/0"  # type: ignore[attr-defined]
    finally:
        run.stop()
    _, idle = launcher("idle")
    with pytest.raises(TimeoutError, match=f"run {idle} is still"):
        control.find_run(idle).join(timeout=0.5)
    _, ok = launcher("ok")
    assert control.find_run(ok).join(timeout=60).state is RunState.SUCCEEDED


def test_a_run_whose_launcher_was_killed_is_lost_with_the_reason(launcher) -> None:  # type: ignore[no-untyped-def]
    proc, run_id = launcher("idle")
    run = control.find_run(run_id)
    while not run.snapshot().nodes or run.snapshot().state is RunState.PENDING:
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    snap = run.snapshot()
    assert snap.state is RunState.LOST and "its launcher is gone" in (snap.reason or ""), snap
    assert control.find_run(run_id).snapshot().state is RunState.LOST  # recorded: the same from a new handle


READER = """
import sys
from tlaunch import control
run = control.find_run(sys.argv[1])
snap = run.snapshot()
print("SEEN", snap.state.name, sorted(n.key for n in snap.nodes), snap.reason, flush=True)
run.stop()
print("STOPPED", run.snapshot().state.name, flush=True)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare (util-linux)"
)
def test_a_run_is_followed_and_stopped_from_another_pid_namespace(launcher) -> None:  # type: ignore[no-untyped-def]
    """A container, or another machine sharing the home folder, sees the run through its
    coordinator: the launcher's pid names nothing there, and the run is not declared lost."""
    proc, run_id = launcher("idle")
    run = control.find_run(run_id)
    while run.snapshot().state is not RunState.RUNNING:
        time.sleep(0.1)
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", READER, run_id],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "SEEN RUNNING ['sleeper/0', 'talker/0']" in done.stdout, done.stdout
    assert "STOPPED STOPPED" in done.stdout, done.stdout
    snap = run.snapshot()
    assert snap.state is RunState.STOPPED and "tlaunch stop" in (snap.reason or ""), snap
    assert proc.poll() is None  # its launcher tore the run down and goes on idling


def test_the_launchers_own_run_is_a_run_handle(tmp_path: Path) -> None:
    p = lp.Program("inline")
    p.add_node(lp.PyNode(print, "from the node"), label="printer")
    run = lp.launch(p, launch_type="local_mp", terminal="output_to_files", wait=False)
    try:
        assert isinstance(run, RunHandle) and run.backend == "local_mp"
        assert run.wait(timeout=30)
        assert run.snapshot().state is RunState.SUCCEEDED
        assert [line.text for line in run.logs()] == ["from the node"]
        assert control.find_run(run.run_id).snapshot().state is RunState.SUCCEEDED
    finally:
        run.stop()


def test_a_run_that_its_launcher_judges_failed_ends_with_the_root_cause_it_gave() -> None:
    """``Run.stop(kind="failed", failure=...)`` (a torch job's launcher, whose rank failed): the
    run's end record says FAILED and the root cause in one write, so that no reader (the job
    server) sees the run ended FAILED without it (the root cause used to follow in a second write)."""
    import threading

    from tlaunch.runtime.records import read_record

    p = lp.Program("judged")
    p.add_node(lp.PyNode(time.sleep, 30), label="worker")
    run = lp.launch(p, launch_type="local_mp", terminal="output_to_files", wait=False)
    seen: list[object] = []
    done = threading.Event()

    def watch() -> None:  # every end record read while the stop goes on, and once after
        while True:
            last = done.is_set()
            try:
                record = read_record(run.run_dir)
            except (OSError, ValueError):
                record = None
            if record is not None and record.ended:
                seen.append(record.failure)
            if last:
                return

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        report = {"key": "rank 1", "host": "localhost", "exit_code": 3, "reason": "rank 1 exited with 3"}
        run.stop(kind="failed", reason="rank 1 exited with 3", failure=report)
    finally:
        done.set()
        watcher.join()
    assert seen and all(f == report for f in seen), seen[:3]
    snap = control.find_run(run.run_id).snapshot()
    assert snap.state is RunState.FAILED and snap.failure is not None
    assert (snap.failure.node, snap.failure.host, snap.failure.exit_code) == ("rank 1", "localhost", 3)


TRAINER = """
import os, time
out = os.environ["OUT"] + "." + os.environ["RANK"]
with open(out, "w") as f:
    f.write(os.uname().nodename + " " + os.environ["WORLD_SIZE"] + " " + os.environ["TOKEN"])
for i in range(3):
    print("step", i, "rank", os.environ["RANK"], flush=True)
    time.sleep(0.5)
"""


def _cmdlines_with(text: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                line = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if text in line:
            found.append(line)
    return found


@pytest.mark.ssh
def test_a_job_submitted_to_ssh_hosts_runs_on_without_its_caller(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """control.submit(JobSpec, Hosts): a detached launcher; the handle follows it to its end."""
    from tlaunch.jobs import JobSpec

    out = f"/var/tmp/tlaunch-submitted-{os.getpid()}-{time.monotonic_ns()}"
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    token = f"tok-{time.monotonic_ns()}"
    job = JobSpec(
        lpjob_name="hostjob",
        script=[str(script)],
        image="none",
        method="basic",
        num_trainer=2,
        env={"OUT": out, "TOKEN": token},
    )
    run = control.submit(job, control.Hosts(("th1", "th2"), ssh_hosts.ssh_config))
    try:
        assert run.backend == "ssh" and control.find_run(run.run_id).run_id == run.run_id
        assert _cmdlines_with(token) == []  # the environment travels in a 0600 file, then the bundle
        lines = [str(line) for line in run.logs(follow=True)]
        snap = run.snapshot()
        assert snap.state is RunState.SUCCEEDED, str((snap.reason, snap.failure, snap.nodes, lines[-20:]))
        for rank in range(2):
            with open(f"{out}.{rank}") as f:
                assert f.read() == f"{['th1', 'th2'][rank]} 2 {token}"
        assert any("step 2 rank 1" in line for line in lines), lines
        assert ssh_hosts.wait_no_leftovers(run.run_id, 10) == {}
        submitted = Path(os.environ["TLAUNCH_HOME"]) / "submitted"
        assert not list(submitted.glob("*.json"))  # the job's file went as it was read
    finally:
        run.stop()
        for rank in range(2):
            if os.path.exists(f"{out}.{rank}"):
                os.unlink(f"{out}.{rank}")


def test_a_job_that_cannot_start_says_why(tmp_path: Path) -> None:
    from tlaunch.errors import LaunchError
    from tlaunch.jobs import JobSpec

    job = JobSpec(lpjob_name="nohost", script=["train.py"], image="none", method="basic", num_trainer=1)
    with pytest.raises(LaunchError, match=r"job 'nohost' did not start on \['no-such-host-x'\]"):
        control.submit(job, control.Hosts(("no-such-host-x",), str(tmp_path / "empty_config")))


def test_following_an_ssh_runs_logs_while_it_starts_takes_the_logs_its_nodes_will_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run still starting: a host's listing has only the head's log, or nothing. The logs of the
    nodes placed there (the run's graph) are followed all the same (the tail makes them), so a
    node's first lines are not lost to a follower that came early."""
    import types

    from tlaunch.backends.ssh import attached
    from tlaunch.runtime.records import RunRecord

    followed: dict[str, list[str]] = {}

    class Tail:
        def __init__(self, conn: object, paths: list[str], on_line: object, session: str) -> None:
            followed[conn.host] = paths  # type: ignore[attr-defined]

        def start(self) -> None:
            pass

    listings = {"th1": "ps_0.log\n", "th2": ""}  # th1's node only (its head's log not yet); th2: none yet

    def conn(host: str) -> object:
        def run(argv: list[str], check: bool = True) -> object:
            return types.SimpleNamespace(stdout=listings[host])

        return types.SimpleNamespace(host=host, run=run)

    monkeypatch.setattr(attached, "RemoteTail", Tail)
    rec = RunRecord("r-1", "p", "ssh", "", None, hosts=["th1", "th2"], head="th1")
    rec.graph = [
        {"key": "ps/0", "host": "th1"},
        {"key": "trainer/0", "host": "th2"},
        {"key": "x/0", "host": None},
    ]
    run = attached.SSHRun.__new__(attached.SSHRun)
    keys = {"ps_0.log": "ps/0", "trainer_0.log": "trainer/0"}
    run._start_tails(rec, {h: conn(h) for h in rec.hosts}, keys, None)
    logs = ".tlaunch/runs/r-1/logs"
    assert followed == {
        "th1": [f"{logs}/coordinator.log", f"{logs}/ps_0.log"],
        "th2": [f"{logs}/trainer_0.log"],
    }
    followed.clear()
    run._start_tails(rec, {h: conn(h) for h in rec.hosts}, keys, "trainer/0")  # one node's
    assert followed == {"th2": [f"{logs}/trainer_0.log"]}
