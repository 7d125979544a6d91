"""An LPJob as tlaunch reports a run (pure): its pods as nodes, its state, its root cause.

Works on the API's own JSON (an LPJob, its pods as ``sanitize_for_serialization``
writes them). An LPJob of a Launchpad program (it has ``runFiles``) has a
coordinator pod and a pod per node: a pod is reported as its node
(``producer/2``, host: the pod), and the coordinator prints the run's final
report (``{"tlaunch_final": ...}``) in its log when it exits. Any other LPJob
(``tlaunchrun``'s) is reported pod by pod (key and host: the pod's name).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from tlaunch.backends.handle import Failure, NodeStatus, RunState
from tlaunch.k8s.children import LABEL_INDEX, LABEL_ROLE
from tlaunch.k8s.children import pod_name as children_pod_name
from tlaunch.runtime.debugger.pause import paused_in_log

__all__ = [
    "COORDINATOR",
    "POD_STATES",
    "coordinator_pod",
    "ended_pods",
    "failed_pod",
    "final_report",
    "is_program",
    "job_refs",
    "job_state",
    "node_status",
    "nodes",
    "phase_of",
    "pod_failure",
    "pod_key",
    "pod_name",
    "pod_phase",
    "running_node_pods",
    "traceback_in",
]

COORDINATOR = "coordinator"
"""The key of a program's coordinator pod (its logs: ``logs("coordinator")``)."""
POD_STATES = {"Pending": "pending", "Running": "running", "Succeeded": "done", "Failed": "failed"}
"""A pod's phase as a node's state (``Unknown``: the node's host is lost)."""
_PHASES = {
    "Created": RunState.PENDING,
    "Running": RunState.RUNNING,
    "Restarting": RunState.RESTARTING,
    "Succeeded": RunState.SUCCEEDED,
    "Failed": RunState.FAILED,
}
_FINAL = '{"tlaunch_final"'


def pod_phase(state: str) -> str:
    """The pod phase a node state stands for (``running`` -> ``Running``; others unchanged)."""
    return next((phase for phase, s in POD_STATES.items() if s == state), state)


def is_program(lpjob: Mapping[str, Any]) -> bool:
    """Whether ``lpjob`` runs a Launchpad program (a coordinator pod and a pod per node)."""
    return bool((lpjob.get("spec") or {}).get("runFiles"))


def _groups(lpjob: Mapping[str, Any]) -> dict[str, str]:
    """Each role's group label (``$TLAUNCH_GROUP`` of the role's pods)."""
    out = {}
    for role in (lpjob.get("spec") or {}).get("roles") or []:
        for item in role.get("env") or []:
            if item.get("name") == "TLAUNCH_GROUP":
                out[role["name"]] = str(item.get("value", ""))
    return out


def pod_key(lpjob: Mapping[str, Any], pod: Mapping[str, Any]) -> str:
    """The node a pod runs (``label/index``), ``coordinator``, or (not a program) the pod's name."""
    meta = pod.get("metadata") or {}
    if not is_program(lpjob):
        return str(meta.get("name", ""))
    labels = meta.get("labels") or {}
    role = labels.get(LABEL_ROLE, "")
    if role == COORDINATOR:
        return COORDINATOR
    label = _groups(lpjob).get(role, role)
    return f"{label}/{labels.get(LABEL_INDEX, '0')}"


def _time(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _container(pod: Mapping[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return dict(statuses[0] or {})


def node_status(lpjob: Mapping[str, Any], pod: Mapping[str, Any]) -> NodeStatus:
    """A pod as a node of the run (its key; its host: the pod; its state, exit code and reason)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    state = (_container(pod).get("state")) or {}
    term, running, waiting = state.get("terminated"), state.get("running"), state.get("waiting")
    reason = None
    if waiting and waiting.get("reason"):  # ImagePullBackOff, ContainerCreating...
        reason = str(waiting["reason"]) + (f": {waiting['message']}" if waiting.get("message") else "")
    elif term and phase == "Failed":
        reason = f"exit code {term.get('exitCode')}" + (f" ({term['reason']})" if term.get("reason") else "")
    elif meta.get("deletionTimestamp") and phase in ("Pending", "Running"):
        reason = "its pod is being deleted"
    return NodeStatus(
        key=pod_key(lpjob, pod),
        host=str(meta.get("name", "")),
        state=POD_STATES.get(phase, "lost"),
        exit_code=term.get("exitCode") if term else None,
        reason=reason,
        restarts=int(_container(pod).get("restartCount") or 0),
        started_at=_time((term or running or {}).get("startedAt") or status.get("startTime")),
        finished_at=_time((term or {}).get("finishedAt")),
    )


def nodes(
    lpjob: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], logs: Mapping[str, str] | None = None
) -> tuple[NodeStatus, ...]:
    """Every node of the job (a program's coordinator aside), in role and index order.

    ``logs``: pods' logs (by pod name), where a node that waits in a debugger says so
    (``paused``: its file and line, kind, rank, as its announcement says them).
    """
    order = {role["name"]: i for i, role in enumerate((lpjob.get("spec") or {}).get("roles") or [])}

    def rank(pod: Mapping[str, Any]) -> tuple[int, int, str]:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        index = str(labels.get(LABEL_INDEX, "0"))
        return (order.get(labels.get(LABEL_ROLE, ""), 1 << 20), int(index) if index.isdigit() else 0, "")

    found = [node_status(lpjob, p) for p in sorted(pods, key=rank)]
    if logs:
        found = [
            dataclasses.replace(n, paused=paused_in_log(logs[n.host].splitlines()).get(n.key))
            if n.state == "running" and n.host in logs
            else n
            for n in found
        ]
    return tuple(n for n in found if n.key != COORDINATOR)


def running_node_pods(lpjob: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """The names of a program's running node pods (whose logs say whether they wait in a debugger)."""
    if not is_program(lpjob):
        return []
    return [
        str(p["metadata"]["name"])
        for p in pods
        if (p.get("status") or {}).get("phase") == "Running" and pod_key(lpjob, p) != COORDINATOR
    ]


def pod_name(lpjob: Mapping[str, Any], key: str) -> str:
    """The name of the pod of a program's node ``key`` (``label/i``), as the operator names it."""
    label, _, index = key.rpartition("/")
    role = next((r for r, lab in _groups(lpjob).items() if lab == label), label)
    return children_pod_name(str((lpjob.get("metadata") or {}).get("name", "")), role, int(index or 0))


def coordinator_pod(lpjob: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> str | None:
    """The name of a program's coordinator pod, if it has one now."""
    found = [p for p in pods if is_program(lpjob) and pod_key(lpjob, p) == COORDINATOR]
    return str(found[0]["metadata"]["name"]) if found else None


def job_state(lpjob: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> RunState:
    """The run's state from its LPJob's phase (and, before any runs, its pods')."""
    if (lpjob.get("metadata") or {}).get("deletionTimestamp"):
        return RunState.STOPPING
    phase = str((lpjob.get("status") or {}).get("phase") or "Created")
    state = _PHASES.get(phase, RunState.PENDING)
    if state is RunState.PENDING and any((p.get("status") or {}).get("phase") == "Running" for p in pods):
        return RunState.RUNNING
    return state


def phase_of(state: RunState) -> str:
    """The LPJob phase a run's state stands for, when the LPJob is gone (``Deleted``: stopped)."""
    named = {RunState.STOPPED: "Deleted", RunState.LOST: "Unknown", RunState.STOPPING: "Terminating"}
    return next((p for p, s in _PHASES.items() if s is state), named.get(state, str(state)))


def job_refs(lpjob: Mapping[str, Any]) -> dict[str, str]:
    """The LPJob's names and its own words for its state (``phase``, ``roles_ready``, ``restarts``)."""
    meta, status = lpjob.get("metadata") or {}, lpjob.get("status") or {}
    refs = {"lpjob": str(meta.get("name", "")), "namespace": str(meta.get("namespace", ""))}
    refs["phase"] = str(status.get("phase") or "Created")
    refs["roles_ready"] = str(status.get("rolesReady") or "")
    refs["restarts"] = str(status.get("restarts") or 0)
    return refs


def ended_pods(pods: Iterable[Mapping[str, Any]]) -> bool:
    """Whether every pod has ended (Succeeded or Failed)."""
    return all((p.get("status") or {}).get("phase") in ("Succeeded", "Failed") for p in pods)


def failed_pod(pods: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first pod to fail (by its container's end), if one did."""
    failed = [p for p in pods if (p.get("status") or {}).get("phase") == "Failed"]

    def ended(pod: Mapping[str, Any]) -> float:
        term = (_container(pod).get("state") or {}).get("terminated") or {}
        return _time(term.get("finishedAt")) or float("inf")

    return min(failed, key=ended) if failed else None


def final_report(log: str) -> dict[str, Any] | None:
    """A program's final report (node states, stop reason and kind, first failure), from the coordinator."""
    for line in reversed(log.splitlines()):
        if line.startswith(_FINAL):
            try:
                return dict(json.loads(line)["tlaunch_final"])
            except (ValueError, KeyError, TypeError):
                return None
    return None


def traceback_in(log: str) -> str | None:
    """The last Python traceback of a log, with the exception's line(s) after it."""
    lines = log.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if not starts:
        return None
    block = lines[starts[-1] :]
    end = next(
        (i + 1 for i, line in enumerate(block) if i > 0 and line and not line[0].isspace()), len(block)
    )
    return "\n".join(block[:end]) + "\n"


def pod_failure(lpjob: Mapping[str, Any], pod: Mapping[str, Any], log: str) -> Failure:
    """The root cause, when a pod failed and no coordinator said more: the pod, its exit, its traceback."""
    node = node_status(lpjob, pod)
    name = str((pod.get("metadata") or {}).get("name", ""))
    reason = f"pod {name} failed" + (f": {node.reason}" if node.reason else "")
    host = name
    return Failure(
        node=node.key, host=host, exit_code=node.exit_code, reason=reason, traceback=traceback_in(log)
    )
