"""A failed command says why: the last lines of a failing trainer's output are its root cause.

A ``command`` job (or a basic/torchrun one) whose trainer exits non-zero once reported "exited
with code 1" and nothing else; the ``ValueError: ...`` was in its log only. Now the last lines
its process wrote (at most 20 lines, 4 KiB) travel with its failure, so ``tlaunch job status``,
the REST status, the dashboard and the launcher's exception show the exception's line. A
node that exited non-zero by itself is ``failed``, never ``done``, even while the run stops for
another's failure.

The first tests run as users do (the CLI, ``python launch.py``, new processes); the last ones
are unit tests of the pieces (a recording coordinator at the RPC boundary).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from userpath import assert_nothing_left, own_runs, run_as_user, says

from tlaunch import lp_ssh as lp
from tlaunch.backends.handle import Failure
from tlaunch.plan import make_plan
from tlaunch.runtime import states
from tlaunch.runtime.coordinator import Coordinator
from tlaunch.runtime.nodelog import TAIL_BYTES, TAIL_LINES, NodeLog, last_lines
from tlaunch.runtime.restarts import RestartPolicy, supervise

TRAIN = """\
import os, sys, time
print("loading data for rank", os.environ["RANK"], flush=True)
time.sleep(float(os.environ["RANK"]))  # trainer 1 a second later: the stop may end it first
raise ValueError(f"the learning rate {sys.argv[1]!r} is not a number")
"""
LINE = "ValueError: the learning rate 'abc' is not a number"


@pytest.fixture(scope="module")
def job_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A job server on this machine, and its users' environment."""
    pytest.importorskip("fastapi")
    from server_helpers import ALICE, Server

    srv = Server(tmp_path_factory.mktemp("failure-server") / "home")
    try:
        yield srv, {"TLAUNCH_SERVER": srv.url, "TLAUNCH_TOKEN": ALICE}
    finally:
        srv.stop()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "train.py").write_text(TRAIN)
    return tmp_path / "job"


def test_job_status_of_a_command_job_that_raised_shows_the_exceptions_line(job_server, folder: Path) -> None:  # type: ignore[no-untyped-def]
    srv, env = job_server
    argv = (
        "tlaunch job submit . --name raises --method command --num-trainer 2 -- python train.py abc".split()
    )
    done = run_as_user(argv, folder, timeout=90, env=env)
    assert done.returncode == 0, says(done)
    run_as_user(["tlaunch", "job", "logs", "-f", "raises"], folder, timeout=90, env=env)
    status = run_as_user(["tlaunch", "job", "status", "raises"], folder, timeout=60, env=env)
    out = status.stdout
    assert "job raises (alice): FAILED" in out, says(status)
    assert f"node trainer/0 on localhost failed: {LINE}" in out, says(status)  # the root cause's line
    assert "loading data for rank 0" in out, says(status)  # with the lines before it
    rows = [line for line in out.splitlines() if line.startswith("│ trainer/")]
    assert len(rows) == 2 and "failed" in rows[0] and not any("done" in r for r in rows), out
    with srv.client() as c:  # the REST status (what the dashboard shows) carries the same
        failure = c.get("/v1/jobs/raises").json()["failure"]
    assert failure["exception"] == LINE and failure["node"] == "trainer/0", failure
    assert "exited with code 1" in failure["reason"], failure
    assert_nothing_left(None, own_runs(str(srv.home)))


def test_a_node_that_raises_while_the_run_stops_is_failed_not_done(tmp_path: Path) -> None:
    """``b`` raises once ``a``'s failure has begun the stop (within the grace): it failed too,
    and the root cause stays ``a``'s. Once, such a node was ``done`` with exit code 1."""
    (tmp_path / "script.py").write_text(
        "from tlaunch import lp_ssh as lp\n"
        "def a():\n    raise ValueError('a is wrong')\n"
        "def b():\n    lp.wait_for_stop()\n    raise RuntimeError('b saw the stop and failed')\n"
        "p = lp.Program('two')\n"
        "p.add_node(lp.PyNode(a), label='a')\n"
        "p.add_node(lp.PyNode(b), label='b')\n"
        "run = lp.launch(p, launch_type='local_mp', wait=False, failure_grace=30, stop_grace=30)\n"
        "try:\n    run.wait()\nexcept lp.RunFailedError as e:\n    print('root cause', e.node)\n"
        "print(sorted((k, v['state'], v['exit_code']) for k, v in run.status().items()))\n"
    )
    done = run_as_user(["python", "script.py"], tmp_path, timeout=90)
    assert done.returncode == 0, says(done)
    assert "root cause a/0" in done.stdout, says(done)
    assert "[('a/0', 'failed', 1), ('b/0', 'failed', 1)]" in done.stdout, says(done)
    assert_nothing_left(None, own_runs())


def test_the_launchers_exception_shows_a_commands_last_output(folder: Path) -> None:
    (folder / "launch.py").write_text(
        "from tlaunch.torch import basic\n"
        "basic(['python', 'train.py', 'abc'], 1, ['localhost'], as_command=True)\n"
    )
    done = run_as_user(["python", "launch.py"], folder, timeout=90)
    assert done.returncode == 1, says(done)
    assert (
        "RunFailedError: node 'trainer/0' on host 'localhost' exited with code 1; its last output:"
        in done.stderr
    )
    assert LINE in done.stderr and "loading data for rank 0" in done.stderr, says(done)
    assert_nothing_left(None, own_runs())


EXITS = """\
import os, sys
import torch.distributed as dist

dist.init_process_group("gloo")
print("rank", dist.get_rank(), "read its config", flush=True)
if dist.get_rank() == 1:
    print("config error: lr must be > 0, got -1", file=sys.stderr, flush=True)
    if sys.argv[1] == "os._exit":
        os._exit(3)
    sys.exit(3)
dist.barrier()  # rank 0's peer is gone: its "Connection reset by peer" follows from rank 1's exit
"""
EXIT_LINE = "config error: lr must be > 0, got -1"


@pytest.mark.parametrize("how", ["os._exit", "sys.exit"])
def test_a_torchrun_rank_that_exits_without_a_traceback_says_why(tmp_path: Path, how: str) -> None:
    """A rank that prints what is wrong and exits 3 (``os._exit``, or ``sys.exit``) is the root
    cause, with the last lines of its output, not its peer's error in the barrier after it."""
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(EXITS)
    argv = ["tlaunch", "torchrun", "--nproc-per-node", "2", "--log-dir", "logs", "train.py", how]
    done = run_as_user(argv, tmp_path, timeout=180)
    assert done.returncode != 0, says(done)
    said = done.stdout + done.stderr
    why = "exited with code 3 without raising" if how == "os._exit" else "SystemExit: 3"
    assert f"rank 1 on host 'localhost': {why}" in said, says(done)
    assert f"the last lines of its output:\n{EXIT_LINE}" in said or (
        "the last lines of its output:" in said
        and EXIT_LINE in said.split("the last lines of its output:")[1]
    ), says(done)
    assert "rank 1 read its config" in said.split("the last lines of its output:")[1], says(done)
    assert_nothing_left(None, own_runs())


def test_job_status_of_a_torchrun_job_whose_rank_exited_shows_its_last_output(
    job_server, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    srv, env = job_server
    (tmp_path / "train.py").write_text(EXITS)
    argv = "tlaunch job submit . --name exits --method torchrun --nproc-per-node 2 -- train.py os._exit"
    done = run_as_user(argv.split(), tmp_path, timeout=90, env=env)
    assert done.returncode == 0, says(done)
    run_as_user(["tlaunch", "job", "logs", "-f", "exits"], tmp_path, timeout=180, env=env)
    status = run_as_user(["tlaunch", "job", "status", "exits"], tmp_path, timeout=60, env=env)
    assert "job exits (alice): FAILED" in status.stdout, says(status)
    assert f"node rank 1 on localhost failed: {EXIT_LINE}" in status.stdout, says(status)
    with srv.client() as c:
        failure = c.get("/v1/jobs/exits").json()["failure"]
    assert failure["exception"] == EXIT_LINE and failure["exit_code"] == 3, failure
    assert "exited with code 3 without raising" in failure["reason"], failure
    assert_nothing_left(None, own_runs(str(srv.home)))


# -- the pieces -----------------------------------------------------------------------


def test_the_tail_is_the_last_20_lines_within_4_kib_of_the_last_process(tmp_path: Path) -> None:
    with NodeLog(str(tmp_path / "n.log")) as log:
        log.write(b"an earlier attempt\n")
        log.mark()
        for i in range(100):
            log.write(f"line {i}\n".encode())
        lines = log.tail().splitlines()
        assert lines == [f"line {i}" for i in range(100 - TAIL_LINES, 100)]
        log.mark()
        log.write(("x" * 100 + "\n").encode() * 100)  # 10 KiB of long lines: 4 KiB of whole ones
        tail = log.tail()
        assert len(tail) <= TAIL_BYTES and tail.splitlines() == ["x" * 100] * len(tail.splitlines())
    assert (tmp_path / "n.log").read_text().startswith("an earlier attempt\nline 0\n")  # the file keeps all
    assert last_lines(b"\xff bad utf-8\nok\n") == "\ufffd bad utf-8\nok"


def test_a_ranks_last_output_is_its_stdout_then_its_stderr_within_the_bounds(tmp_path: Path) -> None:
    from tlaunch.torch.elastic import output_tail

    (tmp_path / "stdout.log").write_text("".join(f"out {i}\n" for i in range(30)))
    (tmp_path / "stderr.log").write_text("err: bad\nno newline at the end")
    tail, when = output_tail(str(tmp_path))
    assert tail.splitlines() == [*(f"out {i}" for i in range(12, 30)), "err: bad", "no newline at the end"]
    assert when == max((tmp_path / n).stat().st_mtime for n in ("stdout.log", "stderr.log"))
    (tmp_path / "stderr.log").write_text("x" * 99 + "\n" * 1 + ("y" * 99 + "\n") * 60)
    tail, _ = output_tail(str(tmp_path))
    assert len(tail.encode()) <= TAIL_BYTES and tail.splitlines()[-1] == "y" * 99
    assert output_tail(str(tmp_path / "none")) == ("", None)


def test_the_exception_line_is_found_above_what_the_command_wrote_after_it() -> None:
    tail = (
        'loading\nTraceback (most recent call last):\n  File "t.py", line 3, in <module>\n'
        f"    raise ValueError\n{LINE}\ntlaunch: python t.py exited with code 1"
    )
    assert Failure("trainer/0", traceback=tail).exception == LINE
    assert Failure("trainer/0", traceback="cp: cannot stat 'data': No such file").exception == (
        "cp: cannot stat 'data': No such file"
    )


class Recorder:
    """A coordinator at the RPC boundary: it records what a supervisor reports."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def node_finished(self, *args: Any) -> None:
        self.calls.append(("node_finished", args))

    def node_restarting(self, *args: Any) -> None:
        self.calls.append(("node_restarting", args))


@pytest.mark.parametrize(
    ("code", "signalled", "ok"),
    [
        (1, False, False),  # it raised as the run stopped: a failure of its own
        (1, True, True),  # its exit followed the stop's signal: stopped
        (-15, False, True),  # killed by SIGTERM
        (143, False, True),  # a shell's 128 + SIGTERM
        (0, False, True),
    ],
)
def test_a_node_that_exits_by_itself_as_the_run_stops(code: int, signalled: bool, ok: bool) -> None:
    stopping, coord = threading.Event(), Recorder()
    stopping.set()
    supervise(
        "t/0",
        RestartPolicy(),
        lambda n: code,
        stopping,
        coord,
        output=lambda: "boom",
        signalled=lambda: signalled,
    )
    ((name, args),) = coord.calls
    assert name == "node_finished" and args[1] is ok and args[3] == code
    assert args[5] == (None if ok else "boom")


def test_a_final_failure_carries_the_output_and_a_restart_does_not() -> None:
    coord = Recorder()
    supervise(
        "t/0",
        RestartPolicy(1, 0.0),
        lambda n: 2,
        threading.Event(),
        coord,
        output=lambda: f"tail {len(coord.calls)}",
    )
    assert coord.calls == [
        ("node_restarting", ("t/0", 2, "exited with code 2")),
        ("node_finished", ("t/0", False, None, 2, "exited with code 2 after 1 restarts", "tail 1")),
    ]


def test_the_coordinator_keeps_a_raised_traceback_over_the_output_and_never_says_done_for_exit_1() -> None:
    program = lp.Program("p")
    for label in "abc":
        program.add_node(lp.PyNode(print), label=label)
    coord = Coordinator(make_plan(program))
    coord.note_traceback("a/0", "Traceback (most recent call last):\nKeyError: 'x'\n")
    coord.node_finished("a/0", False, None, 1, "exited with code 1", "its output\nKeyError: 'x'")
    coord.node_finished("b/0", False, None, 1, "exited with code 1", "cp: cannot stat 'data'")
    coord.node_finished("c/0", True, None, -9, "stopped with the run")
    status = coord.status()
    assert (
        status["a/0"]["traceback"].startswith("Traceback")
        and status["b/0"]["traceback"] == "cp: cannot stat 'data'"
    )
    assert status["c/0"]["state"] == states.STOPPED  # ended "well", killed: stopped, not done
