from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

_SHM = "/dev/shm"


def _shared_files() -> set[str]:
    try:
        return {n for n in os.listdir(_SHM) if n.startswith("tlaunch-")}
    except OSError:
        return set()


@pytest.fixture(autouse=True)
def _tlaunch_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep every test's runs out of the real ~/.tlaunch."""
    monkeypatch.setenv("TLAUNCH_HOME", str(tmp_path_factory.mktemp("tlaunch-home")))


@pytest.fixture(autouse=True)
def _no_shared_memory_left() -> Iterator[None]:
    """No buffer sent through /dev/shm outlives the test that sent it."""
    before = _shared_files()
    yield
    deadline = time.monotonic() + 5  # a receiver may still be taking its last buffer
    while left := _shared_files() - before:
        if time.monotonic() > deadline:
            pytest.fail(f"shared-memory buffers left in {_SHM}: {sorted(left)}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def ssh_hosts():  # type: ignore[no-untyped-def]
    """Four SSH test hosts (th1..th4) for the whole session; skips without root."""
    from tlaunch.testing.hosts import SSHTestHosts, hosts_unavailable

    reason = hosts_unavailable()
    if reason:
        pytest.skip(reason)
    with SSHTestHosts(4) as hosts:
        yield hosts


@pytest.fixture(scope="session")
def slurm_cluster():  # type: ignore[no-untyped-def]
    """A real SLURM cluster of 2 nodes (th1, th2), one fake GPU each; skips without root or SLURM."""
    from tlaunch.testing.slurm import SlurmTestCluster, slurm_unavailable

    reason = slurm_unavailable()
    if reason:
        pytest.skip(reason)
    with SlurmTestCluster(2) as cluster:
        yield cluster
