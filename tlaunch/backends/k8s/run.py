"""An LPJob as a :class:`~tlaunch.backends.handle.RunHandle`: :class:`LPJobRun`.

The same handle serves a Launchpad program launched with ``launch_type="k8s"``
(or ``lp_k8s``) and a job ``tlaunchrun`` or ``tlaunch.control.submit``
created, found again from its record in the run store (``find_run``) or by
the LPJob's name (``tlaunchrun status NAME``)::

    run.snapshot()             # the LPJob's state, each node (pod) with its own, the root cause
    run.logs(follow=True)      # the pods' output, until the job ends (the API is polled)
    run.stop()                 # deletes the LPJob: the operator deletes its pods, then its Secret goes
    run.reach(address, pod)    # a local address leading to a pod's port (the API server's port-forward)
    run.wait()                 # raises the failing node's RunFailedError (its pod, its traceback)

A node waiting in a debugger is ``paused`` (its pod's log says so). Once the job
has ended, its record keeps its final state, after the LPJob is deleted too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tlaunch.backends.handle import Failure, LogLine, NodeStatus, RunSnapshot, RunState, ended_state
from tlaunch.backends.k8s import observe
from tlaunch.backends.k8s.api import JobAPI
from tlaunch.backends.k8s.manifests import LABEL_RUN_ID
from tlaunch.backends.observed import Scheduled
from tlaunch.backends.runstates import ended_from
from tlaunch.errors import LaunchError, StopError
from tlaunch.k8s.client import connect
from tlaunch.k8s.forward import LocalForward
from tlaunch.runtime.records import RunRecord, mark_ended, read_record, write_record

__all__ = ["BACKEND", "LPJobRun", "follow_logs"]

BACKEND = "k8s"
POLL = 0.5


class LPJobRun(Scheduled):
    """LPJob ``namespace/name`` as a run (see the module docstring).

    Args:
        name: the LPJob's name (``kubectl get lpjob NAME``).
        namespace: its namespace.
        run_id: tlaunch's id of the run (default: the LPJob's ``tlaunch.io/run-id`` label, else its name).
        kube_config: the kubeconfig of its cluster (default: :func:`tlaunch.k8s.client.connect`'s).
        run_dir: its folder in the run store, where it has one (its record).
        api: a connection to the job already made.
    """

    def __init__(
        self,
        name: str,
        namespace: str,
        run_id: str | None = None,
        *,
        kube_config: str | None = None,
        run_dir: str | None = None,
        api: JobAPI | None = None,
    ) -> None:
        self.name = name
        self.namespace = namespace
        self.run_dir = run_dir
        self.kube_config = kube_config
        self._run_id = run_id
        self._job_api = api
        self._primed: dict[str, Any] | None = None
        self._record: RunRecord | None = None
        if run_dir is not None:
            self._record = read_record(run_dir)

    @classmethod
    def from_record(cls, run_dir: str, record: RunRecord, api: JobAPI | None = None) -> LPJobRun:
        """The run recorded in ``run_dir`` (its LPJob and cluster from the record's ``refs``).

        ``api``: a connection to the job already made, used where the recorded
        kubeconfig is not a file here (another machine's).
        """
        refs = record.refs
        kube_config = refs.get("kube_config")
        run = cls(
            refs.get("lpjob", ""), refs.get("namespace", "default"), record.run_id, kube_config=kube_config
        )
        run.run_dir, run._record = run_dir, record
        if api is not None and (kube_config is None or not _exists(kube_config)):
            run._job_api = api
        return run

    def seen(self, job: dict[str, Any]) -> LPJobRun:
        """This handle, answering its next question with ``job`` as just read (a listing's)."""
        self._primed = job
        return self

    def __repr__(self) -> str:
        return f"LPJobRun({self.namespace}/{self.name})"

    @property
    def run_id(self) -> str:
        """tlaunch's id of the run."""
        if self._run_id is None:
            labels: dict[str, str] = {}
            with contextlib.suppress(LaunchError):
                labels = ((self._job() or {}).get("metadata") or {}).get("labels") or {}
            self._run_id = labels.get(LABEL_RUN_ID) or self.name
        return self._run_id

    @property
    def backend(self) -> str:
        """``k8s``."""
        return BACKEND

    # -- the cluster ----------------------------------------------------------
    def _api(self) -> JobAPI:
        if self._job_api is None:
            kube_config = self.kube_config
            if kube_config is not None and not _exists(kube_config):
                kube_config = None  # the file of another machine or session: this one's own credentials
            self._job_api = JobAPI(connect(kube_config), self.name, self.namespace)
        return self._job_api

    def _job(self) -> dict[str, Any] | None:
        if self._primed is not None:
            job, self._primed = self._primed, None
            return job
        return self._api().job()

    def status(self) -> dict[str, Any]:
        """The LPJob's status as the operator writes it (phase, roles, reason...); empty once it is gone."""
        return dict((self._job() or {}).get("status") or {})

    def _record_now(self) -> RunRecord | None:
        if self.run_dir is not None:
            with contextlib.suppress(OSError, ValueError):  # being rewritten: the last one read stands
                self._record = read_record(self.run_dir)
        return self._record

    # -- state ------------------------------------------------------------------
    def _asked(self, rec: RunRecord | None) -> RunSnapshot:
        """The run as the cluster says while its LPJob is there (its record says once it is gone)."""
        try:
            api = self._api()
            job = self._job()
            if job is None:
                return self._gone(rec)
            return self._observe(api, job, api.pods(job), rec)
        except LaunchError as exc:  # the cluster cannot be asked now
            return self._make(RunState.LOST, reason=str(exc))

    def _observe(
        self, api: JobAPI, job: dict[str, Any], pods: list[dict[str, Any]], rec: RunRecord | None
    ) -> RunSnapshot:
        state = observe.job_state(job, pods)
        logs = {} if state.ended else {n: api.log(n) for n in observe.running_node_pods(job, pods)}
        nodes = observe.nodes(job, pods, logs)
        reason = (job.get("status") or {}).get("reason")
        refs = observe.job_refs(job)
        final: dict[str, Any] | None = None
        failure: Failure | None = None
        if state.ended and observe.is_program(job):
            coordinator = [p for p in pods if observe.pod_key(job, p) == observe.COORDINATOR]
            if coordinator and not observe.ended_pods(coordinator):  # it is ending the other nodes
                return self._make(RunState.STOPPING, nodes, reason, refs=refs)
            final = observe.final_report(api.log(coordinator[0]["metadata"]["name"])) if coordinator else None
        if final is not None:
            nodes = tuple(NodeStatus.from_record(r) for r in (final.get("status") or {}).values())
            failure = Failure.from_report(final["failure"]) if final.get("failure") else None
            state, reason = ended_state(failure, final.get("stop_kind")), final.get("stop_reason") or reason
        elif state is RunState.FAILED:
            pod = observe.failed_pod(pods)
            if pod is not None:
                failure = observe.pod_failure(job, pod, api.log(pod["metadata"]["name"]))
        if state.ended and rec is not None:
            rec.refs.update(refs)  # the LPJob's own words, for when it is gone
            mark_ended(self.run_dir or "", rec, final or _final(nodes, reason, state, failure))
        return self._make(state, nodes, reason, failure, refs=refs)

    def _gone(self, rec: RunRecord | None) -> RunSnapshot:
        why = f"LPJob {self.namespace}/{self.name} is gone (deleted) and left no final state"
        if rec is not None and rec.stop_kind == "requested":  # stop() deleted it
            final = {"status": rec.final_status, "stop_reason": rec.stop_reason, "stop_kind": rec.stop_kind}
            mark_ended(self.run_dir or "", rec, final)
        elif rec is not None:
            mark_ended(self.run_dir or "", rec, {"lost": why, "stop_reason": why, "status": rec.final_status})
        if rec is not None:
            return self._recorded(rec)
        return self._make(RunState.LOST, reason=why)

    def _recorded(self, rec: RunRecord) -> RunSnapshot:
        end = ended_from(rec)
        refs = {"phase": observe.phase_of(end.state), "roles_ready": "", "restarts": "0", **rec.refs}
        return self._make(end.state, end.nodes, end.reason, end.failure, refs=refs)

    def _make(
        self,
        state: RunState,
        nodes: tuple[NodeStatus, ...] = (),
        reason: str | None = None,
        failure: Failure | None = None,
        refs: Mapping[str, str] | None = None,
    ) -> RunSnapshot:
        rec = self._record
        all_refs = {
            "lpjob": self.name,
            "namespace": self.namespace,
            **(rec.refs if rec else {}),
            **(refs or {}),
        }
        return RunSnapshot(
            run_id=self.run_id,
            backend=BACKEND,
            program=rec.program if rec else self.name,
            state=state,
            nodes=nodes,
            reason=reason,
            failure=failure,
            hosts=tuple(dict.fromkeys(n.host for n in nodes if n.host)),
            created=rec.created if rec else None,
            refs=all_refs,
        )

    def wait(self, *, timeout: float | None = None) -> RunSnapshot:
        """:meth:`join` (its name before every handle had ``join``)."""
        return self.join(timeout)

    def results(self) -> None:
        """None: an LPJob's pods write no job result."""
        return None

    # -- reaching into the cluster ----------------------------------------------
    def reach(self, address: str, host: str | None = None, *, once: bool = False) -> LocalForward:
        """A loopback address leading to ``address`` (a port of the coordinator, or of node pod
        ``host``) through the API server's port-forward (:mod:`tlaunch.k8s.forward`; ``once``: one
        connection); close it when done.

        Raises:
            LaunchError: the job has no such pod now, or the cluster cannot be asked.
        """
        port = int(address.rpartition(":")[2])
        api = self._api()
        pod = host
        if pod is None:
            job = self._job()
            pod = observe.coordinator_pod(job, api.pods(job)) if job is not None else None
            if pod is None:
                raise LaunchError(f"LPJob {self.namespace}/{self.name} has no coordinator pod now")
        return LocalForward(api.kube, self.namespace, pod, port, once=once)

    # -- logs -------------------------------------------------------------------
    def logs(self, node: str | None = None, *, follow: bool = False) -> Iterator[LogLine]:
        """The pods' output (node ``node``'s only: ``label/i``, or a pod); with ``follow``, to the job's end.

        A program's coordinator is left out unless asked for (``node="coordinator"``).

        Raises:
            KeyError: the job has no node ``node``.
        """
        api = self._api()
        job = self._job() or {}
        keys = {observe.pod_key(job, p): p["metadata"]["name"] for p in api.pods(job or None)} if job else {}
        known = set(keys) | set(keys.values()) | set((self._record_now() or _NO_RECORD).final_status or {})
        if node is not None and node not in known:
            shown = sorted(k for k in keys if k != observe.COORDINATOR)
            raise KeyError(f"run {self.run_id} has no node {node!r}; its nodes: {shown}")

        def pick(key: str, pod: str) -> bool:
            if node is None:
                return key != observe.COORDINATOR
            return node in (key, pod)

        return follow_logs(api, pick, lambda: not follow or self.snapshot().ended)

    # -- stop -------------------------------------------------------------------
    def stop(self, timeout: float = 60.0) -> None:
        """Delete the LPJob and wait until it and its pods are gone; its end is recorded. Idempotent.

        The operator deletes the pods (each node gets SIGTERM, then SIGKILL after the
        pod's grace); the run's Secret, owned by the LPJob, goes with it.

        Raises:
            StopError: the LPJob or pods of it are still there after ``timeout`` s.
            LaunchError: the cluster refused, or cannot be reached.
        """
        api = self._api()
        before = self.snapshot()
        rec = self._record_now()
        if rec is not None and not rec.ended:  # said first: whoever sees the LPJob gone knows why
            rec.final_status = {n.key: dataclasses.asdict(n) for n in before.nodes}
            rec.stop_reason = f"its LPJob was deleted (stop() from {type(self).__name__})"
            rec.stop_kind = "requested"
            write_record(self.run_dir or "", rec)
        api.delete()
        deadline = time.monotonic() + timeout
        while True:
            job, pods = api.job(), api.pods(None)
            if job is None and not pods:
                break
            if time.monotonic() > deadline:
                left = [p["metadata"]["name"] for p in pods] or [f"lpjob {self.name}"]
                raise StopError(self.run_id, {f"namespace {self.namespace}": left})
            time.sleep(0.2)
        self.snapshot()  # records the end


_NO_RECORD = RunRecord("", "", BACKEND, "", None)


def follow_logs(
    api: JobAPI, pick: Callable[[str, str], bool], done: Callable[[], bool], poll: float = POLL
) -> Iterator[LogLine]:
    """The lines of the job's pods that ``pick(key, pod)`` wants, read in turns as they grow, to ``done()``.

    The API is polled every ``poll`` s (each pod's whole log: the stand-in server,
    and older clusters, cannot follow from an offset); a pod made again (a
    restart) is read from its start.
    """
    offsets: dict[str, int] = {}
    pending: dict[str, tuple[str, str, str]] = {}  # uid -> (key, pod, partial line)
    job: dict[str, Any] = {}
    while True:
        last = done()  # asked before reading: what was written before the end is read after it
        now = api.job()
        job = now or job
        for pod in api.pods(now) if now is not None else []:
            meta = pod.get("metadata") or {}
            key, name, uid = observe.pod_key(job, pod), str(meta.get("name")), str(meta.get("uid"))
            if not pick(key, name):
                continue
            text = api.log(name)
            start = offsets.get(uid, 0)
            start = 0 if len(text) < start else start
            offsets[uid] = len(text)
            partial = pending.get(uid, (key, name, ""))[2]
            *lines, rest = (partial + text[start:]).split("\n")
            pending[uid] = (key, name, rest)
            for line in lines:
                yield _line(job, key, name, line)
        if last:
            for key, name, rest in pending.values():
                if rest:
                    yield _line(job, key, name, rest)
            return
        time.sleep(poll)


def _line(job: Mapping[str, Any], key: str, pod: str, text: str) -> LogLine:
    """A line of pod ``pod``, shown as its node's (``[producer/0]``) or, not a program's, its pod's."""
    return LogLine(key, text, host=pod, label=key if observe.is_program(job) else pod)


def _final(
    nodes: tuple[NodeStatus, ...], reason: str | None, state: RunState, failure: Failure | None
) -> dict[str, Any]:
    """What a record keeps of a job that ended without a coordinator's report (``tlaunchrun``'s)."""
    report = None
    if failure is not None:
        report = {
            "key": failure.node,
            "host": failure.host,
            "exit_code": failure.exit_code,
            "reason": failure.reason,
            "traceback": failure.traceback,
        }
    kind = {RunState.SUCCEEDED: "completed", RunState.FAILED: "failed"}.get(state, "requested")
    return {
        "status": {n.key: dataclasses.asdict(n) for n in nodes},
        "stop_reason": reason,
        "stop_kind": kind,
        "failure": report,
    }


def _exists(path: str) -> bool:
    return all(os.path.isfile(os.path.expanduser(p)) for p in path.split(":") if p)
