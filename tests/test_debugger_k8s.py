"""``breakpoint()`` in a pod of an LPJob (the stand-in API server, the real operator, the stand-in
kubelet), attached with ``tlaunch debug`` in a pty, as a user would.

The pod's IP is the cluster's: ``tlaunch debug`` reaches the run's coordinator and the paused
node's pod through the API server's port-forward (``pods/portforward``, the WebSocket protocol the
``kubernetes`` client speaks), with the run's mutual TLS inside it. Shows: the announcement in the
launcher's output; the node ``paused at train.py:LINE`` in ``tlaunch ps`` (read from the pod's
log) and in the launcher's own view; the node's resource samples through the same channel
(``control.metrics``); a cluster that refuses the port-forward (RBAC) refuses the session with a
clear error and the node waits on; ``p`` of a local and ``c``; the node's next pause served to an
editor (DAP) the same way; the program ends SUCCEEDED.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
import threading
import time

import pytest

pexpect = pytest.importorskip("pexpect")
pytest.importorskip("kubernetes")
pytest.importorskip("kopf")
pytest.importorskip("wsproto")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dap_client import DapClient  # noqa: E402
from kube_helpers import free_port  # noqa: E402

PROGRAM = textwrap.dedent(
    """
    import sys
    import time

    from tlaunch import lp_ssh as lp


    def learner():
        secret = 41 + 1
        breakpoint()
        print("learner goes on with", secret, flush=True)
        later = secret + 1
        breakpoint()
        print("learner ends with", later, flush=True)


    if __name__ == "__main__":
        program = lp.Program("dbg")
        program.add_node(lp.PyNode(learner), label="learner")
        run = lp.launch(program, launch_type="k8s", image="repo/img:1", coordinator_port=int(sys.argv[1]))
        print("program ended:", run.snapshot().state, flush=True)
    """
)


def _tlaunch(*args: str) -> pexpect.spawn:
    """``tlaunch ARGS`` in a terminal of its own, 220 columns wide."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    argv = ["-m", "tlaunch.cli.main", *args]
    return pexpect.spawn(sys.executable, argv, env=env, encoding="utf-8", timeout=60, dimensions=(40, 220))


def test_a_paused_pod_attached_through_the_api_server(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tlaunch import control
    from tlaunch.control import dap, debug
    from tlaunch.errors import DebugError

    api, _ = cluster
    (tmp_path / "train.py").write_text(PROGRAM)
    prog = pexpect.spawn(
        sys.executable,
        ["train.py", str(free_port())],
        cwd=str(tmp_path),
        env=dict(os.environ),
        encoding="utf-8",
    )
    prog.timeout = 90
    try:
        prog.expect(
            r"\[learner/0\] (?:\x1b\[[0-9;]*m)*waiting for a debugger: "
            r"tlaunch debug (\S+) learner/0 \(breakpoint at train.py:11\)"
        )
        run_id = prog.match.group(1)

        ps = _tlaunch("ps", run_id)
        ps.expect(pexpect.EOF)
        assert re.search(r"learner/0.*paused at train\.py:11", ps.before), ps.before
        handle = control.find_run(run_id)
        [found] = debug.paused(handle)  # from the coordinator, through the port-forward
        assert (found.node, found.pause.at, found.pause.kind) == ("learner/0", "train.py:11", "breakpoint")
        deadline = time.monotonic() + 20  # the pod's supervisor samples its node once a second
        while not control.metrics.samples(handle).get("learner/0"):
            assert time.monotonic() < deadline, "no sample of the pod's node came through the port-forward"
            time.sleep(0.5)
        assert control.metrics.samples(handle)["learner/0"][-1].rss > 10 << 20

        api.refuse("GET", "pods/portforward")  # RBAC: no port-forward for this user
        with pytest.raises(DebugError, match=r"refused to forward port .*pods/portforward"):
            debug.connect(handle, "learner/0")
        assert [p.node for p in debug.paused(handle)] == ["learner/0"]  # it waits on

        dbg = _tlaunch("debug", run_id, "learner/0")
        dbg.expect(r"attached to learner/0 on \S+-learner-0")
        dbg.expect(r"\(Pdb\) ")
        dbg.sendline("p secret")
        dbg.expect(r"\r\n42\r\n")
        dbg.expect(r"\(Pdb\) ")
        dbg.sendline("c")
        dbg.expect(pexpect.EOF)
        dbg.close()
        assert dbg.exitstatus == 0, dbg.before
        prog.expect(r"\[learner/0\] (?:\x1b\[[0-9;]*m)*learner goes on with 42")

        # Its next pause, served to an editor (DAP) through the same port-forward.
        prog.expect(r"waiting for a debugger: tlaunch debug \S+ learner/0 \(breakpoint at train.py:14\)")
        bridge = dap.open_bridge(handle, "learner/0")
        serving = threading.Thread(target=bridge.serve, daemon=True)
        serving.start()
        editor = DapClient(bridge.address)
        try:
            editor.request("initialize", adapterID="tlaunch-test", linesStartAt1=True, pathFormat="path")
            editor.request("attach")
            editor.request("configurationDone")
            thread = editor.event("stopped")["body"]["threadId"]
            frame = editor.request("stackTrace", threadId=thread)["stackFrames"][0]
            scope = editor.request("scopes", frameId=frame["id"])["scopes"][0]
            listed = editor.request("variables", variablesReference=scope["variablesReference"])
            assert {v["name"]: v["value"] for v in listed["variables"]}.get("later") == "43", listed
            editor.request("continue", threadId=thread)
            prog.expect(r"learner ends with 43")
        finally:
            editor.close()
        serving.join(10)
        prog.expect(r"program ended: SUCCEEDED")
        prog.expect(pexpect.EOF)
    finally:
        prog.close(force=True)


def test_a_log_tells_which_nodes_wait_in_a_debugger() -> None:
    """What a paused node prints (the session's own lines) read back, as a pod's log is read."""
    from tlaunch.runtime.debugger.pause import paused_in_log

    log = [
        "step 1",
        "waiting for a debugger: tlaunch debug run-1 learner/0 (breakpoint at train.py:11)",
        "tlaunch: the debugger of learner/0 left (continued); it goes on",
        "waiting for a debugger: tlaunch debug run-1 learner/0 (post-mortem at my:file.py:57, rank 1: "
        "ZeroDivisionError: division by zero)",
        "waiting for a debugger: tlaunch debug run-1 actor/3 (breakpoint at act.py:5)",
        "tlaunch: actor/3 goes on: no debugger came within 300 s",
    ]
    assert paused_in_log(log[:2])["learner/0"].at == "train.py:11"
    assert paused_in_log(log[:3]) == {}
    found = paused_in_log(log)
    assert list(found) == ["learner/0"]
    pause = found["learner/0"]
    assert (pause.file, pause.line, pause.kind, pause.rank) == ("my:file.py", 57, "post-mortem", "1")
    assert pause.exception == "ZeroDivisionError: division by zero"
    assert str(pause) == "paused at my:file.py:57 (post-mortem, rank 1)"


class _OneRunningPod:
    """The Kubernetes API as a launcher's link reads it (a fake at that boundary): an LPJob of a
    program whose node ``learner/0`` runs in pod ``dbg-learner-0``."""

    name, namespace = "dbg", "default"

    def job(self) -> dict[str, object]:
        role = {"name": "learner", "env": [{"name": "TLAUNCH_GROUP", "value": "learner"}]}
        return {
            "metadata": {"name": "dbg", "namespace": "default", "uid": "u1", "labels": {}},
            "spec": {"runFiles": True, "roles": [{"name": "coordinator"}, role]},
            "status": {"phase": "Running"},
        }

    def pods(self, job: object) -> list[dict[str, object]]:
        from tlaunch.k8s.children import LABEL_INDEX, LABEL_ROLE

        meta = {"name": "dbg-learner-0", "labels": {LABEL_ROLE: "learner", LABEL_INDEX: "0"}}
        return [{"metadata": meta, "status": {"phase": "Running"}}]

    def log(self, pod: str) -> str:
        return ""


def test_the_launchers_view_shows_a_pod_paused_from_the_lines_it_prints() -> None:
    """The launcher reads pods' states, not their coordinator: the pause comes from the node's line."""
    from tlaunch.backends.k8s.link import LPJobLink

    link = LPJobLink(_OneRunningPod(), "dbg-coordinator-0.dbg.default.svc:5000", 3.0)  # type: ignore[arg-type]
    try:
        deadline = time.monotonic() + 10
        while not link.node_statuses():
            assert time.monotonic() < deadline, "the link never read the pods"
            time.sleep(0.05)
        [node] = link.node_statuses()
        assert (node.key, node.state, node.paused) == ("learner/0", "running", None)
        link.saw(
            "learner/0", "waiting for a debugger: tlaunch debug dbg-1 learner/0 (breakpoint at train.py:11)"
        )
        [node] = link.node_statuses()
        assert node.paused is not None and str(node.paused) == "paused at train.py:11 (breakpoint)"
        link.saw("learner/0", "tlaunch: the debugger of learner/0 left (continued); it goes on")
        assert link.node_statuses()[0].paused is None
    finally:
        link.close()
