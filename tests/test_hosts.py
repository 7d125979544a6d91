"""The SSH test hosts themselves: reachable by alias, key-checked, isolated, cleaned up."""

from __future__ import annotations

import os
import subprocess

import pytest

from tlaunch.testing.hosts import SSHTestHosts, hosts_unavailable

pytestmark = [
    pytest.mark.ssh,
    pytest.mark.skipif(hosts_unavailable() is not None, reason=str(hosts_unavailable())),
]


def ssh(hosts: SSHTestHosts, host: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-F", hosts.ssh_config, "-o", "BatchMode=yes", host, command],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_hosts_are_separate_machines() -> None:
    with SSHTestHosts(3) as hosts:
        names = [ssh(hosts, f"th{i}", "hostname").stdout.strip() for i in (1, 2, 3)]
        assert names == ["th1", "th2", "th3"]
        # A private home and /tmp per host: nothing written on one is seen on another.
        assert (
            ssh(
                hosts, "th1", "mkdir -p ~/.tlaunch && echo secret > ~/.tlaunch/f && echo x > /tmp/f"
            ).returncode
            == 0
        )
        assert ssh(hosts, "th1", "cat ~/.tlaunch/f").stdout.strip() == "secret"
        assert ssh(hosts, "th2", "test -e ~/.tlaunch/f || test -e /tmp/f; echo $?").stdout.strip() == "1"
        assert not os.path.exists(os.path.expanduser("~/.tlaunch/f"))
        # Host keys are checked: a wrong known_hosts entry is refused.
        with open(hosts.known_hosts) as f:
            lines = f.read().splitlines()
        with open(hosts.known_hosts, "w") as f:
            f.write(
                "\n".join(
                    [lines[1].replace("th2,", "th1,").replace(hosts.hosts[1].address, hosts.hosts[0].address)]
                )
                + "\n"
            )
        refused = ssh(hosts, "th1", "true")
        assert refused.returncode != 0 and "HOST IDENTIFICATION HAS CHANGED" in refused.stderr
        netns = [h.netns for h in hosts.hosts]
        pids = [h.sshd_pid for h in hosts.hosts]
        state = hosts.state_dir
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not [n for n in netns if n in listed]
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]
    assert not os.path.exists(state)


def test_hosts_made_again_at_the_same_addresses_are_reachable_at_once(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    """A second set of hosts on the addresses of a set just taken down comes up at once.

    The machine's neighbour entries for the old hosts' addresses stay REACHABLE for
    up to ~45 s; unless they are forgotten, packets go to the old MACs and the new
    sshd looks dead (the demo test's flake: "not up after 30 s", an empty log).
    """
    with SSHTestHosts(1) as first:
        subnet = first.subnet
        assert ssh(first, "th1", "hostname").stdout.strip() == "th1"
    with SSHTestHosts(1) as second:
        assert second.subnet == subnet  # the freed /24 is taken again
        assert ssh(second, "th1", "hostname").stdout.strip() == "th1"


def test_two_sets_of_hosts_side_by_side(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    """Sets of hosts made at once (by several test runs) get their own bridge and /24.

    Taking one down leaves the other (and the session's hosts) reachable: before, the
    first set made a shared bridge and deleted it on exit, cutting off every other set.
    """
    with SSHTestHosts(1) as first, SSHTestHosts(1) as second:
        assert first.bridge != second.bridge
        assert len({first.subnet, second.subnet, ssh_hosts.subnet}) == 3
        first.down()
        assert ssh(second, "th1", "hostname").stdout.strip() == "th1"
    assert ssh(ssh_hosts, "th1", "hostname").stdout.strip() == "th1"
