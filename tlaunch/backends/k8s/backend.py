"""Kubernetes backend (``launch_type="k8s"`` or ``"kubernetes"``): a Launchpad program as an LPJob.

1. ``prepare``: the cluster's credentials (:func:`tlaunch.k8s.client.connect`);
   the run's files, built by :class:`~tlaunch.backends.base.RunSpec` as for
   every backend (the coordinator's head file; a node file per node, with its
   group's flags and environment); each group's pods (image, resources, pod
   fields: :mod:`tlaunch.backends.k8s.groups`); the LPJob and the Secret of the
   files (:mod:`tlaunch.backends.k8s.manifests`), which must fit in 1 MiB.
   Nothing is created.
2. ``start``: the Secret, then the LPJob, then the LPJob made the Secret's
   owner (deleting the job deletes the keys). If any step is refused, what was
   made is deleted and a :class:`LaunchError` says why. The operator
   (``docs/k8s.md``) makes the pods: the coordinator's, then one per node, each
   node under a supervisor as on an SSH host. The launcher follows the job
   through the API (:class:`~tlaunch.backends.k8s.link.LPJobLink`) and, with
   ``current_terminal``, prints the pods' output as it comes.
3. ``stop``: a job that ended by itself is left for ``kubectl`` and ``tlaunch
   logs`` to read (its pods have exited); otherwise the LPJob is deleted and
   the backend waits until it and its pods are gone.

A run outlives its launcher (``detach``, Ctrl-\\): it is the cluster's job.
``tlaunch.control.find_run(run_id)`` finds it again from its record
(:meth:`K8sBackend.attach`: an :class:`~tlaunch.backends.k8s.run.LPJobRun`).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import threading
import time
from typing import Any, ClassVar

from tlaunch.backends.base import BackendOptions, OutputSink, Placement, RunSpec
from tlaunch.backends.handle import RunHandle
from tlaunch.backends.k8s import manifests, observe
from tlaunch.backends.k8s.api import NOT_INSTALLED, JobAPI, asking
from tlaunch.backends.k8s.groups import Config
from tlaunch.backends.k8s.link import LPJobLink
from tlaunch.backends.k8s.options import K8sOptions
from tlaunch.backends.k8s.run import BACKEND, LPJobRun, follow_logs
from tlaunch.backends.traits import BackendTraits
from tlaunch.errors import LaunchError, StopError
from tlaunch.hosts import HostSpec
from tlaunch.k8s.children import run_secret_name
from tlaunch.k8s.client import connect
from tlaunch.k8s.crd import GROUP, PLURAL, VERSION
from tlaunch.k8s.pod import node_file_name
from tlaunch.plan import LaunchPlan
from tlaunch.runtime.records import RunRecord

__all__ = ["K8sBackend"]

log = logging.getLogger(__name__)

HEARTBEAT_TIMEOUT = 10.0
"""Seconds the coordinator waits for a node's supervisor to be heard from before it fails the node."""
_ENDED_WAIT = 15.0


class K8sBackend(BackendTraits):
    """A run as an LPJob (see the module docstring)."""

    name: ClassVar[str] = BACKEND
    terminals: ClassVar[tuple[str, ...]] = ("current_terminal", "output_to_files")
    placement: ClassVar[Placement] = "hosts"
    can_detach: ClassVar[bool] = True
    Options: ClassVar[type[BackendOptions]] = K8sOptions

    @classmethod
    def attach(cls, run_dir: str, record: RunRecord) -> RunHandle:
        """An LPJob run found again from its record (its job and cluster are in ``record.refs``)."""
        return LPJobRun.from_record(run_dir, record)

    def __init__(self, plan: LaunchPlan, terminal: str, options: K8sOptions | None = None) -> None:
        if terminal not in self.terminals:
            raise LaunchError(
                f"terminal {terminal!r} is not available on Kubernetes; use one of {list(self.terminals)}"
            )
        placed = [n.key for n in plan.nodes if n.host is not None]
        if placed:
            raise LaunchError(
                f"node {placed[0]!r} is placed with .to_host(); on Kubernetes every node gets a pod of its "
                "own: drop .to_host() (place a group's pods with group_config={label: "
                "Config(node_selector=...)})"
            )
        self.opts = options or K8sOptions()
        labels = list(dict.fromkeys(n.label for n in plan.nodes))
        unknown = sorted(set(self.opts.group_config) - set(labels))
        if unknown:
            raise LaunchError(f"group_config names {unknown}, which are not groups of the program: {labels}")
        self._configs = {label: self.opts.group_config.get(label) or Config() for label in labels}
        self._roles = {label: c.role(label, self.opts.image) for label, c in self._configs.items()}
        self._flags = {label: c.node_flags(label) for label, c in self._configs.items()}
        self._env = {label: c.node_env(label) for label, c in self._configs.items()}
        self._plan = plan
        self._terminal = terminal
        self._api: JobAPI | None = None
        self._lpjob: dict[str, Any] = {}
        self._secret: dict[str, Any] = {}
        self._made: list[str] = []  # "secret", "lpjob": what start created
        self._link: LPJobLink | None = None
        self._leaving = threading.Event()
        self._stream: threading.Thread | None = None
        self._stopped = False
        self.record: dict[str, Any] = {}
        self.exceptions: dict[str, BaseException] = {}

    # -- prepare ----------------------------------------------------------------
    def prepare(self, run: RunSpec) -> None:
        kube = connect(self.opts.kube_config)
        namespace = kube.namespace_for(self.opts.namespace)
        name = manifests.job_name(run.plan.program_name, run.run_id)
        pods = manifests.pod_names(name, run.plan)
        placed = dataclasses.replace(  # the coordinator reports each node on its pod
            run.plan, nodes=tuple(dataclasses.replace(n, host=HostSpec(pods[n.key])) for n in run.plan.nodes)
        )
        head = dataclasses.replace(run, plan=placed).head_file(
            "", HEARTBEAT_TIMEOUT, keep=True, attached=False
        )
        files = {"head": pickle.dumps(head)}
        for spec in run.plan.nodes:
            config = run.config(pods[spec.key], bind_host="0.0.0.0", advertise_host="")
            flags = {**(config.flags or {}), **self._flags[spec.label]}
            config = config._replace(flags=flags or None)
            node = run.node_file(spec.key, config, "", keep=True)
            node = node._replace(env={**node.env, **self._env[spec.label]})
            files[node_file_name(spec.key)] = pickle.dumps(node)
        size = sum(len(v) for v in files.values())
        if size > manifests.SECRET_LIMIT * 3 // 4:  # base64 grows it by a third
            raise LaunchError(
                f"the program's nodes take {size / 2**20:.1f} MiB pickled, more than a Secret holds (1 MiB): "
                "pass large data as files in the image or a volume, and paths to the nodes"
            )
        image = self.opts.image or next(iter(self._roles.values()))["image"]
        self._lpjob = manifests.lpjob(
            name,
            namespace,
            run.plan,
            image=image,
            pull_policy=self.opts.image_pull_policy,
            port=self.opts.coordinator_port,
            gpu_stack=self.opts.gpu_stack,
            group_roles=self._roles,
        )
        self._secret = manifests.run_secret(name, namespace, files)
        self._api = JobAPI(kube, name, namespace)
        refs = {"lpjob": name, "namespace": namespace, "kind": "program"}
        if kube.kube_config:
            refs["kube_config"] = kube.kube_config
        self.record.update(hosts=list(pods.values()), refs=refs)

    # -- start ------------------------------------------------------------------
    def start(self, run: RunSpec) -> LPJobLink:
        api = self._api
        assert api is not None, "prepare() first"
        with run.progress.phase("submit", 1) as tick:
            try:
                self._create(api)
            except LaunchError:
                self._undo()
                raise
            tick()
        address = manifests.coordinator_address(api.name, api.namespace, self.opts.coordinator_port)
        self._link = link = LPJobLink(api, address, run.settings.stop_grace)
        if run.sink is not None and self._terminal == "current_terminal":
            self._stream = threading.Thread(
                target=self._print,
                args=(api, link, run.sink),
                name=f"tlaunch-lpjob-logs-{api.name}",
                daemon=True,
            )
            self._stream.start()
        return link

    def _create(self, api: JobAPI) -> None:
        """The Secret, the LPJob, then the LPJob as the Secret's owner; ``_made`` says what was made."""
        kube, secret = api.kube, run_secret_name(api.name)
        with asking(kube, f"the cluster refused Secret {secret!r}", if_missing=NOT_INSTALLED):
            kube.core.create_namespaced_secret(api.namespace, self._secret)
        self._made.append("secret")
        with asking(kube, f"the cluster refused LPJob {api.name!r}", if_missing=NOT_INSTALLED):
            made = kube.custom.create_namespaced_custom_object(
                GROUP, VERSION, api.namespace, PLURAL, self._lpjob
            )
        self._made.append("lpjob")
        owner = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "LPJob",
            "name": api.name,
            "uid": made["metadata"]["uid"],
            "controller": False,
        }
        with asking(kube, f"could not make LPJob {api.name!r} the owner of its Secret (the run's keys)"):
            kube.core.patch_namespaced_secret(
                secret, api.namespace, {"metadata": {"ownerReferences": [owner]}}
            )

    def _print(self, api: JobAPI, link: LPJobLink, sink: OutputSink) -> None:
        """The nodes' output on the launcher's terminal, until the run ends or the launcher leaves."""
        try:
            for line in follow_logs(api, lambda key, pod: key != observe.COORDINATOR, self._done_printing):
                link.saw(line.node, line.text)  # a pause for the debugger shows in the node's state
                sink.line(line.node, line.text)
        except LaunchError as exc:
            log.warning("stopped showing LPJob %s's output: %s", api.name, exc)

    def _done_printing(self) -> bool:
        return self._leaving.is_set() or (self._link is not None and self._link.settled)

    def _undo(self) -> None:
        """Delete what ``start`` made (the LPJob takes its pods; the Secret is deleted by name too)."""
        api = self._api
        if api is None:
            return
        if "lpjob" in self._made:
            try:
                api.delete()
            except LaunchError as exc:
                log.error("could not delete LPJob %s after a failed launch: %s", api.name, exc)
        if "secret" in self._made:
            api.delete_secret(run_secret_name(api.name))
        self._made.clear()

    # -- stop -------------------------------------------------------------------
    def stop(self, grace: float) -> None:
        """Leave a job that ended by itself; delete one that is still going (see the module docstring).

        Raises:
            StopError: pods of the job are still there after the wait.
        """
        link, api = self._link, self._api
        if self._stopped or api is None:
            return
        if link is None or "lpjob" not in self._made:  # a launch that failed part-way
            self._leaving.set()
            self._undo()
            self._stopped = True
            return
        # Ended by itself: its pods are exiting (the coordinator ends them; without its report, it
        # never learnt of the failure: delete them).
        if link.ended_by_itself and self._pods_end(api, grace + _ENDED_WAIT if link.reported else 0.0):
            self._finish_printing()
            self._stopped = True
            return
        self._leaving.set()
        api.delete()
        deadline = time.monotonic() + grace + 60.0
        while True:
            job, pods = api.job(), api.pods(None)
            if job is None and not pods:
                break
            if time.monotonic() > deadline:
                raise StopError(
                    self._plan.run_id, {api.namespace: [p["metadata"]["name"] for p in pods] or [api.name]}
                )
            time.sleep(0.2)
        self._finish_printing()
        self._stopped = True

    def _pods_end(self, api: JobAPI, timeout: float) -> bool:
        """Wait until every pod of the job has exited; False if one still runs after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if observe.ended_pods(api.pods(api.job())):
                    return True
            except LaunchError as exc:
                log.warning("LPJob %s: %s", api.name, exc)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)

    def _finish_printing(self) -> None:
        if self._stream is not None:
            self._stream.join(5.0)
            self._leaving.set()

    def detach(self) -> None:
        """Leave the job to the cluster: stop following and printing it (its threads are joined)."""
        self._leaving.set()
        if self._link is not None:
            self._link.detach()
        if self._stream is not None:
            self._stream.join(5.0)
