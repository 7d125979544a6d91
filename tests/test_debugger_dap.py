"""``tlaunch debug --dap``: a node paused on an SSH test host, served to an editor (our own minimal
DAP client) on a local port, through the debugger's channel (the run's key), as a user would run it.

Shows: the bridge's address on this machine; ``initialize``, ``attach``, ``configurationDone``, a
``stopped`` event in the node's function at the line pdb had stopped it, ``threads``,
``stackTrace``, ``scopes``, ``variables`` (a local's value), ``next`` (a step), ``continue``;
the node goes on and the program ends SUCCEEDED, nothing left on the hosts. And the bridges'
own check: a loopback connection is known as this process's, or not.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

pexpect = pytest.importorskip("pexpect")
pytest.importorskip("debugpy")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dap_client import DapClient  # noqa: E402

PROGRAM = textwrap.dedent(
    """
    from tlaunch import lp_ssh as lp


    def learner():
        secret = 41 + 1
        breakpoint()
        print("learner goes on with", secret, flush=True)
        print("learner ends", flush=True)


    if __name__ == "__main__":
        program = lp.Program("dap")
        program.add_node(lp.PyNode(learner).to_host("th2"), label="learner")
        run = lp.launch(program, launch_type="ssh")
        print("program ended:", run.snapshot().state, flush=True)
    """
)


@pytest.mark.ssh
def test_an_editor_attaches_to_a_node_on_an_ssh_host(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "train.py").write_text(PROGRAM)
    env = {**os.environ, "TLAUNCH_SSH_CONFIG": ssh_hosts.ssh_config}
    prog = pexpect.spawn(
        sys.executable, ["train.py"], cwd=str(tmp_path), env=env, encoding="utf-8", timeout=90
    )
    bridge = None
    try:
        prog.expect(r"waiting for a debugger: tlaunch debug (\S+) learner/0 \(breakpoint at train.py:8\)")
        run_id = prog.match.group(1)
        argv = ["-m", "tlaunch.cli.main", "debug", "--dap", run_id, "learner/0"]
        bridge = pexpect.spawn(
            sys.executable, argv, env=env, encoding="utf-8", timeout=60, dimensions=(40, 250)
        )
        bridge.expect(r"attached to learner/0 on th2")
        bridge.expect(r"DAP of learner/0 on (127\.0\.0\.1:\d+)")
        editor = DapClient(bridge.match.group(1))
        try:
            init = editor.request("initialize", adapterID="tlaunch-test", clientID="test", linesStartAt1=True,
                                  columnsStartAt1=True, pathFormat="path")  # fmt: skip
            assert init["supportsConfigurationDoneRequest"]
            editor.request("attach", justMyCode=False)
            editor.request("configurationDone")
            stopped = editor.event("stopped")["body"]
            thread = stopped["threadId"]
            names = [t["name"] for t in editor.request("threads")["threads"]]
            assert "MainThread" in names, names
            frame = editor.request("stackTrace", threadId=thread)["stackFrames"][0]
            assert frame["name"] == "learner" and frame["source"]["path"].endswith("train.py"), frame
            assert frame["line"] == 8  # where pdb had stopped it: line 8 has not run yet
            scope = editor.request("scopes", frameId=frame["id"])["scopes"][0]
            listed = editor.request("variables", variablesReference=scope["variablesReference"])
            values = {v["name"]: v["value"] for v in listed["variables"]}
            assert values["secret"] == "42", values
            editor.request("next", threadId=thread)  # a step: line 8 runs, it stops at line 9
            editor.event("stopped")
            prog.expect(r"learner goes on with 42")
            assert editor.request("stackTrace", threadId=thread)["stackFrames"][0]["line"] == 9
            editor.request("continue", threadId=thread)
            prog.expect(r"learner ends")
        finally:
            editor.close()
        bridge.expect(r"the editor left; learner/0 goes on")
        bridge.expect(pexpect.EOF)
        prog.expect(r"program ended: SUCCEEDED")
        prog.expect(pexpect.EOF)
    finally:
        prog.close(force=True)
        if bridge is not None:
            bridge.close(force=True)
    assert ssh_hosts.wait_no_leftovers(run_id, 10) == {}


def test_a_loopback_peer_is_told_apart_by_its_process() -> None:
    """What both bridges check before they relay a byte: whose socket is at the other end."""
    from tlaunch.runtime.debugger.peers import peer_is_this_process, peer_uid

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(2)
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            mine, _ = listener.accept()
            with mine:
                assert peer_is_this_process(mine) and peer_uid(mine) == os.getuid()
        code = f"import socket, sys; s = socket.create_connection(('127.0.0.1', {port})); sys.stdin.read()"
        other = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
        try:
            theirs, _ = listener.accept()
            with theirs:
                assert not peer_is_this_process(theirs)  # another process, even of this user
                assert peer_uid(theirs) == os.getuid()
        finally:
            assert other.stdin is not None
            other.stdin.close()
            other.wait(10)


TWICE = textwrap.dedent(
    """
    import os
    import sys
    import time

    from tlaunch import lp_ssh as lp


    def work(go):
        total = 6
        breakpoint()
        total *= 10
        while not os.path.exists(go):  # the test says when: once the editor has left
            time.sleep(0.05)
        breakpoint()
        print("total is", total, flush=True)


    if __name__ == "__main__":
        program = lp.Program("dap2")
        program.add_node(lp.PyNode(work, sys.argv[1]), label="worker")
        run = lp.launch(program, launch_type="local_mp")
        print("program ended:", run.snapshot().state, flush=True)
    """
)


def test_a_node_that_cannot_serve_dap_is_pdbs_and_waits_on(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A process serves one DAP session (debugpy starts once): its next pause, asked for DAP, says
    why not and is the terminal's pdb instead, without letting the node go on."""
    from tlaunch import control
    from tlaunch.control import dap

    (tmp_path / "prog.py").write_text(TWICE)
    go = tmp_path / "go"
    prog = pexpect.spawn(
        sys.executable, ["prog.py", str(go)], cwd=str(tmp_path), encoding="utf-8", timeout=60
    )
    try:
        prog.expect(r"tlaunch debug (\S+) worker/0 \(breakpoint at prog.py:12\)")
        run_id = prog.match.group(1)
        bridge = dap.open_bridge(control.find_run(run_id), "worker/0")
        serving = threading.Thread(target=bridge.serve, daemon=True)
        serving.start()
        editor = DapClient(bridge.address)
        try:
            editor.request("initialize", adapterID="tlaunch-test", linesStartAt1=True, pathFormat="path")
            editor.request("attach")
            editor.request("configurationDone")
            thread = editor.event("stopped")["body"]["threadId"]
            editor.request("continue", threadId=thread)
        finally:
            editor.close()
        serving.join(10)
        prog.expect(r"the debugger of worker/0 left \(the DAP session ended\)")
        go.write_text("")  # breakpoint() is tlaunch's again: the next one pauses for tlaunch debug
        prog.expect(r"tlaunch debug \S+ worker/0 \(breakpoint at prog.py:16\)")
        argv = ["-m", "tlaunch.cli.main", "debug", "--dap", run_id, "worker/0"]
        cli = pexpect.spawn(sys.executable, argv, encoding="utf-8", timeout=60, dimensions=(40, 250))
        cli.expect(r"cannot serve DAP: .*served a DAP session already.*here is its pdb instead")
        cli.expect(r"\(Pdb\) ")
        cli.sendline("p total")
        cli.expect(r"\r\n60\r\n")
        cli.expect(r"\(Pdb\) ")
        cli.sendline("c")
        cli.expect(pexpect.EOF)
        prog.expect(r"total is 60")
        prog.expect(r"program ended: SUCCEEDED")
    finally:
        prog.close(force=True)


RAISES = textwrap.dedent(
    """
    from tlaunch import lp_ssh as lp


    def work():
        divisor = 0
        return 10 / divisor


    if __name__ == "__main__":
        program = lp.Program("dap3")
        program.add_node(lp.PyNode(work), label="worker")
        try:
            lp.launch(program, launch_type="local_mp", debug="post-mortem")
        except Exception as exc:  # the run's failure: the node's ZeroDivisionError, held for the editor
            print("program failed:", str(exc).replace("\\n", " "), flush=True)
    """
)


def test_a_post_mortem_is_served_to_an_editor_at_the_exceptions_frame(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tlaunch import control
    from tlaunch.control import dap

    (tmp_path / "prog.py").write_text(RAISES)
    prog = pexpect.spawn(sys.executable, ["prog.py"], cwd=str(tmp_path), encoding="utf-8", timeout=60)
    try:
        prog.expect(r"tlaunch debug (\S+) worker/0 \(post-mortem at prog.py:7: ZeroDivisionError")
        bridge = dap.open_bridge(control.find_run(prog.match.group(1)), "worker/0")
        serving = threading.Thread(target=bridge.serve, daemon=True)
        serving.start()
        editor = DapClient(bridge.address)
        try:
            editor.request("initialize", adapterID="tlaunch-test", linesStartAt1=True, pathFormat="path")
            editor.request("attach")
            editor.request("configurationDone")
            stopped = editor.event("stopped")["body"]
            assert stopped["reason"] == "exception", stopped
            thread = stopped["threadId"]
            frame = editor.request("stackTrace", threadId=thread)["stackFrames"][0]
            assert (frame["name"], frame["line"]) == ("work", 7), frame
            scope = editor.request("scopes", frameId=frame["id"])["scopes"][0]
            listed = editor.request("variables", variablesReference=scope["variablesReference"])
            assert {v["name"]: v["value"] for v in listed["variables"]}["divisor"] == "0"
            editor.request("continue", threadId=thread)
            prog.expect(r"program failed: .*held for a post-mortem: a debugger was attached")
        finally:
            editor.close()
        serving.join(10)
    finally:
        prog.close(force=True)
