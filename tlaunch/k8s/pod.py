"""What runs in a pod of a Launchpad program on Kubernetes: ``python -m tlaunch.k8s.pod head|node``.

:func:`tlaunch.lp_k8s.launch` makes an LPJob whose first role is the run's
coordinator and whose other roles are the program's groups, one pod per node,
and a Secret with the run's files (the head's, and one per node: the node, the
run's keys), mounted read-only at ``/etc/tlaunch-run``:

* ``head``: serves the run's coordinator on ``$TLAUNCH_COORDINATOR_PORT``,
  advertising the pod's IP; exits once every node has ended (the pod then
  succeeds, or fails if a node failed);
* ``node``: node ``<group>/<RANK>`` under a supervisor, as on an SSH host; it
  reaches the coordinator at ``$TLAUNCH_COORDINATOR`` (the coordinator pod's
  name in the job's headless service) and advertises the pod's IP; the pod
  fails when the node fails for good.

A name in ``$TLAUNCH_COORDINATOR`` is resolved by the cluster's DNS; where
there is none (the stand-in kubelet of the tests runs pods as processes here),
``$TLAUNCH_K8S_HOSTS`` (``name=ip,...``) answers first.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import signal
import socket
import sys
import tempfile
import time

from tlaunch.runtime.head import HeadFile, serve
from tlaunch.runtime.supervisor import NodeFile, Supervisor

__all__ = ["files_dir", "main", "node_file_name"]

FILES = "/etc/tlaunch-run"


def files_dir() -> str:
    """Where the run's Secret is mounted (under ``$TLAUNCH_MOUNT_ROOT`` for the stand-in kubelet)."""
    return os.environ.get("TLAUNCH_MOUNT_ROOT", "") + FILES


def node_file_name(key: str) -> str:
    """The Secret key of node ``key`` (``label/3`` -> ``node.label.3``; a key may hold no ``/``)."""
    label, _, index = key.rpartition("/")
    return f"node.{label}.{index}"


def _resolve(address: str) -> str:
    host, _, port = address.rpartition(":")
    known = dict(
        item.split("=", 1) for item in os.environ.get("TLAUNCH_K8S_HOSTS", "").split(",") if "=" in item
    )
    return f"{known.get(host, host)}:{port}"


def _wait_for(address: str, timeout: float) -> None:
    """Pods start in any order: wait until the coordinator's pod accepts connections (or give up)."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=2.0).close()
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"tlaunch pod: the coordinator at {address} did not answer in {timeout:.0f} s: {exc}"
                ) from None
            time.sleep(0.2)


def _head() -> int:
    with open(os.path.join(files_dir(), "head"), "rb") as f:
        spec = pickle.load(f)
    assert isinstance(spec, HeadFile)
    ip = os.environ.get("POD_IP") or "127.0.0.1"
    spec = dataclasses.replace(spec, advertise_host=ip, port=int(os.environ["TLAUNCH_COORDINATOR_PORT"]))
    with tempfile.TemporaryDirectory(prefix="tlaunch-head-") as run_dir:
        code = serve(spec, run_dir)
        with open(os.path.join(run_dir, "final.json")) as f:
            final = json.load(f)
    print(json.dumps({"tlaunch_final": final}), flush=True)  # in the pod's log, for the launcher
    return 1 if final.get("failure") else code


def _node() -> int:
    label = os.environ["TLAUNCH_GROUP"]
    key = f"{label}/{os.environ['RANK']}"
    with open(os.path.join(files_dir(), node_file_name(key)), "rb") as f:
        spec = pickle.load(f)
    assert isinstance(spec, NodeFile)
    ip = os.environ.get("POD_IP") or "127.0.0.1"
    config = spec.config._replace(
        bind_host="0.0.0.0", advertise_host=ip, host_name=os.environ.get("POD_NAME", ip)
    )
    log_dir = tempfile.mkdtemp(prefix="tlaunch-node-")
    spec = spec._replace(config=config, log_path=os.path.join(log_dir, "node.log"), keep=True)
    address = _resolve(os.environ["TLAUNCH_COORDINATOR"])
    _wait_for(address, float(os.environ.get("TLAUNCH_COORDINATOR_WAIT", "300")))
    supervisor = Supervisor(spec, address)
    signal.signal(signal.SIGTERM, lambda *_: supervisor.stopping.set())  # the pod's deletion
    try:
        return supervisor.run()
    finally:
        if supervisor.coord is not None:
            supervisor.coord.close()


def main(argv: list[str]) -> int:
    """``head`` or ``node``: run that part of the program in this pod."""
    if argv not in (["head"], ["node"]):
        print("usage: python -m tlaunch.k8s.pod head|node", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return _head() if argv == ["head"] else _node()


if __name__ == "__main__":
    from tlaunch.k8s.pod import main as _main  # the pickled classes live in the module, not __main__

    code = _main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
