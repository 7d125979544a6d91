"""Helpers of the fault suite: programs, remote pids, timing records."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from tlaunch import lp_ssh as lp
from tlaunch.ssh import connect_all

REPORT = os.environ.get("TLAUNCH_FAULT_REPORT")  # a JSON file to append case timings to


def record(case: str, detection_s: float | None, clean_s: float, leftovers: dict[str, list[str]]) -> None:
    """Append one row of the fault table (when ``TLAUNCH_FAULT_REPORT`` names a file)."""
    if not REPORT:
        return
    rows: list[dict[str, Any]] = []
    if os.path.exists(REPORT):
        with open(REPORT) as f:
            rows = json.load(f)
    rows = [r for r in rows if r["case"] != case]
    rows.append(
        {
            "case": case,
            "detection_s": None if detection_s is None else round(detection_s, 3),
            "clean_s": round(clean_s, 3),
            "leftovers": sum(len(v) for v in leftovers.values()),
        }
    )
    with open(REPORT, "w") as f:
        json.dump(rows, f, indent=1)


class Echo:
    """Serves ``whoami`` (host and pid), forever."""

    def whoami(self) -> tuple[str, int]:
        return lp.get_context().host, os.getpid()


class Spinner:
    """Runs until the program stops."""

    def run(self) -> None:
        lp.wait_for_stop()


class Stubborn:
    """Never looks at the stop: only signals end it."""

    def run(self) -> None:
        while True:
            time.sleep(0.1)


class Caller:
    """Calls ``echo.whoami`` every 50 ms and records the pids that answered."""

    def __init__(self, echo: Any) -> None:
        self.echo = echo

    def run(self) -> None:
        while not lp.stop_event().wait(0.05):
            try:
                host, pid = self.echo.whoami()
                print(f"answer {host} {pid}", flush=True)
            except lp.RPCError as exc:
                print(f"error {type(exc).__name__}", flush=True)


def remote_pid(ssh_hosts: Any, host: str, needle: str) -> int:
    """The pid of the process of ``host`` (its own: ``SSHTestHosts.processes``) whose command line
    starts with ``needle``."""
    deadline = time.monotonic() + 20
    while True:
        found = [pid for pid, args in ssh_hosts.processes(host).items() if args.startswith(needle)]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"no process with {needle!r} on {host}"
        time.sleep(0.1)


def remote(ssh_hosts: Any, host: str, *argv: str) -> str:
    conn = connect_all([host], ssh_config=ssh_hosts.ssh_config)[host]
    try:
        return conn.run(list(argv), check=False).stdout
    finally:
        conn.close()


def wait_state(run: lp.Run, key: str, states: set[str], timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        rec = run.status()[key]
        if rec["state"] in states:
            return rec
        assert time.monotonic() < deadline, rec
        time.sleep(0.05)
