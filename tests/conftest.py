from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _tlaunch_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep every test's runs out of the real ~/.tlaunch."""
    monkeypatch.setenv("TLAUNCH_HOME", str(tmp_path_factory.mktemp("tlaunch-home")))


@pytest.fixture(scope="session")
def ssh_hosts():  # type: ignore[no-untyped-def]
    """Four SSH test hosts (th1..th4) for the whole session; skips without root."""
    from tlaunch.testing.hosts import SSHTestHosts, hosts_unavailable

    reason = hosts_unavailable()
    if reason:
        pytest.skip(reason)
    with SSHTestHosts(4) as hosts:
        yield hosts
