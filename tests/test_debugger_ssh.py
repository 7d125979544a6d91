"""``breakpoint()`` in nodes on SSH test hosts, attached with ``tlaunch debug`` in a pty, as a user would.

One run of a user's script (``python train.py``, from its folder) holds two paused
nodes on two hosts, and shows: the announcement in the launcher's output and in
``tlaunch ps``; the listing and the pick of ``tlaunch debug RUN``; ``p`` of a local
and ``c``; a peer without the run's key refused (the node still waits); a
debugger whose terminal is killed lets its node go on; the program ends SUCCEEDED
and leaves nothing on any host.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import textwrap

import pytest

pexpect = pytest.importorskip("pexpect")

pytestmark = pytest.mark.ssh

PROGRAM = textwrap.dedent(
    """
    from tlaunch import lp_ssh as lp


    def learner():
        secret = 41 + 1
        breakpoint()
        print("learner goes on with", secret, flush=True)


    def actor():
        count = 7
        breakpoint()
        print("actor goes on with", count, flush=True)


    if __name__ == "__main__":
        program = lp.Program("dbg")
        program.add_node(lp.PyNode(learner).to_host("th2"), label="learner")
        program.add_node(lp.PyNode(actor).to_host("th3"), label="actor")
        run = lp.launch(program, launch_type="ssh")
        print("program ended:", run.snapshot().state, flush=True)
    """
)


def _tlaunch(*args: str) -> pexpect.spawn:
    """``tlaunch ARGS`` in a terminal of its own, 220 columns wide."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    argv = ["-m", "tlaunch.cli.main", *args]
    return pexpect.spawn(sys.executable, argv, env=env, encoding="utf-8", timeout=60, dimensions=(40, 220))


def test_breakpoints_on_two_hosts_attached_in_turn(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tlaunch import control
    from tlaunch.control import debug
    from tlaunch.errors import DebugError
    from tlaunch.rpc.security import RunKeys

    (tmp_path / "train.py").write_text(PROGRAM)
    env = {**os.environ, "TLAUNCH_SSH_CONFIG": ssh_hosts.ssh_config}
    prog = pexpect.spawn(sys.executable, ["train.py"], cwd=str(tmp_path), env=env, encoding="utf-8")
    prog.timeout = 90
    try:
        waiting = (
            r"\[(th\d) (\w+)/0\] (?:\x1b\[[0-9;]*m)*"  # the launcher's prefix (coloured on a terminal)
            r"waiting for a debugger: tlaunch debug (\S+) (\w+)/0 \(breakpoint at train.py:(\d+)\)"
        )
        seen = {}
        for _ in range(2):
            prog.expect(waiting)
            host, node, run_id, node2, line = prog.match.groups()
            assert node == node2
            seen[node] = (host, int(line))
        assert seen == {"learner": ("th2", 8), "actor": ("th3", 14)}

        ps = _tlaunch("ps", run_id)
        ps.expect(pexpect.EOF)
        assert re.search(r"learner/0.*th2.*paused at train\.py:8", ps.before), ps.before
        handle = control.find_run(run_id)
        assert {p.node for p in debug.paused(handle)} == {"learner/0", "actor/0"}

        # Two nodes wait: `tlaunch debug RUN` lists them and attaches to the one picked.
        dbg = _tlaunch("debug", run_id)
        dbg.expect(r"attach to which \(1-2")
        assert "learner/0" in dbg.before and "actor/0" in dbg.before and "train.py:14" in dbg.before
        dbg.sendline("1")
        dbg.expect(r"attached to learner/0 on th2")
        dbg.expect(r"\(Pdb\) ")
        dbg.sendline("p secret")
        dbg.expect(r"\r\n42\r\n")
        dbg.expect(r"\(Pdb\) ")
        dbg.sendline("c")
        dbg.expect(pexpect.EOF)
        dbg.close()
        assert dbg.exitstatus == 0, dbg.before
        prog.expect(r"\[th2 learner/0\] (?:\x1b\[[0-9;]*m)*learner goes on with 42")

        # A peer without the run's key: refused, and the node waits on.
        with pytest.raises(DebugError, match="refused the connection"):
            debug.connect(handle, "actor/0", keys=RunKeys.generate())
        assert [p.node for p in debug.paused(handle)] == ["actor/0"]

        # A debugger whose terminal is killed: its node goes on.
        dbg = _tlaunch("debug", run_id, "actor/0")
        dbg.expect(r"\(Pdb\) ")
        dbg.sendline("p count")
        dbg.expect(r"\r\n7\r\n")
        dbg.expect(r"\(Pdb\) ")
        dbg.kill(signal.SIGKILL)
        prog.expect(r"\[th3 actor/0\] (?:\x1b\[[0-9;]*m)*actor goes on with 7")
        prog.expect(r"program ended: SUCCEEDED")
        prog.expect(pexpect.EOF)
    finally:
        prog.close(force=True)
    assert ssh_hosts.leftovers(run_id) == {}


TORCH = textwrap.dedent(
    """
    import sys
    import torch
    from tlaunch.torch import launch


    def work():
        import torch.distributed as dist

        rank = dist.get_rank()
        value = 10 * (rank + 1)
        if rank == 1:
            breakpoint()
        t = torch.tensor([float(value)])
        dist.all_reduce(t)
        return t.item()


    if __name__ == "__main__":
        result = launch(work, hostnames=["th1", "th2"], workers_per_host=1, backend="gloo",
                        ssh_config_file=sys.argv[1])
        print("results:", result.results, flush=True)
    """
)


def test_breakpoint_in_a_torch_worker_on_ssh_hosts(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(TORCH)
    prog = pexpect.spawn(
        sys.executable, ["train.py", ssh_hosts.ssh_config], cwd=str(tmp_path), encoding="utf-8"
    )
    prog.timeout = 120
    try:
        prog.expect(
            r"waiting for a debugger: tlaunch debug (\S+) (\S+) \(breakpoint at train.py:14, rank 1\)"
        )
        run_id, node = prog.match.groups()
        dbg = _tlaunch("debug", run_id, node)
        dbg.expect(r"attached to \S+ on th2")
        dbg.expect(r"\(Pdb\) ")
        dbg.sendline("p value, rank")
        dbg.expect(r"\r\n\(20, 1\)\r\n")
        dbg.expect(r"\(Pdb\) ")
        dbg.sendline("c")
        dbg.expect(pexpect.EOF)
        prog.expect(r"results: \{'th1': \[30.0\], 'th2': \[30.0\]\}")
        prog.expect(pexpect.EOF)
    finally:
        prog.close(force=True)
    assert ssh_hosts.wait_no_leftovers(run_id, 10) == {}


RANKS = textwrap.dedent(
    """
    import os

    rank = int(os.environ["RANK"])
    if rank == 0:
        mood = "curious"
        breakpoint()
    divisor = 0 if rank == 1 else 1
    print("rank", rank, "ratio", 10 / divisor, flush=True)
    """
)
"""A user's script, unchanged for the debugger: rank 0 stops at a breakpoint, rank 1 raises."""


def _ranks_session(prog: pexpect.spawn) -> str:
    """Two ranks of one ``tlaunch COMMAND`` job on th1 and th2: rank 0 paused at its breakpoint, rank 1
    held at its exception (post-mortem); each attached in turn (``p`` of a local, then ``c``): rank 0
    first, as rank 1's failure, once it goes on, ends the job (and a pause with it)."""
    waiting = (
        r"waiting for a debugger: tlaunch debug (\S+) (\S+) "
        r"\((breakpoint|post-mortem) at train.py:(\d+)(, rank \d)?"
    )
    seen = {}
    for _ in range(2):
        prog.expect(waiting)
        run_id, node, kind, line, rank = prog.match.groups()  # a trainer (basic) is a node of its own
        seen[rank[-1] if rank else node[-1]] = (run_id, node, kind, int(line))
    assert {r: (k, n) for r, (_, _, k, n) in seen.items()} == {
        "0": ("breakpoint", 8),
        "1": ("post-mortem", 9),
    }
    run_id, node = seen["0"][:2]
    dbg = _tlaunch("debug", run_id, node)
    dbg.expect(r"attached to \S+ on th1")
    dbg.expect(r"\(Pdb\) ")
    dbg.sendline("p mood")
    dbg.expect(r"\r\n'curious'\r\n")
    dbg.expect(r"\(Pdb\) ")
    dbg.sendline("c")
    dbg.expect(pexpect.EOF)
    run_id, node = seen["1"][:2]
    dbg = _tlaunch("debug", run_id, node)
    dbg.expect(r"attached to \S+ on th2 .*post-mortem at train.py:9")
    dbg.expect(r"\(Pdb\) ")
    dbg.sendline("p divisor, rank")
    dbg.expect(r"\r\n\(0, 1\)\r\n")
    dbg.expect(r"\(Pdb\) ")
    dbg.sendline("c")
    dbg.expect(pexpect.EOF)
    return run_id


@pytest.mark.parametrize("command", ["torchrun", "basic"])
def test_ranks_of_torch_commands_pause_and_hold_their_exceptions(ssh_hosts, tmp_path, command: str) -> None:  # type: ignore[no-untyped-def]
    """``tlaunch torchrun|basic --debug post-mortem train.py``: ranks torch's elastic agent starts
    (torchrun), or trainers (basic), pause at ``breakpoint()`` and are held where they raise."""
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(RANKS)
    size = ["--nproc-per-node", "1"] if command == "torchrun" else ["--num-trainer", "2"]
    argv = ["-m", "tlaunch.cli.main", command, "--hosts", "th1,th2", "--ssh-config", ssh_hosts.ssh_config,
            *size, "--debug", "post-mortem", "train.py"]  # fmt: skip
    prog = pexpect.spawn(sys.executable, argv, cwd=str(tmp_path), encoding="utf-8", timeout=120)
    try:
        run_id = _ranks_session(prog)
        prog.expect(r"rank 1|trainer/1")
        prog.expect(pexpect.EOF)
        prog.close()
        out = prog.before
        assert prog.exitstatus == 1, out
        assert "ZeroDivisionError" in out, out
    finally:
        prog.close(force=True)
    assert ssh_hosts.wait_no_leftovers(run_id, 10) == {}
