"""The function launch's agent: one node per host that runs that host's workers.

It starts its workers at once (they import torch and unpickle the function
while the agents register), registers with the job's collector, sends each
worker its layout, then watches them. The first worker to fail ends the
host's other workers and is reported to the collector at once; when every
worker succeeded, their pickled results go to the collector. A stop of the
program ends every worker. The agent itself never imports torch.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from tlaunch import context
from tlaunch.torch.child_procs import Child, kill_all
from tlaunch.torch.collector import tell
from tlaunch.torch.env import source_env_file
from tlaunch.torch.outcomes import HostOutcome, WorkerFailure

__all__ = ["AgentSpec", "count_gpus", "free_port", "function_agent", "interface_address", "resolve_workers"]

_POLL = 0.02


@dataclass(frozen=True)
class AgentSpec:
    """What every agent of a function launch gets (the same for all hosts)."""

    payload: bytes
    """``(func, args, kwargs)``, cloudpickled in the launcher."""
    workers: list[int | str]
    """Workers per host: a count, or ``cpu``/``gpu``/``auto`` resolved on the host."""
    hosts: list[str]
    backend: str | None
    timeout: float
    env_file: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    master_interface: str | None = None


def count_gpus() -> int:
    """GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else what the driver lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        return 0 if visible.strip() in ("", "NoDevFiles") else len(entries)
    smi = shutil.which("nvidia-smi")
    if smi:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False)
            if out.returncode == 0:
                return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    with contextlib.suppress(OSError):
        return sum(1 for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit())
    return 0


def resolve_workers(spec: int | str) -> int:
    """The number of workers on this host for ``spec`` (a count, ``cpu``, ``gpu`` or ``auto``).

    Raises:
        RuntimeError: ``gpu`` on a host without visible GPUs.
    """
    if isinstance(spec, int):
        return spec
    cpus = len(os.sched_getaffinity(0))
    if spec == "cpu":
        return cpus
    gpus = count_gpus()
    if spec == "gpu" and gpus == 0:
        raise RuntimeError(
            f"workers_per_host='gpu' but host {socket.gethostname()!r} has no visible GPU "
            "(CUDA_VISIBLE_DEVICES, nvidia-smi -L); give a number of workers instead"
        )
    return gpus or cpus


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` on this host.

    Raises:
        RuntimeError: no such interface, or it has no IPv4 address.
    """
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        except OSError as exc:
            known = ", ".join(n for _, n in socket.if_nameindex())
            raise RuntimeError(
                f"master_interface={name!r}: no IPv4 address on host {socket.gethostname()!r} ({exc}); "
                f"its interfaces: {known}"
            ) from None
    return socket.inet_ntoa(packed[20:24])


def interface_of(address: str) -> str | None:
    """The name of this host's network interface that has IPv4 ``address``, or None."""
    for _, name in socket.if_nameindex():
        with contextlib.suppress(RuntimeError):
            if interface_address(name) == address:
                return name
    return None


def socket_env(address: str, environ: dict[str, str]) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME`` for the interface of ``address`` (unless set already).

    Gloo binds to the address its host name resolves to; on many clusters (and
    on the test hosts) that is loopback, and peers on other hosts are refused.
    The interface that carries the address the other hosts reach this one at
    is the right one.
    """
    if environ.get("GLOO_SOCKET_IFNAME"):
        return {}
    name = interface_of(address)
    return {"GLOO_SOCKET_IFNAME": name} if name else {}


def free_port() -> int:
    """A TCP port free on this host now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _layouts(spec: AgentSpec, index: int, infos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    counts = [int(i["workers"]) for i in infos]
    world = sum(counts)
    offset = sum(counts[:index])
    backend = spec.backend
    if backend == "auto":
        backend = "nccl" if all(i["gpus"] > 0 for i in infos) else "gloo"
    head = infos[0]
    env_common = {
        "WORLD_SIZE": world,
        "LOCAL_WORLD_SIZE": counts[index],
        "GROUP_RANK": index,
        "MASTER_ADDR": spec.master_addr or head["address"],
        "MASTER_PORT": head["port"],
    }
    return [
        {
            "env": {**env_common, "RANK": offset + lr, "LOCAL_RANK": lr},
            "backend": backend,
            "timeout": spec.timeout,
        }
        for lr in range(counts[index])
    ]


def function_agent(collector: Any, index: int, spec: AgentSpec) -> None:
    """Run host ``index``'s workers of a function launch (the body of its agent node)."""
    ctx = context.get_context()
    stop = context.stop_event()
    n = resolve_workers(spec.workers[index])
    work = tempfile.mkdtemp(prefix=f"tlaunch-torch-{ctx.run_id}-")
    children: list[Child] = []
    try:
        payload = os.path.join(work, "payload.pkl")
        fd = os.open(payload, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(spec.payload)
        env = dict(os.environ)
        if spec.env_file:
            env.update(source_env_file(spec.env_file))
        env.update(socket_env(ctx.address, env))
        env.update(PYTHONUNBUFFERED="1", TLAUNCH_TORCH_BACKEND=str(spec.backend or "none"))
        for lr in range(n):
            argv = [sys.executable, "-u", "-m", "tlaunch.torch.worker", payload, work, str(lr)]
            children.append(Child(argv, env, str(lr), stdin=True))
        port = spec.master_port or (free_port() if index == 0 else 0)
        address = interface_address(spec.master_interface) if spec.master_interface else ctx.address
        info = {
            "host": spec.hosts[index],
            "workers": n,
            "gpus": count_gpus(),
            "address": address,
            "port": port,
        }
        infos = collector.register(index, info, spec.timeout)
        offset = sum(int(i["workers"]) for i in infos[:index])
        for lr, (child, layout) in enumerate(zip(children, _layouts(spec, index, infos), strict=True)):
            child.tag = f"{lr}|{offset + lr}"
            child.send((json.dumps(layout) + "\n").encode())
        _watch(collector, index, spec, children, work, offset, stop)
        stop.wait()  # the launcher fetches the outcome from the collector, then stops the program
    finally:
        kill_all(children, grace=0.5)
        shutil.rmtree(work, ignore_errors=True)


def _watch(
    collector: Any, index: int, spec: AgentSpec, children: list[Child], work: str, offset: int, stop: Any
) -> None:
    host = spec.hosts[index]
    alive = [c.started for c in children]  # when each was last seen running (not exiting)
    while not stop.is_set():
        asked = time.time()
        codes = [c.poll() for c in children]
        bad = [(lr, code) for lr, code in enumerate(codes) if code not in (None, 0)]
        if bad:
            codes = _let_exiting_end(children, codes)  # a peer's death may have caused this one
            bad = [(lr, code) for lr, code in enumerate(codes) if code not in (None, 0)]
            kill_all([c for c in children if c.poll() is None], grace=0.2)
            reports = []
            for lr, code in bad:
                children[lr].drain(1.0)
                reports.append(_failure(work, host, offset, lr, int(code or 0), children[lr], alive[lr]))
            tell(functools.partial(collector.failed, index, reports), stop)
            return
        if all(code == 0 for code in codes):
            results = []
            for lr in range(len(children)):
                with open(os.path.join(work, f"result-{lr}.pkl"), "rb") as f:
                    results.append(f.read())
            tell(functools.partial(collector.finished, index, HostOutcome(results=tuple(results))), stop)
            return
        alive = [asked if code is None and not c.exiting() else was
                 for c, code, was in zip(children, codes, alive, strict=True)]  # fmt: skip
        time.sleep(_POLL)


def _let_exiting_end(children: list[Child], codes: list[int | None], wait: float = 1.0) -> list[int | None]:
    """The exit codes, once the workers that had begun to exit (:meth:`Child.exiting`) have ended (up
    to ``wait`` s): a worker killed while its threads end has closed its sockets, and its peers'
    errors may be seen first."""
    deadline = time.monotonic() + wait
    for lr, child in enumerate(children):
        if codes[lr] is None and child.exiting():
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(max(0.0, deadline - time.monotonic()))
    return [c.poll() for c in children]


def _failure(
    work: str, host: str, offset: int, lr: int, code: int, child: Child, alive: float
) -> WorkerFailure:
    """Worker ``lr``'s failure: its pickled error record, or (it died) its exit code and last lines.

    A worker that died without raising is dated when it was last seen running,
    not yet exiting (``alive``): its sockets closed after that, and so after it
    anything that follows from its death, such as a peer's "connection reset" in
    a collective, which that peer raises (and dates) later. Seen in the same
    poll, or from another host before it, the death is still the earlier,
    whatever the load on the host (a margin of 0.1 s before the poll that saw it
    was not, on a busy machine; nor is the last poll at which it could not be
    reaped yet: a process's sockets close before its threads have all ended).
    """
    path = os.path.join(work, f"error-{lr}.pkl")
    if not os.path.exists(path):
        return WorkerFailure(host, alive, code, offset + lr, lr, log_tail=child.log_tail())
    with open(path, "rb") as f:
        error = f.read()
    try:  # a dict of builtins, written by tlaunch.torch.worker
        when = float(pickle.loads(error).get("time", time.time()))
    except Exception:
        when = time.time()
    return WorkerFailure(host, when, code, offset + lr, lr, error=error)
