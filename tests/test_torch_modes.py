"""The table of launch methods, and the typed options and outcomes of tlaunch.torch (pure parts).

What differs between launch methods is a field of their entry in
``tlaunch.runtime.methods.METHODS``, and how each runs is its runner in
``tlaunch.control.starting.runners.RUNNERS``: a method added there reaches
hosts, SLURM and Kubernetes without an edit anywhere else.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import shlex
import sys
from typing import Any

import pytest

import tlaunch.errors
import tlaunch.torch.errors
from tlaunch.backends.slurm.options import SlurmOptions
from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.cli import torch as cli_torch
from tlaunch.cli.main import build_parser
from tlaunch.control import Slurm, sbatch_script
from tlaunch.control.starting.jobfile import JobFile
from tlaunch.control.starting.jobmain import run_job
from tlaunch.control.starting.place import Place
from tlaunch.control.starting.runners import RUNNERS, runner_of
from tlaunch.errors import LaunchError
from tlaunch.jobs import JobSpec
from tlaunch.k8s.children import children
from tlaunch.k8s.crd import LAUNCHERS, lpjob_schema
from tlaunch.runtime import methods
from tlaunch.runtime.methods import (
    COMMAND,
    METHODS,
    SCRIPT,
    Method,
    Pods,
    PodSide,
    SectionKey,
    get_method,
    method_names,
    methods_of,
)
from tlaunch.torch.hostfile import deepspeed_world
from tlaunch.torch.outcomes import HostOutcome, JobOutcome
from tlaunch.torch.placement import HostOptions, Placed, Placement

# -- the table ----------------------------------------------------------------------


def test_every_method_is_listed_once_and_has_a_runner() -> None:
    assert list(METHODS) == ["basic", "torchrun", "deepspeed", "command", "program", "function"]
    assert all(name == m.name for name, m in METHODS.items())
    assert list(RUNNERS) == list(METHODS)  # every method runs on hosts and SLURM, by its runner
    assert set(cli_torch._COMMANDS) == set(methods_of(SCRIPT))  # a script's method has a command
    # a program or a function runs its nodes itself: not as an LPJob's pods
    assert LAUNCHERS == method_names("kubernetes") == ("basic", "torchrun", "deepspeed", "command")
    sections = {m.name for m in METHODS.values() if m.pods is not None and m.pods.section}
    assert sections == {"basic", "torchrun", "deepspeed"}
    assert set(lpjob_schema()["properties"]["spec"]["properties"]) >= sections


def _slurm_job(method: str, **kw: Any) -> JobSpec:
    return JobSpec(lpjob_name="j", script=["/shared/train.py", "--lr", "0.1"], image="none", method=method,
                   **kw)  # fmt: skip


@pytest.mark.parametrize(
    "job",
    [
        _slurm_job("basic", num_trainer=3, set_share_file=True),
        _slurm_job("torchrun", num_trainer=4, nnodes="2:4", nproc_per_node=2, max_restarts=1),
        _slurm_job("deepspeed", num_trainer=2, nproc_per_node=4),
        _slurm_job("program", pservers=2),
    ],
)
def test_a_slurm_job_runs_the_entry_point_with_its_job_file(job: JobSpec, tmp_path: Any) -> None:
    """The batch script runs the one entry point on the job's file, never the CLI: the job is written
    once (its settings as they are), not turned into argv to parse again."""
    script = sbatch_script(job, Slurm(), "r1", str(tmp_path))
    exec_line = next(line for line in script.splitlines() if line.startswith("exec "))
    job_file = str(tmp_path / "runs" / "r1" / "job.json")
    assert shlex.split(exec_line)[1:] == [sys.executable, "-m", "tlaunch.control.starting.jobmain", job_file]
    assert "tlaunch.cli" not in script
    written = JobFile(job, Place(hosts=(), allocation=True))
    again = JobFile.from_json(written.to_json())
    assert again == written and again.job.settings() == job.settings()


def test_tlaunch_has_a_command_per_method_with_its_summary() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    helps = {c.dest: c.help for c in sub._choices_actions}  # type: ignore[attr-defined]
    for name in methods_of(SCRIPT):  # the torch methods; the job server runs the others
        assert helps[name] == METHODS[name].summary


# -- a method added in one place ----------------------------------------------------------

RAN: list[tuple[JobSpec, Place]] = []


def echo_on_hosts(job: JobSpec, place: Place) -> None:
    RAN.append((job, place))


@pytest.fixture
def echo_method(monkeypatch: pytest.MonkeyPatch) -> Method:
    method = Method(
        "echo",
        "every node says its arguments",
        COMMAND,
        frozenset({"nproc_per_node"}),
        PodSide(
            lambda pods, index, user: ["echo", f"{index}/{len(pods.hosts)}", pods.hosts[0],
                                       str(pods.settings["loud"]), *user],
            lambda pods: {"peers": " ".join(pods.hosts)},
            section=(SectionKey("loud", {"type": "integer"}, "nproc_per_node", 1),),
        ),
    )  # fmt: skip
    monkeypatch.setitem(METHODS, "echo", method)
    monkeypatch.setitem(RUNNERS, "echo", echo_on_hosts)
    RAN.clear()
    return method


def test_a_new_method_reaches_hosts_slurm_and_pods_from_its_entry(echo_method: Method) -> None:
    job = JobSpec(lpjob_name="e", script=["hello", "world"], image="i", method="echo", num_trainer=2,
                  nproc_per_node=3, namespace="ns")  # fmt: skip
    place = Place(("h1", "h2"), ssh_config="/cfg", working_dir="/src")
    run_job(job, place)
    assert RAN == [(job, dataclasses.replace(place, started_in=os.getcwd()))]  # its ./tlaunch-models there
    lpjob = {**job.to_lpjob(), "metadata": {"name": "e", "namespace": "ns", "uid": "u"}}
    assert lpjob["spec"]["echo"] == {"loud": 3}  # its section, from the job's setting
    made = children(lpjob)
    pods = [m for m in made if m["kind"] == "Pod"]
    assert [p["spec"]["containers"][0]["command"] for p in pods] == [
        ["echo", "0/2", "e-trainer-0.e.ns.svc", "3", "hello", "world"],
        ["echo", "1/2", "e-trainer-0.e.ns.svc", "3", "hello", "world"],
    ]
    (files,) = [m for m in made if m["kind"] == "ConfigMap"]
    assert files["data"] == {"peers": "e-trainer-0.e.ns.svc e-trainer-1.e.ns.svc"}
    assert all({"name": "hostfile", "mountPath": "/etc/tlaunch"} in p["spec"]["containers"][0]["volumeMounts"]
               for p in pods)  # fmt: skip
    with pytest.raises(LaunchError, match=r"max_restarts=2: method echo takes no max_restarts; leave it 0"):
        JobSpec(lpjob_name="e", script=["x"], image="i", method="echo", max_restarts=2)


def test_a_target_a_method_lacks_is_refused_naming_where_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    only_hosts = Method("local-only", "runs on hosts", COMMAND)
    monkeypatch.setitem(METHODS, only_hosts.name, only_hosts)
    with pytest.raises(
        LaunchError, match="'local-only' does not run on Kubernetes; it runs on hosts and SLURM"
    ):
        JobSpec(lpjob_name="j", script=["x"], image="i", method="local-only").to_lpjob()
    with pytest.raises(LaunchError, match=r"method 'local-only' has no runner"):
        runner_of("local-only")
    with pytest.raises(LaunchError, match=r"method 'horovod' is not one of \['basic', 'torchrun'"):
        get_method("horovod")


def test_a_setting_a_method_does_not_take_is_refused_naming_those_that_do() -> None:
    with pytest.raises(
        LaunchError, match=r"nnodes='2': method basic takes no nnodes; .* use method torchrun"
    ):
        _slurm_job("basic", nnodes="2")
    with pytest.raises(
        LaunchError, match=r"pservers=1: launch_method torchrun has no parameter-server group"
    ):
        get_method("torchrun").check_settings({"pservers": 1}, called="launch_method")
    with pytest.raises(LaunchError, match=r"set_share_file=True: method deepspeed .* basic or command"):
        _slurm_job("deepspeed", set_share_file=True)


def _pods(method: str, given: dict[str, Any]) -> Pods:
    pods = get_method(method).in_pods()
    return Pods("ppo", ("p-0.svc", "p-1.svc"), pods.settings_of(given, 2))


def test_save_and_checkpoint_paths_are_refused_for_a_function_reference() -> None:
    with pytest.raises(
        LaunchError, match=r"set_save_path adds an argument .* method 'program' runs FILE:FUNC"
    ):
        JobSpec(lpjob_name="p", script=["a.py:make"], image="i", method="program", set_save_path=True)
    job = JobSpec(lpjob_name="ppo", script=["t.py"], image="i", set_save_path=True, set_checkpoint_path=True)
    assert job.paths() == ("/TData/models/ppo", "/TData/models/ppo/last.tar.gz")
    assert job.paths("/work/tlaunch-models") == (
        "/work/tlaunch-models/ppo",
        "/work/tlaunch-models/ppo/last.tar.gz",
    )


def test_the_pod_commands_of_the_torch_methods() -> None:
    pods = _pods("torchrun", {"nnodes": "1:2", "nprocPerNode": 4, "rdzvPort": 29411})
    assert get_method("torchrun").in_pods().command(pods, 1, ["train.py"]) == [
        "torchrun", "--nnodes=1:2", "--nproc-per-node=4", "--max-restarts=0", "--rdzv-backend=c10d",
        "--rdzv-endpoint=p-0.svc:29411", "--rdzv-id=ppo", "train.py",
    ]  # fmt: skip
    assert _pods("torchrun", {}).settings == {
        "nnodes": "2",
        "nprocPerNode": 1,
        "maxRestarts": 0,
        "rdzvPort": 29400,
    }
    basic = get_method("basic").in_pods()
    assert _pods("basic", {}).settings == {"rankArgs": True, "masterPort": 29500}
    shared = dataclasses.replace(_pods("basic", {}), share_file="/TData/models/ppo/share_file")
    assert basic.command(shared, 1, ["python", "t.py", "--save_path", "/m"]) == [
        "python", "t.py", "--save_path", "/m",  # the trainer's own arguments (and --save_path), then
        "--rank", "1", "--world_size", "2", "--share_file", "/TData/models/ppo/share_file",  # the seed's
    ]  # fmt: skip
    assert basic.command(_pods("basic", {}), 0, ["t.py"]) == ["t.py", "--rank", "0", "--world_size", "2"]
    assert basic.command(_pods("basic", {"rankArgs": False}), 1, ["t.py"]) == ["t.py"]
    assert get_method("command").in_pods().command(shared, 1, ["bash", "run.sh"]) == ["bash", "run.sh"]
    ds = _pods("deepspeed", {"slotsPerNode": 2})
    deepspeed = get_method("deepspeed").in_pods()
    assert deepspeed.files is not None
    assert deepspeed.files(ds) == {"hostfile": "p-0.svc slots=2\np-1.svc slots=2\n"}
    command = deepspeed.command(ds, 1, ["train.py"])
    assert (
        "--node_rank=1" in command and "--master_addr=p-0.svc" in command and "--master_port=29500" in command
    )


def test_the_methods_table_imports_nothing_above_it() -> None:
    """The operator reads it: it stays pure, and names no runner (they live above it)."""
    tree = ast.parse(inspect.getsource(methods))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    assert {m for m in imported if m and m.startswith("tlaunch")} == {
        "tlaunch.errors",
        "tlaunch.runtime.method_pods",
    }


# -- typed options: where a torch job runs ------------------------------------------------


@pytest.fixture
def outside_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_STEP_ID", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def in_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol to ask


def test_options_of_ssh_hosts(outside_slurm: None) -> None:
    options = HostOptions.given(SSHOptions(python="/opt/py", setup=["x"]), None, "/cfg", "/src")
    assert options.placement(["h1"]) is Placement.SSH
    ssh = SSHOptions(python="/opt/py", setup=["x"], ssh_config="/cfg", working_dir="/src")
    assert options.placed(["h1"]) == Placed("ssh", ssh)  # typed, as launch() takes them
    assert HostOptions().placed(["h1", "h2"]) == Placed("ssh", SSHOptions())
    with pytest.raises(
        LaunchError, match=r"\['python', 'setup', 'working_dir'\] are options of remote hosts"
    ):
        options.placed(["localhost"])
    assert HostOptions.given(ssh_config_file="/cfg").placed(["localhost"]) == Placed(None, None)  # harmless
    with pytest.raises(LaunchError, match="applies to the nodes of the SLURM allocation"):
        HostOptions(slurm=SlurmOptions(srun_args=["--exclusive"])).placed(["h1"])
    with pytest.raises(LaunchError, match="must be a SSHOptions"):
        HostOptions.given(ssh={"python": "x"})  # type: ignore[arg-type]


def test_options_of_an_allocations_steps(in_allocation: None) -> None:
    slurm = HostOptions(slurm=SlurmOptions(srun_args=["--exclusive"]))
    assert slurm.placement(["n1"]) is Placement.ALLOCATION  # one node too: never SSH to itself
    assert slurm.placed(["n1", "n2"]) == Placed("slurm", SlurmOptions(srun_args=["--exclusive"]))
    assert HostOptions().placed(["n2"]) == Placed("slurm", SlurmOptions())
    assert HostOptions().placement(["n1", "other"]) is Placement.SSH  # not the allocation's nodes
    assert HostOptions.given(ssh_config_file="/cfg").placement(["n1"]) is Placement.SSH  # asked for


def test_typed_options_replace_keyword_pass_through() -> None:
    from tlaunch.torch import basic, deepspeed, launch, torchrun

    for fn in (launch, torchrun, deepspeed, basic):
        params = inspect.signature(fn).parameters
        assert not any(p.kind is p.VAR_KEYWORD for p in params.values()), fn
        assert params["ssh"].annotation == "SSHOptions | None"
        assert params["slurm"].annotation == "SlurmOptions | None"


def test_deepspeed_without_a_hostfile_gives_each_host_num_gpus_slots(outside_slurm: None) -> None:
    assert deepspeed_world(hostnames=["a", "b"], num_gpus=2) == {"a": [0, 1], "b": [0, 1]}
    assert deepspeed_world() == {"localhost": [0]}
    assert deepspeed_world(hostnames=["a"], slots_per_host=3) == {"a": [0, 1, 2]}


def test_deepspeed_without_hosts_uses_the_allocation(in_allocation: None) -> None:
    assert deepspeed_world(num_gpus=2) == {"n1": [0, 1], "n2": [0, 1]}


# -- typed outcomes and the exception trees -------------------------------------------------


def test_a_job_outcome_names_each_hosts_exit_code() -> None:
    outcome = JobOutcome({0: HostOutcome(exit_code=0), 2: HostOutcome(exit_code=1), 1: HostOutcome()})
    assert outcome.exit_codes(["a", "b", "c"]) == {"a": 0, "c": 1}


@pytest.mark.parametrize("module", [tlaunch.errors, tlaunch.torch.errors])
def test_the_exception_tree_draws_every_error(module: Any) -> None:
    drawn = module.__doc__
    for name, value in vars(module).items():
        if isinstance(value, type) and issubclass(value, tlaunch.errors.TLaunchError):
            if value.__module__ == module.__name__:
                assert f" {name} " in drawn.replace("\n", " "), name


def test_a_job_file_keeps_hostile_arguments_as_they_are(tmp_path: Any) -> None:
    """No argv is built for a job any more: its script goes through its file as it is."""
    job = JobSpec(lpjob_name="j", script=["/a b/t.py", "$(x)", "a'; echo x", "l1\nl2"], image="none")
    path = JobFile(job, Place(("localhost",))).write(str(tmp_path / "job.json"))
    assert oct((tmp_path / "job.json").stat().st_mode & 0o777) == "0o600"
    assert JobFile.take(path).job.script == job.script and not (tmp_path / "job.json").exists()
