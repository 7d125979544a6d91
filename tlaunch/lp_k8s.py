"""Launchpad programs on Kubernetes, with the original TLaunch's names: ``lp_k8s.launch(program, ...)``.

A thin alias of ``launch(program, launch_type="k8s", ...)``
(:mod:`tlaunch.backends.k8s`): the program becomes an LPJob run by the
operator (``docs/k8s.md``), its coordinator in a pod, each node in a pod of
its own, each group's pods as ``group_config`` says::

    from tlaunch import lp_k8s
    from tlaunch.lp_k8s import Config, Container, Resource

    run = lp_k8s.launch(
        program,
        image="repo/trainer:1",
        namespace="team-rl",
        group_config={
            "learner": Config(container=Container(resources=Resource(cpu="4", memory="16Gi", nvidia_gpu=1))),
            "actor": Config(container=Container(resources=Resource(cpu="1", memory="2Gi"))),
        },
    )                 # waits; raises the failing node's RunFailedError, traceback included
    run.stop()        # deletes the LPJob (and with it its pods and the run's Secret)

The images must have tlaunch (and the program's dependencies) installed, at
the launcher's Python minor version. Needs ``pip install 'tlaunch[k8s]'``.
What the original offered and tlaunch does not (``ReverbNode``, ``GitSource``,
``MinioSource``, ``source=``) is refused with the way to do it here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tlaunch.backends.k8s import Config, Container, LPJobRun, Resource, ResourceRange
from tlaunch.backends.k8s.options import COORDINATOR_PORT, K8sOptions
from tlaunch.context import stop
from tlaunch.errors import LaunchError
from tlaunch.launcher import launch as _launch
from tlaunch.nodes import CourierNode
from tlaunch.options import LaunchOptions
from tlaunch.program import Program
from tlaunch.runtime.records import read_record

__all__ = [
    "COORDINATOR_PORT",
    "Config",
    "Container",
    "CourierNode",
    "GitSource",
    "K8sRun",
    "MinioSource",
    "Resource",
    "ResourceRange",
    "ReverbNode",
    "Source",
    "launch",
    "stop",
]

K8sRun = LPJobRun
"""The run ``launch`` returns: an :class:`~tlaunch.backends.k8s.LPJobRun`."""

_NO_SOURCE = (
    "tlaunch ships the program itself: its nodes travel pickled, with the user's own modules by value, "
    "in the run's Secret; put the program's dependencies in the image (Container(image=...))"
)


def launch(
    programs: Program | Sequence[Program],
    image: str | None = None,
    namespace: str | None = None,
    *,
    kube_config: str | None = None,
    group_config: Mapping[str, Config] | None = None,
    source: object = None,
    image_pull_policy: str = "IfNotPresent",
    gpu_stack: str = "hami",
    wait: bool = True,
    max_restarts: int = 0,
    stop_grace: float = 5.0,
    env: dict[str, str] | None = None,
    coordinator_port: int = COORDINATOR_PORT,
    timeout: float | None = None,
    terminal: str = "current_terminal",
) -> LPJobRun:
    """Run ``programs`` (its first, as Launchpad does) as an LPJob; wait for it unless ``wait=False``.

    Args:
        programs: the program.
        image: the image of every group without one of its own, and of the coordinator.
        namespace: the job's namespace (default: the service account's, the kubeconfig's, ``default``).
        kube_config: a kubeconfig file (default: ``$KUBECONFIG``, the pod's service account,
            ``~/.kube/config``).
        group_config: each group's :class:`Config`: image, command, flags, resources
            (vGPU on ``gpu_stack``), environment, pod fields (``node_selector``, ``tolerations``...).
        source: the original's code source; refused (the program travels itself).
        image_pull_policy: ``Always``, ``IfNotPresent`` or ``Never``.
        gpu_stack: ``hami`` or ``volcano``: how GPUs and vGPU shares are asked for.
        wait: wait until the job ends (Ctrl-C deletes it); else return at once (the job
            goes on after this process).
        max_restarts: restarts of each node (by its supervisor, in its pod).
        stop_grace: seconds nodes get after a stop.
        env: environment variables of every node.
        coordinator_port: the coordinator's port in its pod.
        timeout: (waiting) give up waiting after this many seconds; the job goes on.
        terminal: ``current_terminal`` (the nodes' output here, while waiting) or ``output_to_files``.

    Returns:
        The job as a run (``snapshot``, ``logs``, ``stop``, ``wait``).

    Raises:
        LaunchError: a node placed with ``to_host()``, a bad option or group config, a program
            too large for a Secret, or the cluster refused the job (nothing is left).
        RunFailedError: (waiting) a node failed: its key, its pod and its traceback; also of the
            node's built-in exception type.
        TimeoutError: (waiting) the job had not ended after ``timeout`` s.
    """
    if source is not None:
        raise LaunchError(f"source={source!r} is not supported: {_NO_SOURCE}")
    program = programs[0] if isinstance(programs, Sequence) else programs
    backend = K8sOptions(
        image=image,
        namespace=namespace,
        kube_config=kube_config,
        group_config=dict(group_config or {}),
        image_pull_policy=image_pull_policy,
        gpu_stack=gpu_stack,
        coordinator_port=coordinator_port,
    )
    # Not waiting: the job goes on without this process (detached). Waiting: Ctrl-C deletes the job,
    # Ctrl-\\ leaves it going; with a timeout, this process waits itself, then leaves it going.
    common = LaunchOptions(max_restarts=max_restarts, stop_grace=stop_grace, env=env, detach=not wait)
    waits = wait and timeout is None
    run = _launch(program, "k8s", terminal=terminal, wait=waits, options=common, backend_options=backend)
    if wait and timeout is not None:
        try:
            ended = run.wait(timeout=timeout)
        except KeyboardInterrupt:
            run.stop()
            raise
        if not ended:
            run.detach()  # the job goes on; this process no longer follows it
            raise TimeoutError(f"LPJob of run {run.run_id} is still {run.snapshot().state} after {timeout} s")
    job = LPJobRun.from_record(run.run_dir, read_record(run.run_dir))
    return job


class Source:
    """The original's source of the program's code (refused: the program travels itself)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise LaunchError(f"lp_k8s.{type(self).__name__} is not supported: {_NO_SOURCE}")


class GitSource(Source):
    """The original's git source (refused: see :class:`Source`)."""


class MinioSource(Source):
    """The original's MinIO source (refused: see :class:`Source`)."""


class ReverbNode:
    """The original's Reverb replay server (refused: Reverb is not part of tlaunch)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise LaunchError(
            "lp_k8s.ReverbNode is not supported: tlaunch has no Reverb; serve the replay buffer with "
            "lp.TransmitNode (queue, latest and replay tables: docs/transmit.md), or with a CourierNode "
            "of your own class"
        )
