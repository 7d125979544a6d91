"""What reaches a SLURM batch script is checked on every path, dry runs included (no cluster needed).

A newline in ``--time``, ``--account``, ``--qos`` or an ``--sbatch-arg`` once
became a shell line of the job (and ``sbatch`` stopped reading ``#SBATCH``
lines there); ``--env`` values were on the job's command line, where any local
user reads them with ``ps``. And what a step is given in place of its
launcher's address (SLURM's launch node) is made real in the step, or named.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tlaunch.allocation import LAUNCH_NODE
from tlaunch.backends.slurm.batch import command_script
from tlaunch.backends.slurm.options import SlurmOptions, job_name_of
from tlaunch.errors import LaunchError
from tlaunch.rpc.security import RunKeys
from tlaunch.runtime.bundle import Bundle
from tlaunch.runtime.node_runtime import RuntimeConfig


def tlaunchrun(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.tlaunchrun", "--backend", "slurm", "--lpjob_name", "j", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--time", "5\necho pwned", "is not a SLURM time limit"),
        ("--account", "acct\necho pwned", "must be a name without spaces"),
        ("--qos", "normal\recho pwned", "must be a name without spaces"),
        ("--partition", "debug\necho pwned", "must be a name without spaces"),
        ("--sbatch-arg", "--exclusive\necho pwned", "must be one option starting with '-'"),
        ("--sbatch-arg", "echo pwned", "must be one option starting with '-'"),
    ],
)
def test_a_value_that_would_leave_its_sbatch_line_is_refused_in_a_dry_run(
    flag: str, value: str, expected: str
) -> None:
    done = tlaunchrun("--dry-run", flag, value, "basic", "--num_trainer", "1", "train.py")
    assert done.returncode != 0 and expected in done.stderr, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "pwned" not in done.stdout


def test_env_values_are_in_the_job_file_not_on_the_command_line() -> None:
    """A job's ``--env`` values travel in its job file (0600, in the run's folder), never in argv."""
    done = tlaunchrun("--dry-run", "--env", "TOKEN=s3 cr'et", "basic", "--num_trainer", "1", "train.py")
    assert done.returncode == 0, done.stderr
    exec_line = next(line for line in done.stdout.splitlines() if line.startswith("exec "))
    assert "s3" not in exec_line and "--env" not in exec_line, exec_line
    shown = done.stdout.split("# the job file the script runs (job.json in the run's folder):\n# ", 1)[1]
    assert json.loads(shown)["job"]["env"] == {"TOKEN": "s3 cr'et"}


def test_a_bad_environment_name_is_refused() -> None:
    with pytest.raises(LaunchError, match=r"environment variable names \['A-B'\] are not valid"):
        command_script(SlurmOptions(submit=True), "j", "r", "/tmp/r", ["true"], {"A-B": "1"})


def test_a_program_name_with_spaces_gives_a_safe_job_name() -> None:
    assert job_name_of("my program (v2)") == "my_program_v2"
    assert job_name_of("***") == "tlaunch"
    script = command_script(SlurmOptions(submit=True), "my program", "r", "/tmp/r", ["true"])
    assert "#SBATCH --job-name=my_program\n" in script


def _bundle(coordinator: str, advertise: str) -> Bundle:
    config = RuntimeConfig("r", "p", RunKeys.generate(), bind_host="0.0.0.0", advertise_host=advertise)
    return Bundle(config, coordinator, {})


def test_a_step_reaches_its_launcher_at_the_address_its_launch_came_from() -> None:
    """A launch from outside its allocation names the launch node; the step makes it real."""
    step = {"SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1"}
    bundle = _bundle(f"{LAUNCH_NODE}:4567", LAUNCH_NODE).at_launch_node(step)
    assert bundle.coordinator_address == "127.0.0.1:4567"
    assert bundle.config.advertise_host == "127.0.0.1"  # this machine's address on the route there
    six = _bundle(f"{LAUNCH_NODE}:4567", LAUNCH_NODE).at_launch_node({"SLURM_LAUNCH_NODE_IPADDR": "::1"})
    assert six.coordinator_address == "[::1]:4567" and six.config.advertise_host == "::1"
    other = _bundle("198.18.0.1:4567", "198.18.0.2")
    assert other.at_launch_node(step) is other
    assert other.at_launch_node({}) is other  # nothing to make real: no step needed


def test_a_launch_node_bundle_outside_a_step_says_what_is_missing() -> None:
    with pytest.raises(LaunchError, match=r"\$SLURM_LAUNCH_NODE_IPADDR is unset: it must run as a step"):
        _bundle(f"{LAUNCH_NODE}:4567", LAUNCH_NODE).at_launch_node({})
