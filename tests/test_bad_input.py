"""Bad input: a clear error through ``launch()`` before anything starts, and nothing left anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from faults_helpers import remote

from tlaunch import lp_ssh as lp

pytestmark = [pytest.mark.ssh, pytest.mark.faults]


def one_node(host: str, node: lp.Node | None = None) -> lp.Program:
    program = lp.Program("bad")
    program.add_node((node or lp.PyNode(print, "hi")).to_host(host), label="n")
    return program


def remote_state(ssh_hosts: Any) -> dict[str, str]:
    """What a failed launch must not change on any host: run directories and tmux sessions."""
    return {
        h.name: remote(ssh_hosts, h.name, "sh", "-c", "ls -1 .tlaunch/runs 2>/dev/null; tmux ls 2>/dev/null")
        for h in ssh_hosts.hosts
    }


def runtime_processes(ssh_hosts: Any) -> list[str]:
    """tlaunch's processes on the session's test hosts: theirs only (their network namespaces),
    not the machine's (a host's ``ps`` lists every process here: other sessions', a job server's)."""
    return [
        f"{h.name}: {args}"
        for h in ssh_hosts.hosts
        for args in ssh_hosts.processes(h.name).values()
        if "tlaunch.runtime" in args
    ]


@pytest.fixture
def untouched(ssh_hosts):  # type: ignore[no-untyped-def]
    """Asserts that the test changed nothing on any host (no run dir, no session, no process)."""
    before = remote_state(ssh_hosts)
    yield
    assert remote_state(ssh_hosts) == before
    assert runtime_processes(ssh_hosts) == []


def config_with(ssh_hosts: Any, tmp_path: Path, extra: str = "", known: str | None = None) -> str:
    text = Path(ssh_hosts.ssh_config).read_text()
    if known is not None:
        text = text.replace(ssh_hosts.known_hosts, known)
    path = tmp_path / "ssh_config"
    path.write_text(text + extra)
    return str(path)


def test_unreachable_host(ssh_hosts, untouched) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(lp.TLaunchError, match=r"198\.18\.\d+\.250.*cannot connect to 198\.18\.\d+\.250:22"):
        lp.launch(one_node(f"{ssh_hosts.subnet}.250"), ssh_config=ssh_hosts.ssh_config, connect_timeout=1.5)


def test_wrong_port(ssh_hosts, untouched) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(lp.TLaunchError, match=r"th2:2222.*cannot connect to .*:2222"):
        lp.launch(one_node("th2:2222"), ssh_config=ssh_hosts.ssh_config)


def test_refused_key(ssh_hosts, untouched, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    key = tmp_path / "id_other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    config = config_with(
        ssh_hosts,
        tmp_path,
        f"\nHost otherkey\n  HostName {ssh_hosts.hosts[0].address}\n  User root\n  IdentityFile {key}\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {ssh_hosts.known_hosts}\n",
    )
    with pytest.raises(
        lp.TLaunchError, match=r"otherkey.*authentication as 'root' failed \(tried .*id_other\)"
    ):
        lp.launch(one_node("otherkey"), ssh_config=config)


def test_unknown_host_key(ssh_hosts, untouched, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    config = config_with(ssh_hosts, tmp_path, known=str(empty))
    with pytest.raises(
        lp.TLaunchError, match=r"th3.*not in known_hosts.*ssh-keyscan.*accept_unknown_hosts=True"
    ):
        lp.launch(one_node("th3"), ssh_config=config)


def test_missing_python(ssh_hosts, untouched) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(lp.TLaunchError, match=r"th1.*/no/such/python cannot import tlaunch.*install tlaunch"):
        lp.launch(one_node("th1"), ssh_config=ssh_hosts.ssh_config, python="/no/such/python")


def test_missing_tlaunch(ssh_hosts, untouched, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bare = sys.base_prefix + "/bin/python3"  # the interpreter without this venv's packages
    with pytest.raises(lp.TLaunchError, match=r"cannot import tlaunch \(ModuleNotFoundError"):
        lp.launch(
            one_node("th2"), ssh_config=ssh_hosts.ssh_config, python=bare, env={"PYTHONPATH": "/nowhere"}
        )


def test_python_minor_version_mismatch(ssh_hosts, untouched) -> None:  # type: ignore[no-untyped-def]
    fake = "/root/fakepython"  # answers the probe as another Python would
    remote(ssh_hosts, "th2", "sh", "-c", f"printf '#!/bin/sh\\necho 3.99 0.0.1\\n' > {fake}; chmod +x {fake}")
    try:
        with pytest.raises(
            lp.TLaunchError, match=r"th2.*has Python/tlaunch '3\.99 0\.0\.1'.*same Python minor"
        ):
            lp.launch(one_node("th2"), ssh_config=ssh_hosts.ssh_config, python=fake)
    finally:
        remote(ssh_hosts, "th2", "rm", "-f", fake)


def test_a_remembered_preflight_answer_goes_once_anything_on_the_path_changes(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    """A host remembers its interpreter's answer, and forgets it when a package lands on its path."""
    shadow = "/root/probe-shadow"
    remote(ssh_hosts, "th2", "sh", "-c", f"rm -rf {shadow} .tlaunch/probe-*; mkdir {shadow}")
    time.sleep(2.1)  # a folder changed in the last 2 s is never remembered (an install under way)
    try:
        env = {"PYTHONPATH": shadow}
        lp.launch(one_node("th2"), ssh_config=ssh_hosts.ssh_config, env=env)
        remembered = remote(ssh_hosts, "th2", "sh", "-c", "cat .tlaunch/probe-*")
        assert remembered.startswith(f"{sys.version_info[0]}.{sys.version_info[1]} "), remembered
        assert f"\n{shadow}|" in remembered
        inode = remote(ssh_hosts, "th2", "sh", "-c", "stat -c %i .tlaunch/probe-*")
        lp.launch(one_node("th2"), ssh_config=ssh_hosts.ssh_config, env=env)
        # Answered from it: Python did not run (it would have written a new file in its place).
        assert remote(ssh_hosts, "th2", "sh", "-c", "stat -c %i .tlaunch/probe-*") == inode
        # Another tlaunch on the path: the folder's mtime changed, so the host asks Python again.
        remote(
            ssh_hosts,
            "th2",
            "sh",
            "-c",
            f"mkdir {shadow}/tlaunch && echo \"__version__ = '0.0.1'\" > {shadow}/tlaunch/__init__.py",
        )
        with pytest.raises(lp.TLaunchError, match=r"th2.*has Python/tlaunch '\d+\.\d+ 0\.0\.1'"):
            lp.launch(one_node("th2"), ssh_config=ssh_hosts.ssh_config, env=env)
    finally:
        remote(ssh_hosts, "th2", "sh", "-c", f"rm -rf {shadow} .tlaunch/probe-*")


def test_missing_tmux(ssh_hosts, untouched) -> None:  # type: ignore[no-untyped-def]
    tmux = remote(ssh_hosts, "th4", "sh", "-c", "command -v tmux").strip()
    # th4 has its own mount namespace: hide tmux there only.
    remote(ssh_hosts, "th4", "mount", "--bind", "/dev/null", tmux)
    try:
        with pytest.raises(lp.TLaunchError, match=r"th4.*tmux is missing \(apt-get install tmux\)"):
            lp.launch(one_node("th4"), ssh_config=ssh_hosts.ssh_config)
    finally:
        remote(ssh_hosts, "th4", "umount", tmux)


def test_missing_tar(ssh_hosts, untouched) -> None:  # type: ignore[no-untyped-def]
    tar = remote(ssh_hosts, "th4", "sh", "-c", "command -v tar").strip()
    remote(ssh_hosts, "th4", "mount", "--bind", "/dev/null", tar)  # th4's own mount namespace only
    try:
        with pytest.raises(
            lp.TLaunchError, match=r"th4.*tar or gzip is missing: tlaunch ships files with them"
        ):
            lp.launch(one_node("th4"), ssh_config=ssh_hosts.ssh_config)
    finally:
        remote(ssh_hosts, "th4", "umount", tar)


def test_every_host_problem_in_one_error(ssh_hosts, untouched) -> None:  # type: ignore[no-untyped-def]
    program = lp.Program("many")
    program.add_node(lp.PyNode(print).to_host("th1"), label="a")
    program.add_node(lp.PyNode(print).to_host("th2:2222"), label="b")
    with pytest.raises(lp.TLaunchError) as info:
        lp.launch(program, ssh_config=ssh_hosts.ssh_config, python="/no/python")
    assert "th2:2222" in str(info.value)  # connection errors come first, all of them


class Unpicklable:
    def __init__(self) -> None:
        self.lock = threading.Lock()


def test_unpicklable_node(ssh_hosts, untouched) -> None:  # type: ignore[no-untyped-def]
    node = lp.PyNode(print, {"inner": Unpicklable()})
    with pytest.raises(
        lp.LaunchError, match=r"node 'n/0'.*cannot be pickled \(attribute _args\[0\]\['inner'\]"
    ):
        lp.launch(one_node("th1", node), ssh_config=ssh_hosts.ssh_config)


def test_empty_label_and_repeated_label() -> None:
    program = lp.Program("labels")
    with pytest.raises(lp.ProgramError, match="is empty"):
        program.add_node(lp.PyNode(print).to_host("th1"), label="")
    program.add_node(lp.PyNode(print).to_host("th1"), label="w")
    program.add_node(lp.PyNode(print).to_host("th2"), label="w")  # a group, as in Launchpad
    assert [n.key for n in program.get_all_nodes()] == ["w/0", "w/1"]


def test_handle_outside_a_program() -> None:
    handle = lp.CourierNode(dict).create_handle()
    with pytest.raises(lp.ProgramError, match="never added to a program"):
        _ = handle.key
    program = lp.Program("h")
    other = lp.Program("other").add_node(lp.CourierNode(dict), label="x")
    program.add_node(lp.PyNode(print, other).to_host("th1"), label="user")
    with pytest.raises(lp.ProgramError, match="not in program 'h'; add that node to this program"):
        lp.launch(program)


@pytest.mark.parametrize("host", ["a'; touch /tmp/x", "$(id)", "two words", "host:port", "`id`", "a;b", ""])
def test_invalid_to_host(host: str) -> None:
    with pytest.raises(lp.ProgramError, match="host"):
        lp.PyNode(print).to_host(host)


def test_bad_options_are_named(ssh_hosts, untouched) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(lp.LaunchError, match=r"on_failure='ignore' is not one of \['stop', 'continue'\]"):
        lp.launch(one_node("th1"), ssh_config=ssh_hosts.ssh_config, on_failure="ignore")
    with pytest.raises(lp.LaunchError, match=r"terminal 'tmux_session' is not available over SSH"):
        lp.launch(one_node("th1"), ssh_config=ssh_hosts.ssh_config, terminal="tmux_session")
    with pytest.raises(lp.LaunchError, match=r"working_dir '/no/dir' is not a directory"):
        lp.launch(one_node("th1"), ssh_config=ssh_hosts.ssh_config, working_dir="/no/dir")
    with pytest.raises(lp.LaunchError, match=r"setup='make' must be a list of shell commands"):
        lp.launch(one_node("th1"), ssh_config=ssh_hosts.ssh_config, setup="make")
    assert os.environ.get("TLAUNCH_HOME")


def test_a_failed_preflight_leaves_no_shell_waiting_on_the_hosts_that_passed(ssh_hosts, untouched) -> None:  # type: ignore[no-untyped-def]
    """A host's preflight shell stays on its channel to become its log tail; when another host
    fails preflight, nothing starts and that shell ends."""
    program = lp.Program("half")
    program.add_node(lp.PyNode(print).to_host("th1"), label="a")
    program.add_node(lp.PyNode(print).to_host("th2"), label="b")
    with pytest.raises(lp.TLaunchError, match=r"th2.*/no/such/python cannot import tlaunch"):
        lp.launch(program, ssh_config=ssh_hosts.ssh_config, python={"th2": "/no/such/python"})
    deadline = time.monotonic() + 10
    while held := [a for a in ssh_hosts.processes("th1").values() if "tlaunch-held-" in a]:
        assert time.monotonic() < deadline, held
        time.sleep(0.1)
