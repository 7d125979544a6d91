"""Host status from every host, gathered on one: ``python examples/commands/run_cmd.py``.

Each host runs a command (by default: its name, load and GPUs via nvidia-smi,
or "no GPU"), sends the output through a TransmitNode on the first host, and a
gatherer there prints one block per host. Without --hosts it makes 4 SSH test
hosts on this machine (needs root).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hosts_flag import example_hosts

from tlaunch import lp_ssh as lp

flags.DEFINE_string(
    "command",
    "hostname; cat /proc/loadavg; nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used,memory.total "
    "--format=csv,noheader 2>/dev/null || echo 'no GPU'",
    "Shell command to run on every host.",
)


class CommandRunner:
    """Runs the command on its host and sends what it printed to the server."""

    def __init__(self, server: Any, command: str) -> None:
        self.server, self.command = server, command

    def run(self) -> None:
        done = subprocess.run(
            ["sh", "-c", self.command], capture_output=True, text=True, timeout=60, check=False
        )
        self.server.insert(
            "status",
            {"host": lp.get_context().host, "code": done.returncode, "output": done.stdout + done.stderr},
        )


class Gatherer:
    """Prints the status of every host, then stops the program."""

    def __init__(self, server: Any, hosts: int) -> None:
        self.server, self.hosts = server, hosts

    def run(self) -> None:
        reports = sorted(
            (self.server.get("status", timeout=120) for _ in range(self.hosts)), key=lambda r: r["host"]
        )
        for report in reports:
            print(f"== {report['host']} (exit {report['code']})", flush=True)
            for line in report["output"].splitlines():
                print(f"   {line}", flush=True)
        print(f"gathered {len(reports)} hosts", flush=True)
        lp.stop()


def make_program(hosts: list[str], command: str) -> lp.Program:
    program = lp.Program("run_cmd")
    server = program.add_node(lp.TransmitNode({"status": "queue"}).to_host(hosts[0]), label="server")
    with program.group("runner"):
        for host in hosts:
            program.add_node(lp.SSHNode(CommandRunner, server, command).to_host(host))
    program.add_node(lp.SSHNode(Gatherer, server, len(hosts)).to_host(hosts[0]), label="gatherer")
    return program


def main(_: list[str]) -> None:
    with example_hosts(4) as (hosts, ssh_config):
        lp.launch(
            make_program(hosts, flags.FLAGS.command), terminal="ssh_tmux_session", ssh_config=ssh_config
        )


if __name__ == "__main__":
    app.run(main)
