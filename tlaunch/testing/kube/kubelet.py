"""A stand-in kubelet: runs the stand-in API server's pods as processes on this machine, for tests.

It plays the parts of a cluster that a test of a program on Kubernetes needs,
and no more:

* a new pod's container command runs as a process of its own session (``python``
  is this interpreter: the "image" is this machine), with the pod's env; the
  downward API's ``metadata.name`` and ``status.podIP`` (``127.0.0.1``: every
  pod shares this machine's loopback);
* Secret and ConfigMap volumes are written under a folder of the pod's, given
  as ``$TLAUNCH_MOUNT_ROOT`` (``/etc/x`` is ``$TLAUNCH_MOUNT_ROOT/etc/x``);
* cluster DNS: ``$TLAUNCH_K8S_HOSTS`` maps every pod's name in its service
  (``<pod>.<subdomain>.<ns>.svc``) to ``127.0.0.1``, and so does the pod's own
  ``/etc/hosts`` (as root: each pod runs in a mount namespace of its own, where
  a copy of this machine's ``/etc/hosts`` with those names is mounted over it),
  so a program that resolves a pod's name (``MASTER_ADDR`` in torch) finds it;
* the pod's phase: ``Running`` once started, ``Succeeded``/``Failed`` with its
  exit code when its process ends; its output is its log (``pods/log``);
* a deleted pod's process gets SIGTERM, then SIGKILL after its grace;
* each pod has a ``/tmp`` of its own (``$TMPDIR``, under the kubelet's folder),
  as a container does: what a pod leaves there goes when the kubelet stops;
  where this process's ``$TMPDIR`` is set, the pods share it instead (a test's
  stand-in for a volume every pod mounts: one cache of built environments).

Everything it starts is stopped by pid when it stops.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["LocalKubelet"]

_CAN_MOUNT = os.geteuid() == 0 and shutil.which("unshare") is not None
"""Whether a pod can have a mount namespace of its own (root, util-linux's ``unshare``)."""
_OWN_ETC_HOSTS = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                  'mount --bind "$0" /etc/hosts && exec "$@"']  # fmt: skip
"""Runs ``HOSTS_FILE ARGV...`` with ``HOSTS_FILE`` as its ``/etc/hosts`` (the pid stays the program's)."""


@dataclass
class _Running:
    proc: subprocess.Popen[bytes]
    ns: str
    name: str
    uid: str
    log: str
    killed_at: float | None = None


class LocalKubelet:
    """Runs ``api``'s pods here (see the module docstring); a context manager."""

    def __init__(self, api: Any, grace: float = 3.0) -> None:
        self.api = api
        self.grace = grace
        self._dir = tempfile.mkdtemp(prefix="tlaunch-kubelet-")
        self._running: dict[str, _Running] = {}
        self._seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelet-standin", daemon=True)

    def __enter__(self) -> LocalKubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pids(self) -> list[int]:
        """The pids of the pods' processes still running."""
        return [r.proc.pid for r in self._running.values() if r.proc.poll() is None]

    def stop(self) -> None:
        """Stop watching; end every pod's process (by its pid's session)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        for run in self._running.values():
            if run.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.proc.pid, signal.SIGKILL)
                run.proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- the loop -------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self._tick()
            except Exception as exc:
                print(f"kubelet stand-in: {exc!r}", file=sys.stderr)

    def _tick(self) -> None:
        pods = {p["metadata"]["uid"]: p for p in self.api.list("", "pods", None)}
        for uid, pod in pods.items():
            if uid not in self._seen and not pod["metadata"].get("deletionTimestamp"):
                self._seen.add(uid)
                self._start(pod)
        for uid, run in list(self._running.items()):
            code = run.proc.poll()
            self._copy_log(run)
            if uid not in pods:  # deleted: SIGTERM, then SIGKILL after the grace
                if code is None and run.killed_at is None:
                    run.killed_at = time.monotonic()
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(run.proc.pid, signal.SIGTERM)
                elif (
                    code is None
                    and run.killed_at is not None
                    and time.monotonic() - run.killed_at > self.grace
                ):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(run.proc.pid, signal.SIGKILL)
                if code is not None:
                    del self._running[uid]
                continue
            if code is not None:
                phase = "Succeeded" if code == 0 else "Failed"
                with contextlib.suppress(LookupError):
                    self.api.set_pod_phase(
                        run.ns, run.name, phase, exit_code=code, reason=None if code == 0 else "Error"
                    )
                del self._running[uid]

    def _copy_log(self, run: _Running) -> None:
        with contextlib.suppress(OSError), open(run.log, errors="replace") as f:
            self.api.set_pod_log(run.ns, run.name, f.read())

    def _start(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        root = os.path.join(self._dir, uid)
        container = spec["containers"][0]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            self._mount(ns, volumes.get(mount["name"], {}), root + mount["mountPath"])
        hosts = [
            f"{p['spec'].get('hostname', p['metadata']['name'])}.{p['spec']['subdomain']}.{ns}.svc=127.0.0.1"
            for p in self.api.list("", "pods", ns)
            if p["spec"].get("subdomain")
        ]
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH")}
        env["TMPDIR"] = os.environ.get("TMPDIR") or os.path.join(root, "tmp")
        os.makedirs(env["TMPDIR"], mode=0o700, exist_ok=True)
        for item in container.get("env", []):
            field = (item.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
            value = {"metadata.name": name, "status.podIP": "127.0.0.1"}.get(
                field or "", item.get("value", "")
            )
            env[item["name"]] = value
        env.update(TLAUNCH_MOUNT_ROOT=root, TLAUNCH_K8S_HOSTS=",".join(hosts), PYTHONUNBUFFERED="1")
        argv = [*container.get("command", []), *container.get("args", [])]
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        if _CAN_MOUNT:  # the pod's /etc/hosts: this machine's, and the names of the pods of its namespace
            etc_hosts = os.path.join(root, "hosts")
            with open("/etc/hosts") as f, open(etc_hosts, "w") as out:
                out.write(f.read().rstrip("\n") + "\n")
                out.writelines(f"127.0.0.1 {h.partition('=')[0]}\n" for h in hosts)
            argv = [*_OWN_ETC_HOSTS, etc_hosts, *argv]
        log = os.path.join(self._dir, f"{uid}.log")
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self._running[uid] = _Running(proc, ns, name, uid, log)
        with contextlib.suppress(LookupError):
            self.api.set_pod_phase(ns, name, "Running")

    def _mount(self, ns: str, volume: dict[str, Any], path: str) -> None:
        os.makedirs(path, mode=0o700, exist_ok=True)
        if "secret" in volume:
            obj = self.api.get("", "v1", "secrets", ns, volume["secret"]["secretName"]) or {}
            items = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        elif "configMap" in volume:
            obj = self.api.get("", "v1", "configmaps", ns, volume["configMap"]["name"]) or {}
            items = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
        else:
            return
        for key, data in items.items():
            fd = os.open(os.path.join(path, key), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
