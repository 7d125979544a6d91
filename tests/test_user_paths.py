"""The user-facing flows run as users run them: a real ``python script.py`` that imports torch (the
CPU wheel) and launches over SSH, in a new process, from the script's folder; then its output is
checked, and that nothing of its runs is left on any host. One test per flow:

- a program with a ``PyNode``: :func:`test_a_torch_script_launches_a_pynode_on_an_ssh_host`;
- torchrun mode: :func:`test_a_torch_script_runs_a_training_script_in_torchrun_mode`;
- a ``tlaunch job submit`` to a job server, the trainer importing torch:
  :func:`test_a_job_whose_trainer_imports_torch_runs_on_ssh_hosts`;
- function launch: ``examples/torch/function_launch.py --hosts=th1,th2`` in ``test_examples.py``.

Tests run inside pytest's process, where ``__main__`` is pytest: ``import torch`` in a user's script
adds ``sys.modules["__mp_main__"]`` (an alias of ``__main__``), which once crashed every such SSH
launch before anything started and no in-process test saw it. Hosts: ``th1``.. of the session's
SSH test hosts, reached through ``$TLAUNCH_SSH_CONFIG`` as a user's ``~/.ssh/config`` would.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from userpath import assert_nothing_left, own_runs, run_as_user, says

pytest.importorskip("torch")
pytestmark = pytest.mark.ssh


@pytest.fixture
def hosts(ssh_hosts, monkeypatch):  # type: ignore[no-untyped-def]
    """The session's SSH test hosts, named in the user's ssh config (``$TLAUNCH_SSH_CONFIG``)."""
    monkeypatch.setenv("TLAUNCH_SSH_CONFIG", ssh_hosts.ssh_config)
    return ssh_hosts


def script(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "script.py").write_text(textwrap.dedent(text))
    return folder


def test_a_torch_script_launches_a_pynode_on_an_ssh_host(hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The few lines that crashed with ``FileNotFoundError: <folder>/__mp_main__.py``."""
    folder = script(
        tmp_path / "mine",
        """\
        import torch
        from tlaunch import lp_ssh as lp
        p = lp.Program("torch_hello")
        node = lp.PyNode(lambda: print("sum", torch.ones(3).sum().item(), flush=True))
        p.add_node(node.to_host("th1"), label="hello")
        lp.launch(p, launch_type="ssh")
        """,
    )
    done = run_as_user(["python", "script.py"], cwd=folder, timeout=120)
    assert done.returncode == 0, says(done)
    assert "[th1 " in done.stdout and "sum 3.0" in done.stdout, says(done)
    assert "Traceback" not in done.stderr, says(done)
    assert_nothing_left(hosts, own_runs())


TRAIN = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
rank, world = dist.get_rank(), dist.get_world_size()
print(f"rank {rank} of {world} on {os.uname().nodename}: sum {t.item()}", flush=True)
dist.destroy_process_group()
"""


def test_a_torch_script_runs_a_training_script_in_torchrun_mode(hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    folder = script(
        tmp_path / "mine",
        """\
        import torch
        from tlaunch.torch import torchrun
        result = torchrun(["train.py"], hostnames=["th1", "th2"], nproc_per_node=1, echo_ranks=[0, 1])
        print("exit codes", sorted(result.exit_codes.items()), "torch", torch.__version__)
        """,
    )
    (folder / "train.py").write_text(TRAIN)
    done = run_as_user(["python", "script.py"], cwd=folder, timeout=180)
    assert done.returncode == 0, says(done)
    assert "rank 0 of 2 on th1: sum 3.0" in done.stdout and "rank 1 of 2 on th2: sum 3.0" in done.stdout, (
        says(done)
    )
    assert "exit codes [('th1', 0), ('th2', 0)] torch" in done.stdout, says(done)
    assert_nothing_left(hosts, own_runs())


@pytest.fixture(scope="module")
def job_server(ssh_hosts, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A job server whose jobs reach the SSH test hosts: its operator passes its ssh config on
    (``--job-env TLAUNCH_SSH_CONFIG``); yields its users' environment and its home."""
    pytest.importorskip("fastapi")
    from server_helpers import ALICE, Server

    env = {**os.environ, "TLAUNCH_SSH_CONFIG": ssh_hosts.ssh_config}
    home = tmp_path_factory.mktemp("user-paths-server") / "home"
    srv = Server(home, env=env, extra=["--job-env", "TLAUNCH_SSH_CONFIG"])
    try:
        yield {"TLAUNCH_SERVER": srv.url, "TLAUNCH_TOKEN": ALICE}, str(home)
    finally:
        srv.stop()


def test_a_job_whose_trainer_imports_torch_runs_on_ssh_hosts(hosts, job_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``tlaunch job submit`` of a folder whose trainer imports torch, on two SSH hosts."""
    env, home = job_server
    folder = tmp_path / "torchjob"
    folder.mkdir()
    (folder / "trainer.py").write_text(
        "import os, torch\n"
        "x = torch.full((2,), float(os.environ['RANK']))\n"
        "print(f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} on {os.uname().nodename}: "
        '{x.sum().item()}", flush=True)\n'
    )
    argv = (
        "tlaunch job submit . --name torch-job --num-trainer 2 --hosts th1,th2 -- python trainer.py".split()
    )
    done = run_as_user(argv, cwd=folder, timeout=120, env=env)
    assert done.returncode == 0 and "submitted job torch-job" in done.stdout, says(done)
    logs = run_as_user(["tlaunch", "job", "logs", "-f", "torch-job"], cwd=folder, timeout=120, env=env)
    assert "rank 0 of 2 on th1: 0.0" in logs.stdout and "rank 1 of 2 on th2: 2.0" in logs.stdout, says(logs)
    status = run_as_user(["tlaunch", "job", "status", "torch-job"], cwd=folder, timeout=60, env=env)
    assert "job torch-job (alice): SUCCEEDED" in status.stdout, says(status)
    assert_nothing_left(hosts, own_runs(home))
