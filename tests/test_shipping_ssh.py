"""What reaches the SSH test hosts: ignore files honoured, a shared-filesystem mode that ships
nothing, the launcher's own modules without being asked, a shared value once per host.

The test hosts see this machine's filesystem except ``/tmp`` and home directories: a folder
under ``/var/tmp`` is "on a shared filesystem", one under ``/tmp`` is not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_shipping import notebook

from tlaunch import lp_ssh as lp

pytestmark = pytest.mark.ssh

TLAUNCH = os.path.join(os.path.dirname(sys.executable), "tlaunch")

TRAIN = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
files = sorted(os.path.relpath(os.path.join(d, f)) for d, _, fs in os.walk(".") for f in fs)
run_dir = os.path.expanduser("~/.tlaunch/runs/" + os.environ["TLAUNCH_RUN_ID"])
t = torch.tensor([1.0])
dist.all_reduce(t)
print(f"rank={dist.get_rank()} sum={t.item()} cwd={os.getcwd()} script={os.path.abspath(__file__)}")
print(f"rank={dist.get_rank()} files={files} run_dir={sorted(os.listdir(run_dir))}", flush=True)
dist.destroy_process_group()
"""


@pytest.fixture
def project() -> Iterator[Path]:
    """A git work tree beside a 9 GiB data folder it ignores, where every host sees it."""
    root = Path("/var/tmp") / f"tlaunch-project-{uuid.uuid4().hex[:8]}"
    (root / "data").mkdir(parents=True)
    with open(root / "data" / "shard-0.bin", "wb") as f:
        f.truncate(9 << 30)  # sparse: 9 GiB to the walker, no disk
    (root / "model.ckpt").write_bytes(b"\0" * 1024)
    (root / "train.py").write_text(TRAIN)
    (root / "util.py").write_text("VALUE = 1\n")
    (root / ".gitignore").write_text("data/\n*.ckpt\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "train.py", "util.py", ".gitignore"], check=True)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder the launcher and every test host see, for nodes to leave their answers in."""
    path = Path("/var/tmp") / f"tlaunch-answers-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def answers(folder: Path) -> list[str]:
    return sorted(f.read_text() for f in folder.iterdir())


def torchrun(ssh_hosts, cwd: Path, log_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return subprocess.run(
        [TLAUNCH, "torchrun", "--hosts", "th1,th2", "--nproc-per-node", "1", "--ssh-config",
         ssh_hosts.ssh_config, "--log-dir", str(log_dir), "--echo-ranks", "all", *extra, "train.py"],
        cwd=cwd, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip


def test_a_torch_job_beside_its_data_ships_only_the_tracked_files(ssh_hosts, project, tmp_path) -> None:  # type: ignore[no-untyped-def]
    done = torchrun(ssh_hosts, project, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "left out: data/ (9.0 GiB, 1 file), model.ckpt (1.0 KiB) by .gitignore" in done.stderr
    assert f"working dir {project}: 3 files, " in done.stderr
    for rank in (0, 1):
        line = next(x for x in done.stdout.splitlines() if f"rank={rank} files=" in x)
        assert "files=['.gitignore', 'train.py', 'util.py']" in line, line
        assert "'work'" in line  # the shipped copy, in the run's folder on the host
        assert f"rank={rank} sum=2.0 cwd=/root/.tlaunch/runs/" in done.stdout
    (run_id,) = os.listdir(tmp_path)
    assert ssh_hosts.wait_no_leftovers(run_id, 10) == {}


def test_the_same_job_on_a_shared_filesystem_ships_nothing(ssh_hosts, project, tmp_path) -> None:  # type: ignore[no-untyped-def]
    done = torchrun(ssh_hosts, project, tmp_path, "--no-ship")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"shared filesystem (working_dir=False): nothing shipped; nodes start in {project}" in done.stderr
    assert "working dir" not in done.stderr and "modules:" not in done.stderr
    for rank in (0, 1):
        assert f"rank={rank} sum=2.0 cwd={project} script={project}/train.py" in done.stdout
        line = next(x for x in done.stdout.splitlines() if f"rank={rank} files=" in x)
        assert "data/shard-0.bin" in line  # the folder itself, not a copy
        assert "'work'" not in line and "'modules'" not in line and "'blobs'" not in line, line
    (run_id,) = os.listdir(tmp_path)
    assert ssh_hosts.wait_no_leftovers(run_id, 10) == {}


def test_basic_mode_from_python_on_a_shared_filesystem(ssh_hosts, project, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tlaunch.torch import basic

    (project / "trainer.py").write_text(
        "import os\n"
        "with open(f\"out.{os.environ['RANK']}\", 'w') as f:\n"
        "    f.write(f'{os.uname().nodename} {os.getcwd()} {os.path.abspath(__file__)}')\n"
    )
    monkeypatch.chdir(project)
    result = basic(["trainer.py"], 2, ["th1", "th2"], working_dir=False, ssh_config_file=ssh_hosts.ssh_config)
    for rank, host in enumerate(["th1", "th2"]):
        assert (project / f"out.{rank}").read_text() == f"{host} {project} {project}/trainer.py"
    assert ssh_hosts.wait_no_leftovers(result.run_id, 10) == {}


def test_a_shared_filesystem_the_hosts_lack_is_named_before_anything_starts(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "train.py").write_text(TRAIN)  # /tmp: every test host has its own
    done = torchrun(ssh_hosts, tmp_path, tmp_path / "logs", "--no-ship")
    assert done.returncode == 1
    for host in ("th1", "th2"):
        assert f"{host}: {tmp_path}, {tmp_path}/train.py are missing: working_dir=False" in done.stderr
    assert "Traceback" not in done.stderr


LAUNCHER = """
import sys
from tlaunch import lp_ssh as lp
import helper  # beside this script; never installed on the hosts

OUT = sys.argv[2]  # where every host can write


class UsesHelpers:
    def run(self):
        import lazy_helper  # not imported here: the node finds it by name all the same
        from mypkg import core

        with open(OUT, "w") as f:
            f.write(f"values {helper.VALUE} {lazy_helper.VALUE} {core.VALUE} {helper.twice(21)}")


program = lp.Program("own-modules")
program.add_node(lp.PyClassNode(UsesHelpers).to_host("th2"), label="user")
run = lp.launch(program, ssh_config=sys.argv[1])
print("shipped", run.launch_times["ship_mib"] < 1)
"""


def own_modules(folder: Path) -> None:
    (folder / "helper.py").write_text("VALUE = 1\n\ndef twice(x):\n    return 2 * x\n")
    (folder / "lazy_helper.py").write_text("VALUE = 2\n")
    (folder / "mypkg").mkdir()
    (folder / "mypkg" / "__init__.py").write_text("")
    (folder / "mypkg" / "core.py").write_text("VALUE = 3\n")


def test_a_helper_module_beside_the_script_travels_by_itself(ssh_hosts, tmp_path, shared_dir) -> None:  # type: ignore[no-untyped-def]
    own_modules(tmp_path)  # /tmp: the hosts cannot see these files
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    done = subprocess.run(
        [sys.executable, "launcher.py", ssh_hosts.ssh_config, str(shared_dir / "out")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert answers(shared_dir) == ["values 1 2 3 42"] and "shipped True" in done.stdout
    assert "tlaunch: modules: helper.py, lazy_helper.py, mypkg/ (4 files, " in done.stderr, done.stderr


COMPILED = """
import sys
from tlaunch import lp_ssh as lp


class UsesCompiled:
    def run(self):
        import fastmod  # a compiled module beside the script: it cannot travel


program = lp.Program("compiled")
program.add_node(lp.PyClassNode(UsesCompiled).to_host("th2"), label="user")
try:
    lp.launch(program, ssh_config=sys.argv[1])
except lp.RunFailedError as exc:
    print("hint:", exc.hint)
"""


def test_a_compiled_module_stays_behind_with_a_hint(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import _json  # the standard library's compiled module, copied as if it were the user's

    if not str(getattr(_json, "__file__", "")).endswith(".so"):
        pytest.skip("_json is built into this interpreter")
    suffix = os.path.basename(_json.__file__).removeprefix("_json")
    shutil.copy(_json.__file__, tmp_path / f"fastmod{suffix}")
    (tmp_path / "launcher.py").write_text(COMPILED)
    done = subprocess.run(
        [sys.executable, "launcher.py", ssh_hosts.ssh_config],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert "ModuleNotFoundError: No module named 'fastmod'" in done.stderr, done.stderr[-3000:]
    assert (
        f"hint: module 'fastmod' is a compiled module on the launcher ({tmp_path}/fastmod{suffix}), "
        "which does not travel by itself: install it on host 'th2'"
    ) in done.stdout, done.stdout


def test_a_notebooks_helper_module_and_shared_array_over_ssh(ssh_hosts, tmp_path, shared_dir) -> None:  # type: ignore[no-untyped-def]
    own_modules(tmp_path)
    cell = textwrap.dedent(
        f"""
        import logging, os
        import numpy as np
        import helper
        from tlaunch import lp_ssh as lp
        # A kernel whose logging goes elsewhere (the Jupyter server's console): what tlaunch
        # says about shipping must reach the cell all the same.
        logging.basicConfig(stream=open(os.devnull, "w"), force=True)

        class UsesHelpers:
            def __init__(self, data):
                self.data = data

            def run(self):
                import lazy_helper
                with open(os.path.join({str(shared_dir)!r}, str(os.getpid())), "w") as f:
                    f.write(f"values {{helper.VALUE}} {{lazy_helper.VALUE}} {{float(self.data.sum())}}")

        data = np.ones(20 << 20, dtype=np.uint8)
        p = lp.Program("nb")
        with p.group("user"):
            for host in ["th1", "th2", "th1", "th2"]:
                p.add_node(lp.PyClassNode(UsesHelpers, data).to_host(host))
        run = lp.launch(p, ssh_config={ssh_hosts.ssh_config!r})
        print("ship_mib", round(run.launch_times["ship_mib"]))
        """
    )
    (out,) = notebook([cell], tmp_path)
    assert answers(shared_dir) == [f"values 1 2 {float(20 << 20)}"] * 4, out
    assert "tlaunch: modules: helper.py, lazy_helper.py, mypkg/" in out, out
    assert "1 value that several nodes share (20.0 MiB) travels once per host, not once per node" in out
    assert "ship_mib 20" in out, out  # 2 nodes per host: once, not twice


class Sums:
    def __init__(self, data: np.ndarray, out: str) -> None:
        self.data = data
        self.out = out

    def run(self) -> None:
        self.data[0] = 2  # writable, as the launcher's was
        Path(self.out, str(os.getpid())).write_text(f"sum {int(self.data.sum())}")


def test_four_nodes_sharing_an_array_ship_it_once_per_host(ssh_hosts, capfd, shared_dir) -> None:  # type: ignore[no-untyped-def]
    data = np.ones(32 << 20, dtype=np.uint8)
    program = lp.Program("shared")
    with program.group("sums"):
        for host in ["th1", "th2", "th1", "th2"]:
            program.add_node(lp.PyClassNode(Sums, data, str(shared_dir)).to_host(host))
    run = lp.launch(program, ssh_config=ssh_hosts.ssh_config)
    assert 32 <= run.launch_times["ship_mib"] < 33  # was 64: every node carried its own copy
    _, err = capfd.readouterr()
    assert answers(shared_dir) == [f"sum {(32 << 20) + 1}"] * 4
    assert "1 value that several nodes share (32.0 MiB) travels once per host" in err
    assert ssh_hosts.leftovers(run.run_id) == {}  # the shared values went with the run
