"""The user-facing flows run as users run them: a real ``python script.py`` that imports torch (the
CPU wheel) and launches over SSH, in a new process, from the script's folder; then its output is
checked, and that nothing of its runs is left on any host.

Tests run inside pytest's process, where ``__main__`` is pytest: ``import torch`` in a user's script
adds ``sys.modules["__mp_main__"]`` (an alias of ``__main__``), which once crashed every such SSH
launch before anything started and no in-process test saw it. Hosts: ``th1``.. of the session's
SSH test hosts, reached through ``$TLAUNCH_SSH_CONFIG`` as a user's ``~/.ssh/config`` would.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from userpath import EXAMPLES, assert_nothing_left, own_runs, run_as_user, says

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


def test_the_function_launch_example_on_two_hosts(hosts) -> None:  # type: ignore[no-untyped-def]
    """``python examples/torch/function_launch.py --hosts=th1,th2``, from the repository's root."""
    argv = ["python", "examples/torch/function_launch.py", "--hosts=th1,th2"]
    done = run_as_user(argv, EXAMPLES.parent, timeout=240)
    assert done.returncode == 0, says(done)
    out = done.stdout
    assert "[th1 0] rank 0 of 4 on th1: done" in out, says(done)  # rank 0's output is shown
    assert "weights [[1.0, -2.0, 3.0, 0.5]], test error 0.0" in out, says(done)
    assert_nothing_left(hosts, own_runs())
