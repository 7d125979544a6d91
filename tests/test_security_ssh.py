"""Security of SSH runs: peers without the run's keys, secrets, file modes."""

from __future__ import annotations

import os
import pickle
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import pytest
from faults_helpers import Caller, Echo, remote, wait_state

from tlaunch import lp_ssh as lp
from tlaunch.rpc.security import RunKeys

pytestmark = [pytest.mark.ssh, pytest.mark.faults]


class Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"touch {self.marker}",))


def attack(address: str, marker: str) -> None:
    """A bare pickle, one behind a tlaunch header, and one over TLS with another run's certificate."""
    host, port = address.rsplit(":", 1)
    payload = pickle.dumps(("stop", (Evil(marker),), {}))
    for data in (payload, b"TL\x01\x01" + bytes(12) + payload):
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            raw.sendall(data)
            try:
                answer = raw.recv(100)
            except (ConnectionResetError, TimeoutError):
                answer = b""
            assert not answer.startswith(b"TL")
    other = RunKeys.generate().context(server=False)
    with socket.create_connection((host, int(port)), timeout=5) as raw, pytest.raises(ssl.SSLError):
        tls = other.wrap_socket(raw)
        tls.sendall(payload)
        tls.recv(100)


def test_no_keys_no_entry_and_the_run_goes_on(ssh_hosts, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    secret = "tl-secret-value-" + os.urandom(4).hex()
    monkeypatch.setenv("TL_API_TOKEN", secret)
    program = lp.Program("secure")
    echo = program.add_node(lp.CourierNode(Echo).to_host("th2"), label="echo")
    program.add_node(lp.PyClassNode(Caller, echo).to_host("th3"), label="caller")
    run = lp.launch(
        program,
        wait=False,
        ssh_config=ssh_hosts.ssh_config,
        env_patterns=["TL_API_*"],
        terminal="output_to_files",
    )
    try:
        node = wait_state(run, "echo/0", {"serving"})
        coordinator = run._record.coordinator  # type: ignore[attr-defined]
        for address in (node["address"], coordinator):
            attack(address, "/tmp/pwned-by-test")
        for h in ssh_hosts.hosts:
            assert remote(ssh_hosts, h.name, "sh", "-c", "ls /tmp/pwned-by-test 2>/dev/null").strip() == ""
        assert echo.dereference().whoami()[0] == "th2"  # both still serve
        assert not run.done and run.status()["caller/0"]["state"] == "running"
        # Secrets: never on a command line on any host, never in a log, never in the record.
        time.sleep(0.5)
        for h in ssh_hosts.hosts:
            assert secret not in remote(ssh_hosts, h.name, "ps", "-eo", "args")
        keys_pem = _private_key_marker(run)
        logs = remote(ssh_hosts, "th2", "sh", "-c", f"cat .tlaunch/runs/{run.run_id}/logs/*")
        assert keys_pem not in logs and secret not in logs
        record = Path(run.run_dir, "run.json").read_text()
        assert secret not in record and keys_pem not in record
        # Modes: the run directory 0700; nothing of the run's secrets rests on a host's disk.
        for host in ("th2", "th3"):  # th2 is the head: the first host of the program
            mode = remote(ssh_hosts, host, "stat", "-c", "%a", f".tlaunch/runs/{run.run_id}").strip()
            assert mode == "700"
            files = remote(ssh_hosts, host, "sh", "-c", f"ls .tlaunch/runs/{run.run_id}").split()
            assert not [f for f in files if f.endswith((".node", ".pkl"))], files
        assert oct(os.stat(os.path.join(run.run_dir, "run.keys")).st_mode & 0o777) == "0o600"
    finally:
        run.stop()
    assert not os.path.exists(os.path.join(run.run_dir, "run.keys"))  # the secrets go with the run
    assert ssh_hosts.leftovers(run.run_id) == {}


def _private_key_marker(run: Any) -> str:
    from tlaunch.runtime.records import read_keys

    pem = read_keys(run.run_dir).key_pem.decode()
    return pem.splitlines()[1][:40]  # a line of the base64 body
