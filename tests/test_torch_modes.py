"""The table of launch methods, and the typed options and outcomes of tlaunch.torch (pure parts).

Every place that starts a job reads its method's entry in
``tlaunch.runtime.methods.METHODS``: a method added there reaches hosts,
SLURM and Kubernetes without an edit anywhere else.
"""

from __future__ import annotations

import ast
import inspect
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

import tlaunch.errors
import tlaunch.torch.errors
from tlaunch.backends.slurm.options import SlurmOptions
from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.cli.main import build_parser
from tlaunch.control.starting.jobmain import run_job
from tlaunch.control.starting.submission import method_command
from tlaunch.errors import LaunchError
from tlaunch.jobs import JobSpec
from tlaunch.k8s.children import children
from tlaunch.k8s.crd import LAUNCHERS
from tlaunch.runtime import methods
from tlaunch.runtime.methods import METHODS, Method, Pods, get_method, method_names
from tlaunch.torch.hostfile import deepspeed_world
from tlaunch.torch.outcomes import HostOutcome, JobOutcome
from tlaunch.torch.placement import HostOptions, Placement

# -- the table ----------------------------------------------------------------------


def test_every_method_is_listed_once_and_reaches_every_target() -> None:
    assert list(METHODS) == ["basic", "torchrun", "deepspeed", "command", "program", "function"]
    assert all(name == m.name for name, m in METHODS.items())
    assert method_names("hosts") == method_names("slurm") == method_names()
    # a program or a function runs its nodes itself: not as an LPJob's pods
    assert LAUNCHERS == method_names("kubernetes") == ("basic", "torchrun", "deepspeed", "command")
    for m in METHODS.values():
        assert callable(m.host_runner())  # its import path resolves


def _slurm_job(method: str, **kw: Any) -> JobSpec:
    return JobSpec(lpjob_name="j", script=["/shared/train.py", "--lr", "0.1"], image="none", method=method,
                   backend="slurm", **kw)  # fmt: skip


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        (_slurm_job("basic", num_trainer=3, set_share_file=True),
         {"func": "_basic", "num_trainer": 3, "set_share_file": True}),
        (_slurm_job("torchrun", num_trainer=4, nnodes="2:4", nproc_per_node=2, max_restarts=1),
         {"func": "_torchrun", "nnodes": "2:4", "nproc_per_node": "2", "max_restarts": 1}),
        (_slurm_job("torchrun", num_trainer=2), {"func": "_torchrun", "nnodes": "2"}),
        (_slurm_job("deepspeed", num_trainer=2, nproc_per_node=4), {"func": "_deepspeed", "num_gpus": 4}),
    ],
)  # fmt: skip
def test_a_methods_command_on_an_allocation_is_a_tlaunch_command_with_its_settings(
    job: JobSpec, expected: dict[str, Any]
) -> None:
    """What the batch script runs parses as the method's own ``tlaunch`` command: the two never drift."""
    argv = method_command(job)
    assert argv[:3] == [sys.executable, "-m", "tlaunch.cli.main"]
    args = build_parser().parse_args(argv[3:])
    assert argv[3] == job.method and args.func.__name__ == expected.pop("func")
    assert {k: getattr(args, k) for k in expected} == expected
    assert args.command == ["/shared/train.py", "--lr", "0.1"]  # the script, as the command runs it


def test_tlaunch_has_a_command_per_method_with_its_summary() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    helps = {c.dest: c.help for c in sub._choices_actions}  # type: ignore[attr-defined]
    for name in ("torchrun", "deepspeed", "basic"):  # the torch methods; the job server runs the others
        assert helps[name] == METHODS[name].summary


# -- a method added in one place ----------------------------------------------------------

RAN: list[tuple[Any, list[str], str | None, str | None]] = []


def echo_on_hosts(
    job: Any,
    hosts: Sequence[str],
    ssh_config: str | None,
    working_dir: str | None,
    *,
    run_id: str | None = None,
    python: Mapping[str, str] | None = None,
) -> None:
    RAN.append((job, list(hosts), ssh_config, working_dir))


@dataclass(frozen=True)
class _Job:
    """A job as a method reads it (any object with these attributes: JobSpec is one)."""

    method: str = "echo"
    script: tuple[str, ...] = ("hello", "world")
    num_trainer: int = 2
    set_share_file: bool = False
    nnodes: str | None = None
    nproc_per_node: int = 1
    max_restarts: int = 0
    env: dict[str, str] = field(default_factory=dict)


@pytest.fixture
def echo_method(monkeypatch: pytest.MonkeyPatch) -> Method:
    method = Method(
        "echo",
        "every node says its arguments",
        f"{__name__}:echo_on_hosts",
        lambda job: ["srun", "echo", *job.script],
        lambda pods, index, user: ["echo", f"{index}/{len(pods.hosts)}", pods.hosts[0], *user],
        lambda pods: {"peers": " ".join(pods.hosts)},
    )
    monkeypatch.setitem(METHODS, "echo", method)
    RAN.clear()
    return method


def test_a_new_method_reaches_hosts_slurm_and_pods_from_its_entry(echo_method: Method) -> None:
    job = _Job()
    run_job(job, ["h1", "h2"], "/cfg", "/src")  # type: ignore[arg-type]
    assert RAN == [(job, ["h1", "h2"], "/cfg", "/src")]
    assert method_command(job) == ["srun", "echo", "hello", "world"]  # type: ignore[arg-type]
    lpjob = {
        "metadata": {"name": "e", "namespace": "ns", "uid": "u"},
        "spec": {"image": "i", "launcher": "echo", "roles": [{"name": "trainer", "replicas": 2,
                                                                "command": ["python", "t.py"]}]},
    }  # fmt: skip
    made = children(lpjob)
    pods = [m for m in made if m["kind"] == "Pod"]
    assert [p["spec"]["containers"][0]["command"] for p in pods] == [
        ["echo", "0/2", "e-trainer-0.e.ns.svc", "python", "t.py"],
        ["echo", "1/2", "e-trainer-0.e.ns.svc", "python", "t.py"],
    ]
    (files,) = [m for m in made if m["kind"] == "ConfigMap"]
    assert files["data"] == {"peers": "e-trainer-0.e.ns.svc e-trainer-1.e.ns.svc"}
    assert all({"name": "hostfile", "mountPath": "/etc/tlaunch"} in p["spec"]["containers"][0]["volumeMounts"]
               for p in pods)  # fmt: skip


def test_a_target_a_method_lacks_is_refused_naming_where_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    only_hosts = Method("local-only", "runs on hosts", f"{__name__}:echo_on_hosts", None, None)
    monkeypatch.setitem(METHODS, only_hosts.name, only_hosts)
    with pytest.raises(LaunchError, match="'local-only' does not run on SLURM; it runs on hosts"):
        method_command(_Job(method="local-only"))  # type: ignore[arg-type]
    with pytest.raises(LaunchError, match="does not run on Kubernetes; it runs on hosts"):
        only_hosts.command_in_pod(Pods("j", ("a",), {}), 0, ["x"])
    nowhere = Method("gone", "x", "tlaunch.no_such_module:run", None, None)
    with pytest.raises(LaunchError, match=r"host runner 'tlaunch\.no_such_module:run' cannot be imported"):
        nowhere.host_runner()
    with pytest.raises(LaunchError, match=r"method 'horovod' is not one of \['basic', 'torchrun'"):
        get_method("horovod")


def test_the_pod_commands_of_the_torch_methods() -> None:
    pods = Pods("ppo", ("p-0.svc", "p-1.svc"), {"nnodes": "1:2", "nprocPerNode": 4, "rdzvPort": 29411})
    assert get_method("torchrun").command_in_pod(pods, 1, ["train.py"]) == [
        "torchrun", "--nnodes=1:2", "--nproc-per-node=4", "--max-restarts=0", "--rdzv-backend=c10d",
        "--rdzv-endpoint=p-0.svc:29411", "--rdzv-id=ppo", "train.py",
    ]  # fmt: skip
    assert get_method("basic").command_in_pod(pods, 1, ["python", "t.py"]) == ["python", "t.py"]
    ds = Pods("ppo", ("p-0.svc", "p-1.svc"), {"slotsPerNode": 2})
    assert get_method("deepspeed").pod_files(ds) == {"hostfile": "p-0.svc slots=2\np-1.svc slots=2\n"}  # type: ignore[misc]
    command = get_method("deepspeed").command_in_pod(ds, 1, ["train.py"])
    assert (
        "--node_rank=1" in command and "--master_addr=p-0.svc" in command and "--master_port=29500" in command
    )


def test_the_methods_table_imports_nothing_above_it() -> None:
    """The operator reads it: it stays pure (its host runners are named, not imported)."""
    tree = ast.parse(inspect.getsource(methods))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    assert {m for m in imported if m and m.startswith("tlaunch")} == {"tlaunch.errors"}


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
    assert options.launch_kwargs(["h1"]) == {
        "python": "/opt/py", "setup": ["x"], "ssh_config": "/cfg", "working_dir": "/src",
    }  # fmt: skip
    assert HostOptions().launch_kwargs(["h1", "h2"]) == {}
    with pytest.raises(
        LaunchError, match=r"\['python', 'setup', 'working_dir'\] are options of remote hosts"
    ):
        options.launch_kwargs(["localhost"])
    assert HostOptions.given(ssh_config_file="/cfg").launch_kwargs(["localhost"]) == {}  # harmless
    with pytest.raises(LaunchError, match="applies to the nodes of the SLURM allocation"):
        HostOptions(slurm=SlurmOptions(srun_args=["--exclusive"])).launch_kwargs(["h1"])
    with pytest.raises(LaunchError, match="must be a SSHOptions"):
        HostOptions.given(ssh={"python": "x"})  # type: ignore[arg-type]


def test_options_of_an_allocations_steps(in_allocation: None) -> None:
    slurm = HostOptions(slurm=SlurmOptions(srun_args=["--exclusive"]))
    assert slurm.placement(["n1"]) is Placement.ALLOCATION  # one node too: never SSH to itself
    assert slurm.launch_kwargs(["n1", "n2"]) == {"launch_type": "slurm", "srun_args": ["--exclusive"]}
    assert HostOptions().launch_kwargs(["n2"]) == {"launch_type": "slurm"}
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


def test_shell_quoting_of_the_allocation_command() -> None:
    job = _slurm_job("basic", num_trainer=2)
    job = JobSpec(**{**job.__dict__, "script": ["/a b/t.py", "$(x)"]})
    assert shlex.split(shlex.join(method_command(job)))[-2:] == ["/a b/t.py", "$(x)"]
