"""The fault suite: kill -9 of each part, lost links, Ctrl-C at every phase, stop racing a crash.

Every case asserts its outcome, then that no process, tmux session or secret file
of the run is left on any host. With ``TLAUNCH_FAULT_REPORT=file.json`` each case
records its detection and cleanup times (the table of the issue note).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from faults_helpers import Caller, Echo, Spinner, record, remote, remote_pid, wait_state

from tlaunch import lp_ssh as lp

pytestmark = [pytest.mark.ssh, pytest.mark.faults]


def spinners(hosts: list[str], name: str = "spin") -> lp.Program:
    program = lp.Program(name)
    with program.group("spinner"):
        for h in hosts:
            program.add_node(lp.PyClassNode(Spinner).to_host(h))
    return program


def finish(ssh_hosts: Any, case: str, run: lp.Run, t_fault: float, t_detect: float | None) -> None:
    """Check nothing is left; record detection (wall clock, as the coordinator saw it) and cleanup."""
    left = ssh_hosts.wait_no_leftovers(run.run_id, 20)
    record(case, None if t_detect is None else t_detect - t_fault, time.time() - t_fault, left)
    assert left == {}, left


def detected_at(run: lp.Run, key: str) -> float:
    """When the coordinator recorded ``key``'s end (wall clock)."""
    finished: float = run.status()[key]["finished_at"]
    return finished


def test_kill9_node_without_restarts_fails_the_run(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    run = lp.launch(
        spinners(["th1", "th2", "th3"]), wait=False, ssh_config=ssh_hosts.ssh_config, stop_grace=1
    )
    try:
        pid = wait_state(run, "spinner/1", {"running"})["pid"]
        t0 = time.time()
        remote(ssh_hosts, "th2", "kill", "-9", str(pid))
        with pytest.raises(lp.RunFailedError) as info:
            run.wait(30)
    finally:
        run.stop()
    detected = detected_at(run, "spinner/1")
    err = info.value
    assert (err.node, err.host, err.exit_code) == ("spinner/1", "th2", -9)
    assert "killed by SIGKILL" in str(err)
    assert run.status()["spinner/1"]["finished_at"] is not None
    ps = subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.main", "ps", run.run_id],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "first failure: node spinner/1 on th2 was killed by SIGKILL" in ps  # the same report
    finish(ssh_hosts, "kill -9 node (no restarts)", run, t0, detected)
    assert detected - t0 < 2


def test_kill9_node_with_restarts_left_is_restarted_and_clients_reconnect(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    program = lp.Program("restart")
    echo = program.add_node(lp.CourierNode(Echo).to_host("th2"), label="echo")
    program.add_node(lp.PyClassNode(Caller, echo).to_host("th3"), label="caller")
    run = lp.launch(
        program,
        wait=False,
        ssh_config=ssh_hosts.ssh_config,
        max_restarts={"echo": 1},
        restart_backoff=0.1,
        terminal="output_to_files",
    )
    try:
        client = echo.dereference()
        host, pid = client.whoami()
        assert host == "th2"
        t0 = time.time()
        remote(ssh_hosts, "th2", "kill", "-9", str(pid))
        deadline = time.monotonic() + 20
        while True:  # the launcher's own client reconnects to the new process
            try:
                new_host, new_pid = client.whoami()
                if new_pid != pid:
                    break
            except lp.RPCError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.05)
        detected = time.time()
        assert new_host == "th2"
        rec = run.status()["echo/0"]
        assert rec["restarts"] == 1 and rec["state"] == "serving"
        assert run.status()["caller/0"]["state"] == "running" and not run.done
        log = remote(ssh_hosts, "th3", "cat", f".tlaunch/runs/{run.run_id}/logs/caller_0.log")
        assert f"answer th2 {new_pid}" in log  # the other node's client reconnected too
    finally:
        run.stop()
    finish(ssh_hosts, "kill -9 node (restart left)", run, t0, detected)


def test_kill9_supervisor(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    run = lp.launch(spinners(["th1", "th3"]), wait=False, ssh_config=ssh_hosts.ssh_config, stop_grace=1)
    try:
        rec = wait_state(run, "spinner/1", {"running"})
        t0 = time.time()
        remote(ssh_hosts, "th3", "kill", "-9", str(rec["supervisor_pid"]))
        with pytest.raises(lp.RunFailedError) as info:
            run.wait(30)
    finally:
        run.stop()
    assert info.value.node == "spinner/1" and "supervisor died" in str(info.value)
    detected = detected_at(run, "spinner/1")
    assert detected - t0 < 2
    finish(ssh_hosts, "kill -9 supervisor", run, t0, detected)


def test_kill9_coordinator(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    run = lp.launch(
        spinners(["th1", "th2"]),
        wait=False,
        ssh_config=ssh_hosts.ssh_config,
        stop_grace=1,
        coordinator_timeout=3,
    )
    try:
        wait_state(run, "spinner/1", {"running"})
        head = remote_pid(ssh_hosts, "th1", f"{sys.executable} -m tlaunch.runtime.head")
        t0 = time.time()
        remote(ssh_hosts, "th1", "kill", "-9", str(head))
        with pytest.raises(lp.RunFailedError) as info:
            run.wait(30)
    finally:
        run.stop()
    detected = run._coord.lost_at  # type: ignore[attr-defined]  # when the launcher saw it gone
    assert "coordinator on th1 was lost" in str(info.value)
    assert detected - t0 < 2 + 2
    finish(ssh_hosts, "kill -9 coordinator", run, t0, detected)


def launcher(tmp_path: Path, body: str) -> subprocess.Popen[str]:
    script = tmp_path / "launcher.py"
    script.write_text(
        "import sys, time\nfrom tlaunch import lp_ssh as lp\nfrom faults_helpers import Spinner\n"
        + textwrap.dedent(body)
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.path.dirname(__file__)])}
    return subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def new_run_ids(before: set[str]) -> list[str]:
    from tlaunch.launcher import runs_dir

    return sorted(set(os.listdir(runs_dir())) - before) if os.path.isdir(runs_dir()) else []


def runs_now() -> set[str]:
    from tlaunch.launcher import runs_dir

    return set(os.listdir(runs_dir())) if os.path.isdir(runs_dir()) else set()


def remote_runs(ssh_hosts: Any) -> dict[str, set[str]]:
    return {
        h.name: set(remote(ssh_hosts, h.name, "ls", "-1", ".tlaunch/runs").split()) for h in ssh_hosts.hosts
    }


PROGRAM = """
p = lp.Program("ctrlc")
with p.group("spinner"):
    for h in ["th1", "th2", "th3", "th4"]:
        p.add_node(lp.PyClassNode(Spinner).to_host(h))
"""


def test_kill9_launcher(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = launcher(
        tmp_path,
        PROGRAM
        + f"run = lp.launch(p, wait=False, ssh_config={ssh_hosts.ssh_config!r}, coordinator_timeout=3, "
        "stop_grace=1)\nprint('RUN', run.run_id, flush=True)\ntime.sleep(600)\n",
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    run_id = line.split()[1]
    t0 = time.monotonic()
    proc.kill()
    proc.wait()
    proc.stdout.close()
    left = ssh_hosts.wait_no_leftovers(run_id, 20)
    record("kill -9 launcher", None, time.monotonic() - t0, left)
    assert left == {}
    assert time.monotonic() - t0 < 3 + 1 + 5


# Test hosts share this machine's process table: a duration nothing else uses.
SETUP_SLEEP = "59.8071"


@pytest.mark.parametrize("phase", ["preflight", "shipping", "running"])
def test_ctrl_c(ssh_hosts, tmp_path: Path, phase: str) -> None:  # type: ignore[no-untyped-def]
    before_local, before_remote = runs_now(), remote_runs(ssh_hosts)
    options = f"ssh_config={ssh_hosts.ssh_config!r}, stop_grace=1"
    if phase == "preflight":
        options += f", setup=['sleep {SETUP_SLEEP}']"  # preflight runs it on every host
    if phase == "shipping":
        work = tmp_path / "work"
        work.mkdir()
        (work / "blob.bin").write_bytes(os.urandom(48 * 2**20))
        options += f", working_dir={str(work)!r}, working_dir_limit_mib=100"
    proc = launcher(tmp_path, PROGRAM + f"lp.launch(p, {options})\n")
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, f"never reached {phase}"
            if phase == "preflight":
                if f"sleep {SETUP_SLEEP}" in remote(ssh_hosts, "th4", "ps", "-eo", "args"):
                    break
            elif phase == "shipping":
                if ".part" in remote(ssh_hosts, "th4", "sh", "-c", "ls .tlaunch/runs/*/ 2>/dev/null"):
                    break
            elif sum("running" in str(v) for v in _states(new_run_ids(before_local))) >= 4:
                break
            time.sleep(0.05)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        t_done = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "KeyboardInterrupt" in out, out
    runs = new_run_ids(before_local) or [
        r for h, rs in remote_runs(ssh_hosts).items() for r in rs - before_remote[h]
    ]
    for run_id in runs:
        left = ssh_hosts.wait_no_leftovers(run_id, 20)
        assert left == {}, left
    deadline = time.monotonic() + 10  # the setup command's group is killed by pid as preflight stops
    setup = f"sleep {SETUP_SLEEP}"
    while sleeps := [h.name for h in ssh_hosts.hosts if setup in remote(ssh_hosts, h.name, "ps", "-eoargs")]:
        assert time.monotonic() < deadline, f"setup commands left running on {sleeps}"
        time.sleep(0.2)
    if phase != "running":  # an aborted launch leaves no run directory behind
        assert remote_runs(ssh_hosts) == before_remote, out
    record(f"Ctrl-C during {phase}", None, t_done - t0, {})


def _states(run_ids: list[str]) -> list[Any]:
    from tlaunch.cli.runs import _status, find_run

    out: list[Any] = []
    for run_id in run_ids:
        try:
            run_dir, rec = find_run(run_id)
            _, status = _status(run_dir, rec)
            out += [v["state"] for v in (status or {}).values()]
        except (SystemExit, OSError):
            pass
    return out


def test_link_down_then_back(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    run = lp.launch(
        spinners(["th1", "th3"], "link"),
        wait=False,
        ssh_config=ssh_hosts.ssh_config,
        stop_grace=1,
        heartbeat_timeout=2,
        coordinator_timeout=3,
    )
    try:
        wait_state(run, "spinner/1", {"running"})
        t0 = time.time()
        ssh_hosts.set_link("th3", up=False)
        try:
            with pytest.raises(lp.RunFailedError) as info:
                run.wait(60)
            torn_down = time.time()
        finally:
            ssh_hosts.set_link("th3", up=True)
    finally:
        run.stop()
    assert info.value.node == "spinner/1" and "th3 stopped answering" in str(info.value)
    detected = detected_at(run, "spinner/1")
    assert detected - t0 < 2 + 1.5  # the heartbeat timeout, checked every 0.25 s, + one heartbeat
    assert torn_down - detected < 8  # the unreachable host is skipped, not waited for
    finish(ssh_hosts, "link down, then back", run, t0, detected)


class CrashAfter:
    def __init__(self, delay: float) -> None:
        self.delay = delay

    def run(self) -> None:
        time.sleep(self.delay)
        raise RuntimeError("crash")


@pytest.mark.parametrize("offset", [-0.05, 0.0, 0.05])
def test_stop_racing_a_crash(ssh_hosts, offset: float) -> None:  # type: ignore[no-untyped-def]
    program = lp.Program("race")
    program.add_node(lp.PyClassNode(CrashAfter, 1.0).to_host("th2"), label="crash")
    program.add_node(lp.PyClassNode(Spinner).to_host("th4"), label="spinner")
    run = lp.launch(program, wait=False, ssh_config=ssh_hosts.ssh_config, stop_grace=1)
    wait_state(run, "crash/0", {"running"})
    started = run.status()["crash/0"]["started_at"]
    time.sleep(max(0.0, started + 1.0 + offset + 0.1 - time.time()))
    t0 = time.time()
    run.stop()  # never raises, whoever wins
    run.stop()  # idempotent
    states = {k: v["state"] for k, v in run.status().items()}
    assert set(states.values()) <= {"stopped", "failed", "done"}, states
    finish(ssh_hosts, f"stop() racing a crash ({offset:+.2f} s)", run, t0, None)
