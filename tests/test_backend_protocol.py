"""A backend written against the public protocol only runs a program, with no edit to the launcher.

``InlineBackend`` is what ``docs/backends.md`` describes: every node in a thread
of the launcher, the coordinator in the launcher. It uses nothing but
``tlaunch.backends``' public names.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
from programs import Producer, consumer_producers

from tlaunch import backends
from tlaunch import lp_ssh as lp
from tlaunch.errors import LaunchError


class InlineBackend(backends.BackendTraits):
    """Every node in a thread of this process; no restarts, no detach."""

    name: ClassVar[str] = "inline"
    terminals: ClassVar[tuple[str, ...]] = ("current_terminal",)
    placement: ClassVar[backends.Placement] = "threads"
    can_detach: ClassVar[bool] = False
    Options: ClassVar[type[backends.BackendOptions]] = backends.NoOptions

    def __init__(self, plan: Any, terminal: str, options: Any) -> None:
        self.record: dict[str, Any] = {"hosts": ["localhost"]}
        self.exceptions: dict[str, BaseException] = {}
        self.threads: list[threading.Thread] = []

    def prepare(self, run: backends.RunSpec) -> None:
        pass

    def start(self, run: backends.RunSpec) -> backends.InProcessCoordinator:
        coordinator = run.coordinator_here()
        for spec in run.plan.nodes:
            thread = threading.Thread(target=self.run_node, args=(run, coordinator, spec.key), daemon=True)
            thread.start()
            self.threads.append(thread)
        return coordinator

    def run_node(self, run: backends.RunSpec, coordinator: Any, key: str) -> None:
        error = backends.execute_node(run.nodes[key], key, run.config(), coordinator)
        if error is not None:
            self.exceptions[key] = error
        coordinator.node_finished(key, error is None, None, 0 if error is None else 1)

    def stop(self, grace: float) -> None:
        for thread in self.threads:
            thread.join(grace)

    def detach(self) -> None:
        raise LaunchError("inline runs end with their launcher")


def test_a_new_backend_runs_consumer_producers(tmp_path: Path) -> None:
    out = tmp_path / "results"
    run = lp.launch(consumer_producers(str(out), n=4), launch_type=InlineBackend)
    assert out.read_text() == repr([0, 2, 4, 6])
    status = run.status()
    assert status["consumer/0"]["state"] == "done"
    assert {status[f"producer/{i}"]["state"] for i in range(4)} <= {"stopped", "done"}
    assert not any(t.is_alive() for t in run._backend.threads)  # type: ignore[attr-defined]


def test_a_registered_backend_is_a_launch_type(tmp_path: Path) -> None:
    backends.register_backend(InlineBackend)
    assert "inline" in backends.backend_names()
    out = tmp_path / "results"
    lp.launch(consumer_producers(str(out), n=2), launch_type="inline")
    assert out.read_text() == repr([0, 2])


def test_its_failures_reach_the_launcher_with_the_nodes_own_exception() -> None:
    def explode() -> None:
        raise ValueError("inline node exploded")

    p = lp.Program("fail")
    p.add_node(lp.PyNode(explode), label="bad")
    p.add_node(lp.CourierNode(Producer), label="server")
    with pytest.raises(lp.RunFailedError) as info:
        lp.launch(p, launch_type=InlineBackend)
    assert info.value.node == "bad/0" and "inline node exploded" in (info.value.remote_traceback or "")
    assert isinstance(info.value.__cause__, ValueError)


def test_options_it_does_not_take_are_refused_before_anything_starts() -> None:
    p = lp.Program("opts")
    p.add_node(lp.PyNode(print), label="x")
    with pytest.raises(LaunchError, match=r"\['working_dir'\] belong to launch_type 'ssh', not to 'inline'"):
        lp.launch(p, launch_type=InlineBackend, working_dir="/tmp")
    with pytest.raises(LaunchError, match=r"unknown launch options \['colour'\] for launch_type 'inline'"):
        lp.launch(p, launch_type=InlineBackend, colour="blue")


@pytest.mark.parametrize("launch_type", ["local_mt", "local_mp"])
def test_builtin_backends_name_the_backend_an_option_belongs_to(launch_type: str) -> None:
    p = lp.Program("opts")
    p.add_node(lp.PyNode(print), label="x")
    with pytest.raises(
        LaunchError, match=rf"\['working_dir'\] belong to launch_type 'ssh', not to '{launch_type}'"
    ):
        lp.launch(p, launch_type=launch_type, working_dir="/tmp")
    with pytest.raises(LaunchError, match=rf"detach=True needs .* '{launch_type}' cannot"):
        lp.launch(p, launch_type=launch_type, detach=True)
    with pytest.raises(LaunchError, match=r"env key 'A=B' is not a valid variable name"):
        lp.launch(p, launch_type=launch_type, env={"A=B": "1"})


def test_every_run_handle_has_the_one_join_and_results() -> None:
    """``join(timeout) -> RunSnapshot`` is the one wait contract of every kind of handle (the
    protocol's only wait), whatever backend made it; ``results()`` reads the one result format."""
    import inspect

    from tlaunch.backends.handle import RunHandle
    from tlaunch.backends.k8s.run import LPJobRun
    from tlaunch.backends.recorded import RecordedRun
    from tlaunch.backends.slurm.job import SlurmJob
    from tlaunch.backends.ssh.attached import SSHRun
    from tlaunch.run import Run

    assert "join" in dir(RunHandle) and "wait" not in dir(RunHandle)
    for kind in (Run, RecordedRun, SSHRun, SlurmJob, LPJobRun):
        join = inspect.signature(kind.join)
        assert list(join.parameters) == ["self", "timeout"], kind
        assert join.parameters["timeout"].default is None and join.return_annotation == "RunSnapshot", kind
        assert inspect.signature(kind.results).return_annotation in ("JobResult | None", "None"), kind


def _env_to(path: str) -> None:
    import os

    with open(path, "w") as f:
        f.write(os.environ.get("TYPED", "") + " " + os.environ.get("FLAT", ""))


def test_launch_takes_typed_options_and_converts_launchpads_keywords_once(tmp_path: Path) -> None:
    """``options=LaunchOptions(...)`` and ``backend_options=`` one backend's options, as objects; Launchpad's
    keywords (every option by name) still work, over the typed ones; another backend's options are refused
    before anything starts, naming the type to give."""
    from tlaunch.backends.ssh.options import SSHOptions
    from tlaunch.options import LaunchOptions

    out = tmp_path / "env"
    p = lp.Program("typed")
    p.add_node(lp.PyNode(_env_to, str(out)), label="w")
    typed = LaunchOptions(env={"TYPED": "a", "FLAT": "b"})
    run = lp.launch(p, launch_type="local_mp", terminal="output_to_files", wait=False, options=typed,
                    env={"TYPED": "a", "FLAT": "c"})  # fmt: skip
    assert run.join(timeout=60).state.value == "SUCCEEDED"
    assert out.read_text() == "a c"  # the keyword's env wins over the typed one's
    with pytest.raises(
        LaunchError, match=r"backend_options=SSHOptions\(...\) are not launch_type 'local_mp''s"
    ):
        lp.launch(p, launch_type="local_mp", backend_options=SSHOptions(python="/x"))
    with pytest.raises(LaunchError, match=r"options \['srun_args'\] belong to launch_type 'slurm'"):
        lp.launch(p, launch_type="local_mp", srun_args=["--exclusive"])
