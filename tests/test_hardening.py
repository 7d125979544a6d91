"""Errors that say what happened, and local runs that survive users' machines (full disks,
shared machines, labels that look like markup or tmux formats)."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from programs import Producer

from tlaunch import lp_ssh as lp
from tlaunch.testing import assert_no_leftovers


class Broken:
    def __init__(self) -> None:
        raise ValueError("cannot build this node")

    def work(self) -> int:
        return 1


def test_a_handle_of_a_node_that_failed_raises_its_error_at_once() -> None:
    p = lp.Program("broken")
    h = p.add_node(lp.CourierNode(Broken), label="broken")
    p.add_node(lp.CourierNode(Producer), label="server")
    run = lp.launch(p, wait=False, on_failure="continue")
    try:
        t0 = time.monotonic()
        with pytest.raises(lp.RunFailedError) as info:
            h.dereference().work()
        assert time.monotonic() - t0 < 10  # not the 300 s resolve timeout
        assert info.value.node == "broken/0"
        assert "ValueError: cannot build this node" in (info.value.remote_traceback or "")
    finally:
        run.stop()
    assert_no_leftovers(run)


def test_a_missing_method_lists_the_public_ones() -> None:
    p = lp.Program("methods")
    h = p.add_node(lp.CourierNode(Producer), label="server")
    with lp.launch(p, wait=False) as run:
        with pytest.raises(
            lp.RemoteError, match=r"no public method 'wrok'; its public methods: echo, fail, whoami, work"
        ):
            h.dereference().wrok(1)
    assert_no_leftovers(run)


def test_large_arguments_shared_by_nodes_are_called_out(caplog: pytest.LogCaptureFixture) -> None:
    data = np.ones(12 << 20)  # 96 MiB, given to four nodes: 384 MiB shipped
    p = lp.Program("heavy")
    with p.group("user"):
        for _ in range(4):
            p.add_node(lp.PyNode(len, data))
    with caplog.at_level(logging.WARNING, logger="tlaunch"):
        lp.launch(p)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "take 384 MiB" in said and "user/0 (96 MiB)" in said and "its own copy" in said, said


def test_runs_dirs_are_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "fresh-home"
    monkeypatch.setenv("TLAUNCH_HOME", str(home))
    p = lp.Program("modes")
    p.add_node(lp.PyNode(print, "x"), label="x")
    run = lp.launch(p)
    for d in (home, home / "runs", Path(run.run_dir), Path(run.log_dir)):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d


def test_a_teams_shared_home_keeps_its_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2775 TLAUNCH_HOME (docs/slurm.md) is not closed by a launch; the run's own folder is private."""
    home = tmp_path / "team-home"
    home.mkdir()
    os.chmod(home, 0o2775)
    (home / "runs").mkdir()
    os.chmod(home / "runs", 0o1777)
    monkeypatch.setenv("TLAUNCH_HOME", str(home))
    p = lp.Program("team")
    p.add_node(lp.PyNode(print, "x"), label="x")
    run = lp.launch(p)
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o2775
    assert stat.S_IMODE(os.stat(home / "runs").st_mode) == 0o1777
    assert stat.S_IMODE(os.stat(run.run_dir).st_mode) == 0o700


def test_ps_shows_labels_as_text_not_markup(tmp_path: Path) -> None:
    p = lp.Program("[bold]prog")
    p.add_node(lp.PyNode(print, "x"), label="[red]x")
    run = lp.launch(p, terminal="output_to_files")
    listing = subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.main", "ps", run.run_id],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "[red]x/0" in listing and "[bold]prog" in listing, listing


def chatty() -> None:
    for i in range(20000):
        print(f"line {i} " + "x" * 200, flush=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
@pytest.mark.parametrize("terminal", ["output_to_files", "current_terminal"])
def test_a_full_log_disk_does_not_hang_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, terminal: str, caplog: pytest.LogCaptureFixture
) -> None:
    """4 MiB of output on a 256 KiB disk: the logs stop, the node and the run do not."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    try:
        monkeypatch.setenv("TLAUNCH_HOME", str(disk))
        p = lp.Program("full")
        p.add_node(lp.PyNode(chatty), label="chatty")
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING):
            run = lp.launch(p, terminal=terminal)
        assert run.status()["chatty/0"]["state"] == "done"
        assert time.monotonic() - t0 < 60
        assert "No space left on device" in caplog.text
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.skipif(subprocess.run(["which", "tmux"], capture_output=True).returncode, reason="no tmux")
def test_local_tmux_windows_keep_env_values_private_and_run_no_label(tmp_path: Path) -> None:
    """env values travel in 0600 files, never on a command line; '#' in a label is no tmux format."""
    secret = "tl-secret-" + os.urandom(4).hex()
    marker = tmp_path / "pwned"
    got = tmp_path / "env"

    def look() -> None:
        got.write_text(os.environ.get("TL_SECRET", ""))
        time.sleep(1.0)

    p = lp.Program("tmuxenv")
    p.add_node(lp.PyNode(look), label=f"#(touch {marker.name})")
    run = lp.launch(p, terminal="tmux_session", env={"TL_SECRET": secret}, wait=False)
    try:
        deadline = time.monotonic() + 20
        while run.status()[f"#(touch {marker.name})/0"]["state"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        panes = subprocess.run(
            ["tmux", "list-panes", "-a", "-F", "#{pane_start_command}"], capture_output=True, text=True
        ).stdout
        assert secret not in ps and secret not in panes
        run.wait(30)
    finally:
        run.stop()
    assert got.read_text() == secret  # the node has it
    for where in (tmp_path, Path.cwd(), Path.home()):
        assert not (where / marker.name).exists()
    assert_no_leftovers(run)


def test_a_launcher_or_head_raises_its_open_files_limit_to_what_many_hosts_need() -> None:
    """A soft limit of 1024 would refuse connections at a few hundred hosts; the hard limit bounds it."""
    import subprocess
    import sys

    code = (
        "import resource; from tlaunch.procs import want_descriptors; "
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE); "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096)); "
        "print(want_descriptors(2048), want_descriptors(100), want_descriptors(10**9), "
        "resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["2048", "2048", "4096", "4096"]  # up to what is needed, never down, capped


def test_an_ssh_interrupt_is_readable_exactly_while_it_is_set() -> None:
    """``tlaunch.ssh.interrupt.Interrupt``: what a command's poll waits on beside its channel."""
    import threading
    import time

    from tlaunch.rpc.readiness import wait_readable
    from tlaunch.ssh.interrupt import Interrupt

    early = Interrupt()
    early.set()  # set before anyone waited: its descriptor is made readable
    assert wait_readable([early], 0) and early.is_set()
    early.close()
    early.close()
    early.set()  # closed: no error, nothing to wake
    early.clear()
    later = Interrupt()
    assert not wait_readable([later], 0.01)
    threading.Timer(0.2, later.set).start()
    t0 = time.monotonic()
    assert wait_readable([later], 10.0) and time.monotonic() - t0 < 5.0
    later.set()  # twice: still one to clear
    later.clear()
    assert not later.is_set() and not wait_readable([later], 0.01)
    later.close()
    with pytest.raises(ValueError):
        later.fileno()
